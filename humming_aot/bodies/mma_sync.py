"""The portable body on warp-level mma.sync (kernel/dense_mma_sync.cuh), every arch: a CTA-shared
cp.async pipeline (mainloop/cta_pipeline.cuh), or for block_m = 8 (and under mma-sw, 16) the swapped-operand per-warp
pipeline (mainloop/swapped_warp_pipeline.cuh) whose weights are the mma A operand."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body, check_block_k, stage_bytes

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig


class MmaSyncBody(Body):
    kind = "mma"
    header = "dense_mma_sync.cuh"
    template = "DenseMmaSync"

    @staticmethod
    def swapped(tile: "TileConfig") -> bool:
        """Whether the tile runs the swapped-operand per-warp pipeline (mainloop/swapped_warp_pipeline.cuh:
        weights as the mma A operand, one pipeline per warp) rather than the CTA-shared one. Under the
        mma kind the kernel name spells it as block_m = 8, the only block_m below 16
        (kernel/dense_mma_sync.cuh's kSwapped defaults to kBlockM == 8); the mma-sw kind
        (bodies/mma_swapped.py) is the same pipeline at 16 or 32 tokens."""
        return tile.block_m == 8

    def check_tile(self, tile: "TileConfig") -> None:
        check_block_k(tile, (64, 128, 256, 512))
        if tile.block_m % (16 * tile.warps_m) and not (self.swapped(tile) and tile.warps_m == 1):
            raise ValueError(
                f"block_m={tile.block_m} is not a multiple of 16 * warps_m={tile.warps_m} (or 8 with one warp "
                "along M: the swapped-operand tile for M <= 8)"
            )
        if tile.block_n != 64 * tile.warps_n:
            raise ValueError(f"block_n={tile.block_n} must be 64 * warps_n ({64 * tile.warps_n})")
        if tile.warps_k not in (1, 2, 4):
            raise ValueError(f"warps_k={tile.warps_k}: the K steps of a stage split over 1, 2 or 4 warps")
        if tile.stages < 2:
            raise ValueError(f"stages={tile.stages}: a pipeline needs at least 2 stages")

    # the stage loader keeps one validity bit per copy pass in a 32-bit mask (memory/stage_loader.cuh)
    MAX_COPY_PASSES = 32

    def check_key(self, key: "KernelKey") -> None:
        # The passes of 16-byte copies each issuer makes per stage: the CTA's threads copy a whole
        # stage; a swapped tile's warp copies its own run of K for its 64 columns (32 issuers).
        tile, bits = key.tile, key.spec.w_bits
        swapped = self.swapped(tile)
        issuers = 32 if swapped else self.threads(tile)
        run_k = tile.block_k // tile.warps_k if swapped else tile.block_k
        columns = 64 if swapped else tile.block_n
        weight_passes = -(-(run_k // 16) * (columns // 64) * 8 * bits // issuers)
        activation_passes = -(-tile.block_m * (run_k // 8) // issuers)
        if max(weight_passes, activation_passes) > self.MAX_COPY_PASSES:
            raise ValueError(
                f"tile {tile.label} with {bits}-bit codes: each of its {issuers} copy issuers would make "
                f"{max(weight_passes, activation_passes)} passes per stage (weights {weight_passes}, activations "
                f"{activation_passes}), over the loader's {self.MAX_COPY_PASSES}; stage less K per "
                f"{'warp (more K warps or a narrower block_k)' if swapped else 'CTA (a narrower block_k)'}"
            )

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.block_k, tile.warps_m, tile.warps_n, tile.warps_k, tile.stages)

    def pipeline_per_warp(self, tile: "TileConfig") -> bool:
        return self.swapped(tile)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        swapped = self.swapped(tile)
        groups = tile.block_m // 8 if swapped else 0  # the swapped tile's groups of 8 tokens (n8 fragments)
        if swapped:
            # one region per warp: its run of block_k / warps_k and its 64 columns (memory/stage_loader.cuh)
            run_k, columns, copies = tile.block_k // tile.warps_k, 64, tile.warps_m * tile.warps_n * tile.warps_k
        else:
            run_k, columns, copies = tile.block_k, tile.block_n, 1
        pipeline = tile.stages * copies * stage_bytes(tile, w_bits, has_zero_point, run_k, columns)
        # warps_k > 1: after the K loop every K warp parks its fp32 accumulators (block_m / warps_m /
        # 16 m16 fragments x 8 n8 fragments x 4 floats, x 32 lanes; the swapped tile: 4 m16n8
        # fragments x 4 floats per 8 tokens) in the same shared memory, then adds up and writes its share
        parked_warps = 0 if tile.warps_k == 1 else tile.warps_k
        floats_per_lane = 16 * groups if swapped else (tile.block_m // tile.warps_m // 16) * 32
        reduction = parked_warps * tile.warps_m * tile.warps_n * floats_per_lane * 32 * 4
        # the swapped tile's split-K exchange region after the pipeline (epilogue/swapped_output_writer.cuh,
        # exchange_bytes): a 128-byte copy of the kernel parameters per warp, 64 bytes of mbarriers,
        # then (warps + 7) x the fragments each warp writes (4 / warps_k per 8 tokens) x 512 bytes
        warps = self.threads(tile) // 32
        exchange = warps * 128 + 64 + (warps + 7) * (4 // tile.warps_k) * groups * 512 if swapped else 0
        return max(pipeline, reduction) + exchange

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        # the swapped tiles (8 tokens; 16 under mma-sw), integer codes without a float zero point (kScalesInFp32 of
        # mainloop/swapped_warp_pipeline.cuh; the generated source checks that both sides agree)
        from humming_aot.spec import ZeroPoint

        return self.swapped(key.tile) and not key.spec.w_is_float and key.spec.w_zero_point is not ZeroPoint.FLOAT

    def reduces_splits_in_cluster(self, key: "KernelKey") -> bool:
        # the swapped tiles compiled for sm_90 or later (epilogue/cluster_exchange.cuh)
        from humming_aot.spec import parse_arch

        return self.swapped(key.tile) and parse_arch(key.arch)[0] >= 90


MMA_SYNC = MmaSyncBody()
