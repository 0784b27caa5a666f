"""The portable W4A8 body on mma.sync (kernel/dense_mma_w4a8.cuh): int4 weight codes, or uint4
ones less an integer zero point, in W4A8's packed layout (the 8-bit m16n8k32 A fragments) widened
in registers to s8 (int8 activations, SM80+) or e4m3 (float8 activations, SM89+), or MXFP4 codes
to e4m3 (float8 activations), the
weights as the mma's A and the tokens as its B; fp32 group scales on each K tile's sums, token
scales at the end. Its Params are ScaledTmaGemmParams with no tensor map (humming_aot._w8a8_launch)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body
from humming_aot.bodies.mma_ss import FIRST_ARCH, OUT_DTYPES
from humming_aot.bodies.wgmma_w4a8 import entry_bytes

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig

UNIT_BYTES = 4096  # a 64-channel unit's packed codes of one K tile (w4a8's layout)
# (weight dtype, scale dtype, zero point) of the weights it takes
_WEIGHTS = (("int4", "float32", "none"), ("uint4", "float32", "zpi"), ("float4e2m1", "float8e8m0", "none"))
# A warp's sums and accumulators: at most those of 32 tokens x 32 channels (8 m16n8 fragments, 64
# registers); with the packed words, the widened A registers and the token fragments beside them
# ptxas 13.0 holds that in 91-158 registers, and spilled every wider warp tile at 255 (32 x 64,
# 64 x 32: 60-160 bytes).
_MAX_ACCUMULATOR_REGISTERS = 64


def accumulators(tile: "TileConfig") -> int:
    """Registers of a thread's sums: each K tile's int32 (or fp32) sums and the fp32 accumulators
    they are weighed into, 4 each per m16n8 fragment of its warp's tile."""
    fragments = (tile.block_n // tile.warps_n // 16) * (tile.block_m // tile.warps_m // 8)
    return 8 * fragments


class MmaW4a8Body(Body):
    kind = "mma-w4a8"
    header = "dense_mma_w4a8.cuh"
    template = "DenseMmaW4a8"
    params_type = "ScaledTmaGemmParams"
    fixed_block_k = True  # 128 of K a stage: one packed K tile, one group-scale row

    def check_tile(self, tile: "TileConfig") -> None:
        if tile.block_k != 128:
            raise ValueError(f"block_k={tile.block_k}: the mma-w4a8 body stages 128 K (one packed K tile)")
        if tile.warps_k != 1:
            raise ValueError(f"warps_k={tile.warps_k}: the mma-w4a8 body's warps split the output tile, not K")
        if tile.block_n % 64 or tile.block_n > 256 or (tile.block_n // tile.warps_n) % 16 or tile.block_n % tile.warps_n:
            raise ValueError(f"block_n={tile.block_n} must be whole 64-channel units (at most 256), 16 x m16 fragments "
                             f"per warp over warps_n={tile.warps_n}")
        if tile.block_m % (16 * tile.warps_m) or tile.block_m > 256:
            raise ValueError(f"block_m={tile.block_m} must be a multiple of 16 * warps_m={tile.warps_m} (pairs of n8 "
                             "token fragments per warp), at most 256")
        if not 1 <= tile.warps_m * tile.warps_n <= 16:
            raise ValueError(f"warps {tile.warps_m}x{tile.warps_n}: the mma-w4a8 body runs 1 to 16 warps")
        if tile.stages < 2:
            raise ValueError(f"stages={tile.stages}: the mma-w4a8 ring needs at least 2 K tiles")
        if tile.block_m * 8 // self.threads(tile) > 64:
            raise ValueError(f"tile {tile.label}: too many activation copy passes per thread; use more warps")
        if accumulators(tile) > _MAX_ACCUMULATOR_REGISTERS:
            raise ValueError(f"tile {tile.label}: {accumulators(tile)} registers of sums and accumulators per thread; "
                             f"at most {_MAX_ACCUMULATOR_REGISTERS} (warp tiles of at most 32 tokens x 32 channels: "
                             "more warps, or a smaller tile)")

    def check_key(self, key: "KernelKey") -> None:
        from humming_aot.spec import parse_arch

        s = key.spec
        weights = (s.w_dtype, s.w_scale_dtype, s.w_zero_point.value)
        if s.a_dtype not in FIRST_ARCH or s.a_scale.value != "k" or s.a_scale_dtype != "float32" \
                or weights not in _WEIGHTS or s.w_scale.value != "g" \
                or (s.w_dtype == "float4e2m1" and s.a_dtype != "float8e4m3") \
                or s.out_dtype not in OUT_DTYPES or s.gemm_type.value not in ("dense", "masked", "grouped"):
            raise ValueError(
                f"{key.name}: the mma-w4a8 body computes dense symmetric int4 weights (float32 group scales) or uint4 "
                "ones with an integer zero point x int8 or float8e4m3 activations (float32 token scales: a-s8-k-f32 "
                "or a-e4m3-k-f32, w-s4-g-f32 or w-u4-g-f32-zpi), or MXFP4 weights (w-e2m1-g-ue8m0) x float8e4m3 "
                "activations, into bfloat16 or float16, dense or grouped masked or contiguous (MoE)"
            )
        first = FIRST_ARCH[s.a_dtype]
        if parse_arch(key.arch)[0] < first:
            raise ValueError(f"{key.name}: mma.sync on {s.a_dtype} codes needs sm{first} or later, not {key.arch}")

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.warps_m, tile.warps_n, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return self._smem(tile, 4)

    def key_smem_bytes(self, key: "KernelKey") -> int:
        return self._smem(key.tile, entry_bytes(key.spec.w_dtype))

    @staticmethod
    def _smem(tile: "TileConfig", entry: int) -> int:
        """The ring: per K tile the activation codes, the units' packed codes and the channels'
        scale entries (4 bytes; MXFP4 and uint4: 8)."""
        return tile.stages * (tile.block_m * 128 + tile.block_n // 64 * UNIT_BYTES + tile.block_n * entry)

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        return True


MMA_W4A8 = MmaW4a8Body()
