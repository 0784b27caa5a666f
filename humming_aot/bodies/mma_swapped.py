"""The swapped-operand per-warp pipeline of the mma.sync body (mainloop/swapped_warp_pipeline.cuh)
for 16 or 32 tokens, tile kind ``mma-sw``: the weights are the mma A operand and each 8 tokens an n8 B
operand, so each dequantized 16 x 16 weight tile feeds two (four) mma, and each warp copies its own run
of K into its own region of a stage (no CTA barrier per stage). The 8-token tile is the same
pipeline under the plain ``mma`` kind (block_m = 8); a 16-row ``mma`` tile is the CTA-shared
pipeline. Same kernel template (kernel/dense_mma_sync.cuh, kSwapped = 1), same Params."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.mma_sync import MmaSyncBody

if TYPE_CHECKING:
    from humming_aot.spec import TileConfig


class MmaSwappedBody(MmaSyncBody):
    kind = "mma-sw"

    @staticmethod
    def swapped(tile: "TileConfig") -> bool:
        return True

    def check_tile(self, tile: "TileConfig") -> None:
        if tile.block_m not in (16, 32) or tile.warps_m != 1:
            raise ValueError(
                f"tile {tile.field}: the mma-sw body holds 16 or 32 tokens in one warp along M "
                "(16x<N>x<K>_w1x<warps_n>x<warps_k>_s<stages>, or 32x...); 8 tokens are the plain mma body's 8-row tile"
            )
        super().check_tile(tile)

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (*super().template_args(tile), 1)  # kSwapped


MMA_SWAPPED = MmaSwappedBody()
