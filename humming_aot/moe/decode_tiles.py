"""The offsets form's decode tile (``moe.kernels.gemm_grouped_kernel(..., offsets=...)`` at one to
four rows an expert): the table names a tile by the rows an expert is expected to hold, but at
decode sizes which of its neighbours serves a call best depends on how many experts the rows can
reach, which only the offsets form knows on the host (its rows and the experts). ``offsets_depth``
picks among the table's 8-row mma.sync tile, its 256-deep twin, its 4-stage twin and, on a short
K, the table's two-row wgmma-ws tile.
"""
from __future__ import annotations

import functools
import math

import torch

from humming_aot.moe.packing import PackedExperts
from humming_aot.spec import GemmType, MmaKind, TileConfig

# offsets_depth: the deep tile takes at least this many of its 256-wide K stages (DeepSeek-V3
# TP8 and Qwen3 gate_up, K 7168 and 2048, gained; Qwen3's down projection, K 768 in three stages,
# lost 20 % at one token: its 2-stage pipeline barely fills).
DEPTH_MIN_K_STAGES = 8


def offsets_depth(a: torch.Tensor, experts: PackedExperts, tile: TileConfig, loaded, resident: int, rows: int,
                  what: str) -> tuple[TileConfig, object, int]:
    """(tile, loaded kernel, resident CTAs) of the offsets form where the table's tile is one of an
    8-row pair that differ in K depth (heuristics.offsets_depth_pair: 128 of K per stage in 2 K
    warps, or 256 in 4), for `rows` routed rows: the deep tile where the tiles of the experts the
    rows can reach (reach = min(E, rows)),
    one row tile each (reach x the N tiles; at most 4 rows an expert, which the table gives these
    tiles), fit one wave of its resident CTAs and K takes at least DEPTH_MIN_K_STAGES of its stages:
    each tile then has a CTA of twice the warps and bytes in flight, and K slices through the
    workspace are fewer; else the shallow one, whose twice as many CTAs per SM share out more
    tiles evenly. The table alone cannot say which: it knows the rows per expert, not how many
    experts have rows. Measured on an H200 (docs/performance/log.md section 51), deep / shallow,
    us: DeepSeek-V3 gate_up (N 4096, K 7168) at 1 token (256 tiles) 37.9 / 47.0 and at 4 (1024)
    142.2 / 135.4; its TP8 shard (N 512) at 4 tokens (128) 27.7 / 37.1, at 16 (512) 66.7 / 61.8;
    Qwen3-30B gate_up (N 1536, K 2048) at 1 token (96) 9.6 / 14.3 (shallow: 4 K slices), at 4
    (384) 23.7 / 19.8. Where the shallow one stays and the table's two-row tile is a wgmma-ws one
    (short K), that tile instead once the reachable experts' shallow tiles make WIDE_WAVE_QUARTERS
    quarters of a wave (see there); else, for codes of up to 4 bits, the shallow tile's 4-stage
    twin (heuristics.offsets_ring_twin) where the tiles the rows are expected to make pass a wave
    of the shallow tile's CTAs and cost at most RING_GAIN of theirs in the twin's waves (wave_cost:
    a last wave of a few CTAs)."""
    from humming_aot import dispatch, heuristics
    from humming_aot.moe import kernels  # (its lookups, looked up at the call: tests stand in for them)

    device_index = a.device.index
    arch = dispatch.device_info(device_index).arches[0]
    pair = heuristics.offsets_depth_pair(arch, tile, experts.k, experts.group_size, experts.expert(0).bits)
    if pair is None:
        return tile, loaded, resident
    shallow, deep = pair
    reach = min(experts.experts, rows)

    def twin(other: TileConfig) -> tuple[object, int]:  # its kernel and resident CTAs, looked up once
        if other == tile:
            return loaded, resident
        entry = _TWINS.get(id(loaded))
        if entry is None or entry[0] is not loaded:
            entry = _TWINS[id(loaded)] = (loaded, {})
        if other not in entry[1]:
            other_loaded = kernels._kernel(a, experts, GemmType.MASKED, 1, what, "gemm_grouped", other)[1]
            entry[1][other] = (other_loaded, kernels._resident(other_loaded, other, device_index))
        return entry[1][other]

    if experts.k // deep.block_k >= DEPTH_MIN_K_STAGES:
        deep_loaded, deep_resident = twin(deep)
        if reach * -(-experts.n // deep.block_n) <= deep_resident:
            return deep, deep_loaded, deep_resident
    shallow_loaded, shallow_resident = twin(shallow)
    wide = two_row_tile(arch, experts)
    if wide is not None and 4 * reach * -(-experts.n // shallow.block_n) >= WIDE_WAVE_QUARTERS * shallow_resident:
        return (wide, *twin(wide))
    ring = heuristics.offsets_ring_twin(arch, shallow, experts.k, experts.group_size, experts.expert(0).bits)
    if ring is not None:
        tiles = expected_row_tiles(rows, experts.experts, shallow.block_m) * -(-experts.n // shallow.block_n)
        if tiles > shallow_resident:  # (the twin's kernel looked up only where it can win)
            ring_loaded, ring_resident = twin(ring)
            if wave_cost(tiles, ring_resident) <= RING_GAIN * wave_cost(tiles, shallow_resident):
                return ring, ring_loaded, ring_resident
    return shallow, shallow_loaded, shallow_resident


# wave_cost: a last wave of r of a tile's S resident CTAs costs at least TAIL_FLOOR of a full wave.
# Alone, a CTA streams its tile at the pace of the bytes its own ring keeps in flight; in a full
# wave it gets 1 / S of DRAM's. H100, DeepSeek-V3 TP8's gate_up (N 512, K 7168, int4 g128; 4 N
# tiles an expert), us, the shallow 8-row tile (528 resident CTAs) / its 4-stage twin (396), by the
# tiles T the rows are expected to make (expected_row_tiles): 16 tokens (T 404) 74.1 / 87.8, 20
# (476) 85.1 / 95.1, 24 (540) 120.2 / 100.0, 28 (597) 123.1 / 112.0, 32 (648) 126.9 / 117.2, 40
# (731) 132.9 / 130.1, 48 (796) 141.5 / 148.3, 64 (886) 152.5 / 162.8 (docs/performance/log.md
# section 69): each tile is slow where T just passes a whole number of its waves (24 tokens: 12
# CTAs left alone for ~24 us; the twin's three stages in flight take ~16), level elsewhere. A full
# wave of the shallow tile takes ~96 us there; its lone CTA ~24-30: TAIL_FLOOR 0.3 puts every
# point on the faster side. The model is crude: offsets_depth asks the twin for 5 % less
# (RING_GAIN) and only past a full wave of the shallow tile (under one, K slices fill the slots;
# not timed with the twin). Of the benchmark's GEMMs that leaves DeepSeek-V3 TP8's gate_up at
# 24-32 tokens; on DeepSeek-V3's (N 4096) the model gave the twin 1 % at 16 tokens, where it
# measured 0.5 % slower (554.7 / 552.1 us), and Qwen3-235B's gate_up at 4 tokens 0.6 % (measured
# 4.6 % faster, 75.0 / 78.6).
TAIL_FLOOR = 0.3
RING_GAIN = 0.95


def wave_cost(tiles: float, slots: int) -> float:
    """What `tiles` equal tiles cost on `slots` resident CTAs, in tiles streamed at a full wave's
    share of DRAM: the whole waves, then the last one at no less than TAIL_FLOOR of a wave."""
    full = math.floor(tiles / slots)
    rest = tiles - full * slots
    return full * slots + (max(rest, TAIL_FLOOR * slots) if rest > 0 else 0.0)


@functools.lru_cache(maxsize=1024)
def expected_row_tiles(rows: int, experts: int, block_m: int) -> float:
    """The row tiles of block_m rows that `rows` rows make when each goes to one of `experts`
    experts at random (the counts binomial; top-k's distinct experts per token make nearly the
    same): the sum over experts of E[ceil(count / block_m)] = E x sum over j >= 0 of P(count >
    j x block_m). The offsets form's walk (kernel/grouped_masked.cuh) runs that many tiles per N
    tile. Past 64 rows an expert (no decode tile's rule asks), rows / block_m + 1/2 per expert.
    (Cached: the offsets form asks on every decode call, and the sum loops over the counts.)"""
    if rows <= 0 or experts <= 0:
        return 0.0
    if experts == 1:
        return float(-(-rows // block_m))
    mean = rows / experts
    if mean > 64:
        return experts * (mean / block_m + 0.5)
    p = 1.0 / experts
    pmf = (1.0 - p) ** rows  # P(count = 0)
    below = 0.0  # P(count <= i)
    tiles = 0.0
    last = min(rows, int(mean + 12 * math.sqrt(mean) + 4 * block_m))
    for i in range(last + 1):
        below += pmf
        if i % block_m == 0:  # P(count > j x block_m) for j = i / block_m
            tiles += max(0.0, 1.0 - below)
        pmf *= (rows - i) / (i + 1) * p / (1.0 - p)
    return experts * tiles


# offsets_depth: the shallow 8-row tile gives way to the table's two-row wgmma-ws tile (short K on
# sm90a) where the experts the rows reach make at least WIDE_WAVE_QUARTERS quarters of a wave of the
# shallow tile's resident CTAs. Each of those 4-warp CTAs fills its 2-stage pipeline from DRAM anew
# for every tile (it prefetches no next tile: kernel/grouped_masked.cuh kPrefetchNext), which a K
# of a few stages does not hide once a CTA runs more than one tile; the wgmma-ws schedule's TMA
# producer runs its ring on from tile to tile. H100 (docs/performance/log.md section 61), Qwen3-30B's
# down projection (N 2048, K 768, int4 g128), one row an expert expected, table / wgmma-ws 8 x 256
# us: 1 token (8 experts: 0.24 of a wave of 8 x 128 tiles) 6.3 / 9.7, 2 tokens (0.48) 9.2 / 10.5,
# 4 (0.97) 13.5 / 12.7, 8 (1.9) 23.6 / 22.1, 16 (3.9) 35.9 / 31.4 (Humming 28.0).
WIDE_WAVE_QUARTERS = 3


def two_row_tile(arch: str, experts: PackedExperts) -> TileConfig | None:
    """The arch's MoE table tile for two rows an expert where it is a wgmma-ws one (sm90a, K up
    to 4096), else None."""
    return _two_row_wgmma_ws(arch, experts.k, experts.group_size, experts.expert(0).bits,
                             experts.w_zero_point is not None)


@functools.lru_cache(maxsize=256)
def _two_row_wgmma_ws(arch: str, k: int, group: int, bits: int, zero_point: bool) -> TileConfig | None:
    # (cached: the offsets form asks on every decode call, and the table walk costs ~20 us)
    from humming_aot import heuristics

    tile = heuristics.select_masked_tile(arch, 2, k, group, bits, zero_point=zero_point)
    return tile if tile.mma is MmaKind.WGMMA_WS else None


# offsets_depth's twins: id of the table tile's loaded kernel -> (that kernel, {twin tile: (its
# loaded kernel, resident CTAs)}), so that the eager path of a decode call looks a twin up once
# per kernel, not on every call
_TWINS: dict[int, tuple[object, dict[TileConfig, tuple[object, int]]]] = {}
