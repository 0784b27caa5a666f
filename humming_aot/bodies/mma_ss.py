"""The portable W8A8 body on mma.sync (kernel/dense_mma_ss.cuh): 8-bit activation and weight codes
of one element, both K-major in shared memory (cp.async, K tiles of 128 codes), read by ldmatrix
into mma.sync m16n8k32; fp32 token x channel scales on the fp32 sums, or (float8) DeepSeek-V3's
1 x 128 token group x 128 x 128 weight block scales at each K tile's promotion. s8 on SM80 and later, e4m3
on SM89 and later (the mma.sync fp8 instructions); sm90a runs the same operands on wgmma-ss. Its
Params are ScaledTmaGemmParams with no tensor map (humming_aot._w8a8_launch). W4A4: int4 codes
two to a byte on the same staging (a K tile of 128 bytes holds 256 codes) into m16n8k64, native on
SM80-SM89 (emulated by ptxas on later arches)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig

# (8-bit element, its first arch number): s8 x s8 mma.sync m16n8k32 is SM80's, e4m3 x e4m3 SM89's
FIRST_ARCH = {"int8": 80, "float8e4m3": 89}
# the elements of the mma-ss body's codes: the 8-bit ones and int4 (s4 x s4 m16n8k64, SM80's)
CODE_FIRST_ARCH = {**FIRST_ARCH, "int4": 80}
OUT_DTYPES = ("bfloat16", "float16")
# per token x per channel, fp32 scales, one element both sides (the wgmma-ss body's channel scaling)
_OPERANDS = tuple(((e, "k", "float32"), (e, "g", "float32")) for e in CODE_FIRST_ARCH)
# DeepSeek-V3's: float8 per 1 x 128 token group x per 128 x 128 weight block
_BLOCKS = (("float8e4m3", "g", "float32"), ("float8e4m3", "b", "float32"))
# Registers a thread has beside its accumulators (fragments, addresses, the loop): ptxas caps a
# thread at 255, and a tile that needs more would spill in its K loop.
_REGISTER_LIMIT = 255
_SPARE_REGISTERS = 64


def accumulators(tile: "TileConfig", element: str) -> int:
    """fp32 (or int32) registers a thread holds for its sums: 4 per m16n8 fragment of its warp's
    tile, twice that for e4m3 (each K tile's sums apart from the fp32 accumulators they go into)."""
    fragments = (tile.block_m // tile.warps_m // 16) * (tile.block_n // tile.warps_n // 8)
    return 4 * fragments * (2 if element == "float8e4m3" else 1)


def check_staged_tile(tile: "TileConfig", kind: str, threads: int, k_tile: str) -> None:
    """The tile rules of the staging this body shares with mma-fp4: K tiles of 128 code bytes (one
    128-byte row per operand row) by cp.async, warps splitting the output tile in m16 x n16 units,
    1-16 warps, a ring of at least two K tiles, at most 64 copy passes a thread. `k_tile` says
    what a K tile holds, for the message."""
    if tile.block_k != 128:
        raise ValueError(f"block_k={tile.block_k}: the {kind} body stages {k_tile}")
    if tile.warps_k != 1:
        raise ValueError(f"warps_k={tile.warps_k}: the {kind} body's warps split the output tile, not K")
    if tile.block_m % (16 * tile.warps_m) or tile.block_m > 256:
        raise ValueError(f"block_m={tile.block_m} must be a multiple of 16 * warps_m={tile.warps_m}, at most 256")
    if tile.block_n % (16 * tile.warps_n) or tile.block_n > 256:
        raise ValueError(f"block_n={tile.block_n} must be a multiple of 16 * warps_n={tile.warps_n} (pairs of n8 "
                         "fragments per warp), at most 256")
    if not 1 <= tile.warps_m * tile.warps_n <= 16:
        raise ValueError(f"warps {tile.warps_m}x{tile.warps_n}: the {kind} body runs 1 to 16 warps")
    if tile.stages < 2:
        raise ValueError(f"stages={tile.stages}: the {kind} ring needs at least 2 K tiles")
    # the copies: each thread keeps one 16-byte column chunk, one validity bit per pass
    if (tile.block_m + tile.block_n) * 8 // threads > 64:
        raise ValueError(f"tile {tile.label}: too many copy passes per thread; use more warps")


class MmaSsBody(Body):
    kind = "mma-ss"
    header = "dense_mma_ss.cuh"
    template = "DenseMmaSs"
    params_type = "ScaledTmaGemmParams"
    fixed_block_k = True  # 128 codes a stage: one 128-byte row per operand row

    def check_tile(self, tile: "TileConfig") -> None:
        check_staged_tile(tile, self.kind, self.threads(tile), "128 K (one 128-byte row of 8-bit codes)")
        if accumulators(tile, "int8") + _SPARE_REGISTERS > _REGISTER_LIMIT:
            raise ValueError(f"tile {tile.label}: {accumulators(tile, 'int8')} accumulators per thread; at most "
                             f"{_REGISTER_LIMIT - _SPARE_REGISTERS} (more warps, or a smaller tile)")

    def check_key(self, key: "KernelKey") -> None:
        from humming_aot.spec import parse_arch

        s = key.spec
        operands = ((s.a_dtype, s.a_scale.value, s.a_scale_dtype), (s.w_dtype, s.w_scale.value, s.w_scale_dtype))
        if (operands not in _OPERANDS and operands != _BLOCKS) or s.w_zero_point.value != "none" \
                or s.out_dtype not in OUT_DTYPES or s.gemm_type.value not in ("dense", "masked", "grouped"):
            raise ValueError(
                f"{key.name}: the mma-ss body computes dense (or grouped: MoE) float8e4m3 x float8e4m3, "
                "int8 x int8 or int4 x int4 with "
                "float32 scales per token and per channel (a-e4m3-k-f32 w-e4m3-g-f32, a-s8-k-f32 w-s8-g-f32, "
                "a-s4-k-f32 w-s4-g-f32), or float8 "
                "per 1 x 128 token group and per 128 x 128 weight block (a-e4m3-g-f32 w-e4m3-b-f32), no zero point, "
                "into bfloat16 or float16"
            )
        if operands == _BLOCKS and 128 % (key.tile.block_n // key.tile.warps_n):
            raise ValueError(f"{key.name}: with block scales a warp's {key.tile.block_n // key.tile.warps_n} channels "
                             "must lie inside one 128-channel block (16, 32, 64 or 128 per warp)")
        first = CODE_FIRST_ARCH[s.a_dtype]
        number = parse_arch(key.arch)[0]
        if number < first:
            raise ValueError(f"{key.name}: mma.sync on {s.a_dtype} codes needs sm{first} or later, not {key.arch}")
        if s.a_dtype == "float8e4m3" and s.gemm_type.value != "dense" and number not in (89, 120, 121):
            raise ValueError(f"{key.name}: ptxas emulates e4m3 mma.sync on {key.arch}, and beside the MoE schedule's "
                             "walk its registers spill: float8 W8A8 MoE runs mma-ss tiles on sm89 and sm120 only (on "
                             "sm90a the masked type of channel-scaled experts runs wgmma-ss tiles)")
        need = accumulators(key.tile, s.a_dtype) + _SPARE_REGISTERS
        if need > _REGISTER_LIMIT:
            raise ValueError(f"{key.name}: {accumulators(key.tile, s.a_dtype)} {s.a_dtype} accumulators per thread "
                             f"(e4m3: its K tile's sums too); at most {_REGISTER_LIMIT - _SPARE_REGISTERS}")

    @staticmethod
    def block_scales(key: "KernelKey") -> bool:
        """Whether the key scales per 128 x 128 weight block and 1 x 128 token group."""
        return key.spec.w_scale.value == "b"

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.warps_m, tile.warps_n, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return tile.stages * (tile.block_m + tile.block_n) * 128

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        return True


MMA_SS = MmaSsBody()
