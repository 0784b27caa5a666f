"""The naive reference body (kernel/dense_simt.cuh, tile kind ``simt``, any arch): one warp per CTA,
fp32 FMAs on the CUDA cores over weights decoded by the same numerics as the tensor-core bodies,
everything else read straight from global memory. Test-only: no catalog row or tile-table row
uses it; ``ops.gemm_with_tile(a, packed, "simt:8x64x16_w1x1_s1")`` reaches it through the JIT, and
the GPU suite compares the production kernels with it. The worked example of
docs/adding-a-body.md."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body

if TYPE_CHECKING:
    from humming_aot.spec import TileConfig


class SimtBody(Body):
    kind = "simt"
    header = "dense_simt.cuh"
    template = "DenseSimt"
    splits_k = False  # one CTA sums all of K: no workspace, no counters

    def check_tile(self, tile: "TileConfig") -> None:
        if not 1 <= tile.block_m <= 16:
            raise ValueError(f"block_m={tile.block_m}: the simt body holds 1 to 16 tokens per warp")
        if (tile.block_n, tile.block_k, tile.warps_m, tile.warps_n, tile.warps_k, tile.stages) != (64, 16, 1, 1, 1, 1):
            raise ValueError(
                f"tile {tile.field}: the simt body is one warp over 64 channels, 16 rows of K at a time, with no "
                "pipeline: <M>x64x16_w1x1_s1"
            )

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m,)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return 0


SIMT = SimtBody()
