"""The earlier Hopper body (kernel/dense_wgmma.cuh, sm90a): every thread copies stages with
cp.async, warpgroups dequantize into wgmma's register operand; block_m tokens are the wgmma N."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body, check_block_k, stage_bytes

if TYPE_CHECKING:
    from humming_aot.spec import TileConfig


def wgmma_smem_bytes(tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
    """Stages on 1024-byte boundaries (128-byte swizzle); the epilogue stages the output tile (rows
    padded by 16 bytes) in the same memory; +1024 to align the base at run time. Both wgmma bodies."""
    stage = stage_bytes(tile, w_bits, has_zero_point, tile.block_k, tile.block_n)
    pipeline = tile.stages * (-(-stage // 1024) * 1024)
    staging = tile.block_m * (tile.block_n + 8) * 2
    return max(pipeline, staging) + 1024


class WgmmaBody(Body):
    kind = "wgmma"
    header = "dense_wgmma.cuh"
    template = "DenseWgmma"
    only_arch = "sm90a"

    def check_tile(self, tile: "TileConfig") -> None:
        check_block_k(tile, (64,))
        if tile.block_m not in (64, 128, 256):
            raise ValueError(f"block_m={tile.block_m}: the wgmma body takes 64, 128 or 256 tokens per CTA")
        if tile.warps_m != 1 or tile.warps_k != 1 or tile.warps_n not in (4, 8, 12, 16):
            raise ValueError(
                f"warps {tile.warps_m}x{tile.warps_n}x{tile.warps_k}: the wgmma body runs 1 x (4 per warpgroup) "
                "warps, one to four warpgroups"
            )
        if tile.block_n != 16 * tile.warps_n:
            raise ValueError(f"block_n={tile.block_n} must be 64 per warpgroup ({16 * tile.warps_n})")
        if tile.stages < 3:
            raise ValueError(f"stages={tile.stages}: the wgmma pipeline needs at least 3 stages")

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return wgmma_smem_bytes(tile, w_bits, has_zero_point)


WGMMA = WgmmaBody()
