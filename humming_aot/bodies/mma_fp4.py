"""The block-scaled FP4 body (kernel/dense_mma_fp4.cuh): W4A4 with e2m1 activation and weight
codes two to a byte, each operand with its own block scales, NVFP4 (ue4m3 per 16 of K) or MXFP4
(ue8m0 per 32), on mma.sync m16n8k64 .kind::mxf4nvf4 .block_scale, which applies them (SM120a
and SM121a: OMMA.SF). The staging is the mma-ss body's in bytes (cp.async, K tiles of 128 code
bytes = 256 codes, ldmatrix) plus each row's scale bytes of the K tile. Its Params are
ScaledTmaGemmParams with no tensor map (humming_aot.fp4).

Below SM120 the instruction does not exist; the kernel then emulates it with warp shuffles
(mma/mma_sync_fp4.cuh), which the GPU tests run on an H200 to check the body around it.
support.toml serves the body on sm120a and sm121a only; its check_key takes sm80 and later so
that a test can build that emulated kernel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body
from humming_aot.bodies.mma_ss import _REGISTER_LIMIT, _SPARE_REGISTERS, check_staged_tile

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig

ELEMENT = "float4e2m1"
OUT_DTYPES = ("bfloat16", "float16")
# scale dtype -> (codes per scale, scale bytes of a row per K tile of 256 codes)
SCALES = {"float8e4m3": (16, 16), "float8e8m0": (32, 8)}
# the first arch whose mma.sync has the block-scaled e2m1 instruction (and needs its 'a' or 'f'
# target); the emulated kernels of the tests build from sm80 (cp.async)
NATIVE_ARCH = 120
FIRST_ARCH = 80


def accumulators(tile: "TileConfig") -> int:
    """fp32 registers a thread holds for its sums: 4 per m16n8 fragment of its warp's tile, twice
    (each K tile's sums apart from the accumulators they go into)."""
    fragments = (tile.block_m // tile.warps_m // 16) * (tile.block_n // tile.warps_n // 8)
    return 8 * fragments


def scale_bytes(key: "KernelKey") -> int:
    """Scale bytes of a row per K tile (16 NVFP4, 8 MXFP4)."""
    return SCALES[key.spec.w_scale_dtype][1]


def native(arch: str) -> bool:
    """Whether an arch's kernel runs the instruction (else the emulation): sm120a, sm121a and the
    family targets of 12x; plain sm120 has no block-scaled mma (ptxas refuses it)."""
    from humming_aot.spec import parse_arch

    number, suffix = parse_arch(arch)
    return number >= NATIVE_ARCH and suffix in ("a", "f")


class MmaFp4Body(Body):
    kind = "mma-fp4"
    header = "dense_mma_fp4.cuh"
    template = "DenseMmaFp4"
    params_type = "ScaledTmaGemmParams"
    fixed_block_k = True  # 128 code bytes a stage

    def check_tile(self, tile: "TileConfig") -> None:
        # (mma-ss's staging in bytes)
        check_staged_tile(tile, self.kind, self.threads(tile), "128 code bytes (256 e2m1 codes)")
        if accumulators(tile) + _SPARE_REGISTERS > _REGISTER_LIMIT:
            raise ValueError(f"tile {tile.label}: {accumulators(tile)} fp32 sums and accumulators per thread; at most "
                             f"{_REGISTER_LIMIT - _SPARE_REGISTERS} (more warps, or a smaller tile)")

    def check_key(self, key: "KernelKey") -> None:
        from humming_aot.spec import parse_arch

        s = key.spec
        if (s.a_dtype != ELEMENT or s.w_dtype != ELEMENT or s.a_scale.value != "g" or s.w_scale.value != "g"
                or s.a_scale_dtype not in SCALES or s.w_scale_dtype != s.a_scale_dtype
                or s.w_zero_point.value != "none" or s.out_dtype not in OUT_DTYPES or s.gemm_type.value != "dense"):
            raise ValueError(
                f"{key.name}: the mma-fp4 body computes dense float4e2m1 x float4e2m1 with block scales of one dtype "
                "on both sides: float8e4m3 per 16 of K (NVFP4: a-e2m1-g-e4m3 w-e2m1-g-e4m3) or float8e8m0 per 32 "
                "(MXFP4: a-e2m1-g-ue8m0 w-e2m1-g-ue8m0), no zero point, into bfloat16 or float16"
            )
        if parse_arch(key.arch)[0] < FIRST_ARCH:
            raise ValueError(f"{key.name}: the mma-fp4 body needs cp.async (sm80 or later), not {key.arch}")
        number, suffix = parse_arch(key.arch)
        if number >= NATIVE_ARCH and not native(key.arch):
            raise ValueError(f"{key.name}: the block-scaled FP4 mma needs the arch-specific target ({key.arch}a): "
                             f"plain {key.arch} has none")

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.warps_m, tile.warps_n, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        """With NVFP4's 16 scale bytes a row (the larger; key_smem_bytes gives a key's own)."""
        return tile.stages * (tile.block_m + tile.block_n) * (128 + 16)

    def key_smem_bytes(self, key: "KernelKey") -> int:
        return key.tile.stages * (key.tile.block_m + key.tile.block_n) * (128 + scale_bytes(key))

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        return True


MMA_FP4 = MmaFp4Body()
