"""The warp-specialized Hopper body (kernel/dense_wgmma_ws.cuh, sm90a): a producer warpgroup feeds
an mbarrier ring with TMA and bulk copies, one or two consumer warpgroups of 64, 128 or 256
weight channels dequantize into wgmma's register operand; its Params carry the activations' tensor map
and the tail-split / stream-K schedule (TmaGemmParams)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body, check_block_k, stage_bytes
from humming_aot.bodies.wgmma import wgmma_smem_bytes

if TYPE_CHECKING:
    from humming_aot.spec import TileConfig


# The register budget of kernel/dense_wgmma_ws.cuh (and grouped_masked_ws.cuh, whose producer
# keeps more): with one consumer warpgroup two CTAs share an SM (the masked schedule's 8-row tile
# three where they fit: masked_ctas_per_sm, whose 16 accumulators the 104 registers then left hold
# well under this module's limits), with two one CTA does; setmaxnreg
# moves the producer warpgroup's registers to the consumers, which need their accumulators and 48
# more (the static_asserts there).
_WALK_PRODUCER_REGISTERS = 56  # the masked schedule's, which walks the experts (the dense body's keeps 40)
_SPARE_REGISTERS = 48
# four units per warpgroup hold twice the weight fragments (16 more registers) and more scale
# values: 80 tokens x 4 units (160 accumulators) spilled with 8-bit codes and float zero points
_FOUR_UNIT_SPARE_REGISTERS = 24


def _consumer_registers(consumer_warpgroups: int, ctas_per_sm: int, producer_registers: int) -> int:
    """What setmaxnreg leaves each consumer thread of a CTA (its launch registers, from the CTAs
    per SM, less the producer warpgroup's), as the kernels compute it."""
    threads = 128 * consumer_warpgroups + 128
    launch = 65536 // ctas_per_sm // threads // 8 * 8
    return (launch * threads - producer_registers * 128) // (128 * consumer_warpgroups) // 8 * 8


def _spare_registers(units_per_warpgroup: int) -> int:
    return _SPARE_REGISTERS + (_FOUR_UNIT_SPARE_REGISTERS if units_per_warpgroup == 4 else 0)


def max_accumulators(consumer_warpgroups: int, units_per_warpgroup: int = 1) -> int:
    """The most fp32 accumulators per consumer thread the body's register split holds for one or
    two consumer warpgroups (152 or 176; 128 or 152 with four 64-channel units per warpgroup)."""
    consumer = _consumer_registers(consumer_warpgroups, 2 if consumer_warpgroups == 1 else 1, _WALK_PRODUCER_REGISTERS)
    return min(consumer, 256) - _spare_registers(units_per_warpgroup)


class WgmmaWsBody(Body):
    kind = "wgmma-ws"
    header = "dense_wgmma_ws.cuh"
    template = "DenseWgmmaWs"
    params_type = "TmaGemmParams"
    only_arch = "sm90a"

    def check_tile(self, tile: "TileConfig") -> None:
        check_block_k(tile, (64,))
        if not ((tile.block_m % 8 == 0 and 8 <= tile.block_m <= 120)
                or (tile.block_m % 16 == 0 and 16 <= tile.block_m <= 256)):
            raise ValueError(f"block_m={tile.block_m}: the wgmma-ws body takes a multiple of 8 tokens per CTA up to "
                             "120, or of 16 up to 256 (the wgmma N)")
        if tile.warps_m != 1 or tile.warps_k != 1 or tile.warps_n not in (4, 8):
            raise ValueError(
                f"warps {tile.warps_m}x{tile.warps_n}x{tile.warps_k}: the wgmma-ws body runs 1 x 4 or 1 x 8 consumer "
                "warps (one or two consumer warpgroups; the producer warpgroup is not counted)"
            )
        if tile.block_n not in (16 * tile.warps_n, 32 * tile.warps_n, 64 * tile.warps_n):
            raise ValueError(
                f"block_n={tile.block_n} must be 64, 128 or 256 channels per consumer warpgroup "
                f"({16 * tile.warps_n}, {32 * tile.warps_n} or {64 * tile.warps_n})"
            )
        if tile.stages < 2:
            raise ValueError(f"stages={tile.stages}: the wgmma-ws ring needs at least 2 slots")
        accumulators = tile.block_m // 2 * tile.units_per_warpgroup
        limit = max_accumulators(tile.warps_n // 4, tile.units_per_warpgroup)
        if accumulators > limit:
            raise ValueError(
                f"tile {tile.field}: {accumulators} fp32 accumulators per thread; with {tile.warps_n // 4} consumer "
                f"warpgroup(s) the wgmma-ws body holds at most {limit} (block_m x channels per warpgroup <= "
                f"{2 * limit} x 64, {limit} x 128 or {limit // 2} x 256)"
            )

    def threads(self, tile: "TileConfig") -> int:
        return super().threads(tile) + 128  # + the producer warpgroup

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.units_per_warpgroup, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return wgmma_smem_bytes(tile, w_bits, has_zero_point)


# The masked schedule's table of the experts' first tiles in shared memory, after the staging tile
# (schedule/expert_table.cuh ExpertTable::kTableBytes: 256 bucket starts, the total, 256 rows and
# three header words).
MOE_WALK_TABLE_BYTES = (2 * 256 + 1 + 3) * 4


def masked_smem_bytes(tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
    """The grouped masked schedule's on this body (kernel/grouped_masked_ws.cuh kSmemBytes): the
    ring, then a staging tile of its own (the dense body stages in the ring: wgmma_smem_bytes), so
    that the next tile's stages fill while this one is stored; +1024 to align the base; then the
    walk's table of the experts' tiles (MOE_WALK_TABLE_BYTES)."""
    stage = stage_bytes(tile, w_bits, has_zero_point, tile.block_k, tile.block_n)
    return (tile.stages * (-(-stage // 1024) * 1024) + tile.block_m * (tile.block_n + 8) * 2 + 1024
            + MOE_WALK_TABLE_BYTES)


# An SM's shared memory on sm_90 (228 KB; 1 KB of it reserved per resident CTA) and what a CTA of
# the body takes beside its dynamic part (its static shared memory, reported as 1 KB, and that
# reservation; heuristics.fit_ctas_per_sm counts it too)
SMEM_PER_SM = 233472
CTA_SMEM_OVERHEAD = 2048


def masked_ctas_per_sm(tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
    """The CTAs per SM the masked schedule's kernel on this tile is built for (kMinBlocksPerSm of
    kernel/grouped_masked_ws.cuh, which its registers at launch follow): three for one consumer
    warpgroup of 8 tokens whose shared memory fits three, else two for one consumer warpgroup; for
    two, two where two fit and their consumers' registers then hold the accumulators, the
    dequantization's spare and the wgmma's slack (8 x 512, 16 / 32 x 256), else one."""
    def fit(ctas: int) -> bool:  # whether `ctas` of its CTAs fit an SM's shared memory
        return ctas * (masked_smem_bytes(tile, w_bits, has_zero_point) + CTA_SMEM_OVERHEAD) <= SMEM_PER_SM

    if tile.warps_n == 8:  # two where their consumers keep the wgmma's slack in two CTAs' registers
        return 2 if fit(2) and _consumer_registers(2, 2, _LEAST_PRODUCER_REGISTERS) >= _unserialized_need(tile) else 1
    return 3 if tile.block_m == 8 and fit(3) else 2


# The producer warpgroup's registers (kernel/dense_wgmma_ws.cuh producer_registers): the dense
# body's 40 or the masked schedule's 56 (it walks the experts), or setmaxnreg's least where those
# would leave the consumers fewer than their accumulators, the dequantization's spare and
# _WGMMA_SLACK more, where ptxas serializes their wgmma (warning C7512)
_DENSE_PRODUCER_REGISTERS = 40
_LEAST_PRODUCER_REGISTERS = 24
_WGMMA_SLACK = 16


def _unserialized_need(tile: "TileConfig") -> int:
    """The registers a consumer thread needs for its wgmma not to be serialized: its accumulators,
    the dequantization's spare and _WGMMA_SLACK."""
    units = tile.units_per_warpgroup
    return tile.block_m // 2 * units + _spare_registers(units) + _WGMMA_SLACK


def _producer_registers(tile: "TileConfig", ctas_per_sm: int, preferred: int) -> int:
    consumer = _consumer_registers(tile.warps_n // 4, ctas_per_sm, preferred)
    return preferred if consumer >= _unserialized_need(tile) else _LEAST_PRODUCER_REGISTERS


def dense_producer_registers(tile: "TileConfig") -> int:
    """The registers the dense body's producer warpgroup keeps on this tile (kernel/
    dense_wgmma_ws.cuh kProducerRegisters): 40, or 24 where the consumers need the rest to keep
    their wgmma in flight (the 176-token tile of two consumer warpgroups of 128 channels)."""
    return _producer_registers(tile, 2 if tile.warps_n == 4 else 1, _DENSE_PRODUCER_REGISTERS)


def masked_producer_registers(tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
    """The registers the masked schedule's producer warpgroup keeps on this tile (kernel/
    grouped_masked_ws.cuh kProducerRegisters): 56, or 24 where the consumers need the rest to keep
    their wgmma in flight (the 176-row tile of two consumer warpgroups, one-warpgroup tiles at
    their most accumulators)."""
    return _producer_registers(tile, masked_ctas_per_sm(tile, w_bits, has_zero_point), _WALK_PRODUCER_REGISTERS)


WGMMA_WS = WgmmaWsBody()
