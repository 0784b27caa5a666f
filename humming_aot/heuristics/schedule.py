"""How a tile's problem is cut over the GPU's CTA slots: split-K slices of every tile (split_k_factor),
the wgmma-ws body's tail split of a partial last wave (tail_split_schedule) and its stream-K
ranges below one wave or over a thin last wave (stream_k_ctas, partial_wave_stream_k), the tail
split that stands in for stream-K ranges too short for it (short_stream_k_ranges,
short_range_tail_splits), with the constants each was measured to. The tile itself comes from
heuristics/tiles.py.
"""
from __future__ import annotations

from humming_aot.heuristics.tiles import DEFAULT_SPLIT_CTAS_PER_SM
from humming_aot.spec import MmaKind, TileConfig


def split_k_factor(*, m: int, n: int, k: int, tile: TileConfig, num_sms: int, max_tiles: int,
                   ctas_per_sm: int = 2, target_ctas_per_sm: int = DEFAULT_SPLIT_CTAS_PER_SM) -> int:
    """How many K slices to split each output tile into, so that small problems fill the GPU.

    Splits only when the output tiles leave CTA slots idle: num_sms * min(ctas_per_sm (what
    fits), target_ctas_per_sm (the table row's choice, split_ctas_per_sm)); keeps at least 256 of
    K per slice so that the pipeline has work; at most 16 slices; never more output tiles than
    there are split-K counters.

    Decode tiles (at most 16 rows, bound by weight streaming) whose tiles overrun the slots by at
    most half a wave are cut in 2 slices: the second wave would otherwise stream a few tiles' weights
    with most SMs idle (36864 x 7168 at M = 1, 288 tiles of 8 x 128 on 264 slots: 49.5 us whole,
    45.2 in 2 slices; at 1.7 waves, 57344 x 8192, whole tiles stay faster: log section 25).
    """
    tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
    if tiles > max_tiles:
        return 1
    # Measured on an H200 (docs/performance/log.md): filling every resident slot makes the slices so
    # short that their prologue and reduction dominate.
    slots = num_sms * max(1, min(ctas_per_sm, target_ctas_per_sm))
    if slots < tiles <= DECODE_WAVE_SPLIT_MAX_WAVES * slots and tile.block_m <= 16:
        return 2 if k // 256 >= 2 else 1
    return max(1, min(slots // max(tiles, 1), k // 256, 16))


# split_k_factor: decode tiles up to this many waves of slots are split in two (see there).
DECODE_WAVE_SPLIT_MAX_WAVES = 1.5


# Cost of each K slice of a split tile, in K tiles of work: its partial sums' round trip through
# the workspace, the reducing CTA's wait and the slice's own prologue, which do not shrink with
# K (fitted to the H200 split sweeps of docs/performance/log.md section 21: 6144 x 4096 at M = 1024
# saved half of what the waves alone predicted with 2 slices of 32 K tiles).
SLICE_COST_K_TILES = 4
# ... and a split whose modelled saving is under 15 % of a tile is not worth the model's error.
SPLIT_MARGIN = 0.15


def tail_split_schedule(*, tiles: int, k_tiles: int, slots: int, max_tiles: int, max_splits: int = 16,
                        min_k_tiles: int = 4) -> tuple[int, int]:
    """(dp_ctas, tail_splits) of the wgmma-ws body's schedule (schedule/tail_split_scheduler.cuh):
    the tiles of whole waves of `slots` resident CTAs run one CTA each over all of K; the `rest`
    tiles of a partial last wave are split into s K slices (at least min_k_tiles K tiles each, at
    most max_splits), s chosen to minimize the last waves' time ceil(rest s / slots) / s plus
    s SLICE_COST_K_TILES / k_tiles (in whole-tile times), if that saves SPLIT_MARGIN of a tile: a
    long K makes slices relatively cheaper, so 32 tiles of 224 K tiles take 8 slices; a nearly full last
    wave stays whole, a 0.6 wave is cut in 3 and run as two waves of thirds. With fewer tiles than
    slots every tile is in that last wave."""
    full_waves, rest = divmod(tiles, slots)
    if rest == 0 or rest > max_tiles:
        return tiles, 1
    best, best_time = 1, 1.0 - SPLIT_MARGIN  # a split must save this much of a tile's time
    for splits in range(2, min(max_splits, k_tiles // min_k_tiles) + 1):
        time = -(-rest * splits // slots) / splits + SLICE_COST_K_TILES * splits / k_tiles
        if time < best_time - 1e-9:
            best, best_time = splits, time
    if best == 1:
        return tiles, 1
    return full_waves * slots, best


def stream_k_ctas(*, tiles: int, k_tiles: int, slots: int, max_tiles: int, fixup_k_tiles: int = 0,
                  min_range_k_tiles: int = 0) -> int:
    """The persistent CTAs of the wgmma-ws body's stream-K schedule (schedule/stream_k_scheduler.cuh):
    every resident slot (`slots`) while the output tiles are fewer than the slots (less than one
    wave), else 0 for the tail split (tail_split_schedule), which needs no fix-up for the whole
    waves. Measured on an H200 over 9 layer shapes at M = 32-512 (docs/performance/log.md section 23):
    below one wave stream-K is as fast as the best tail split or faster at most points.

    fixup_k_tiles (the 16-bit body passes stream_k_fixup_k_tiles(tile)): a nearly full wave of whole
    tiles, which the tail split leaves whole, stays whole (0) when the slots it leaves idle cost
    less than that many K tiles of a CTA's time, (1 - tiles / slots) x k_tiles: what stream-K's
    fix-up costs there (STREAM_K_FIXUP_K_TILES).

    min_range_k_tiles (the 16-bit body passes stream_k_min_range_k_tiles(tile)): the tail split (0)
    where stream-K's ranges, tiles x k_tiles / slots, would be shorter than that many K tiles."""
    if tiles > max_tiles or tiles >= slots or tiles * k_tiles < slots:
        return 0
    if short_stream_k_ranges(tiles=tiles, k_tiles=k_tiles, slots=slots, min_range_k_tiles=min_range_k_tiles):
        return 0  # ranges too short for their fix-up: the tail split's few slices instead
    if fixup_k_tiles and (slots - tiles) * k_tiles < fixup_k_tiles * slots:
        _, splits = tail_split_schedule(tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=max_tiles)
        if splits == 1:
            return 0
    return slots


# What stream-K's fix-up costs below one wave, in K tiles of a CTA's time, for a one-warpgroup
# tile of 128 rows (two CTAs an SM): every CTA's fp32 partial goes through L2 and back while the K
# loops end together, so the cost follows the partial's rows (stream_k_fixup_k_tiles). Fitted to
# the 16-bit body, int4 g128 on an H100 (docs/performance/log.md section 80): the fix-up took
# 6 us at 64 rows, 8-12 at 96 and 13-17 at 128, i.e. 10-21 K tiles of 64; whole tiles beat
# stream-K by 2-17 % at 96-128 tokens on 27648 x 5120, 28672 x 4096, 28672 x 3584 and
# 30720 x 4096 (0.82-0.91 of a wave), level at 64 tokens on 28672 x 4096. Fitted with fp32
# partials: a bfloat16 output's now move in half the bytes (epilogue/half_slot_vectors.cuh), which
# took 1-3.5 us off the stream-K points of section 82; not refitted.
STREAM_K_FIXUP_K_TILES = 16


# Below one wave, stream-K's ranges shorter than this many K tiles (tiles x k_tiles / slots) give
# way to the tail split: a few tiles of a short K cut over every slot make each tile many short
# parts, whose fix-up costs more than the tail split's few slices lose to balance. H100, int4 g128,
# 80- and 96-row tiles of 128 channels (log section 83, tune_tiles.py, 13 layers at 72 and 96
# tokens), us, stream-K / tail split at 72 tokens: ranges of 3.9-7.8 K tiles, 2048 x 4096 16.1 /
# 11.7, 1280 x 8192 20.1 / 14.8, 4096 x 2048 12.1 / 9.6, 3072 x 4096 13.9 / 12.2, 3584 x 3584
# 13.4 / 11.6, 4096 x 4096 14.4 / 12.6, 8192 x 1024 9.8 / 8.6 (the tail split 6-50 % faster at
# both token counts); from 9.7 up stream-K level or faster: 5120 x 4096 (9.7) 14.5 / 16.6,
# 6144 x 4096 (11.6) 14.8 / 16.6, 8192 x 3584 (13.6) 15.7 / 16.5; 4096 x 7168, 8192 x 8192 and
# 4096 x 14336 within 3 %. Codes wider than 4 bits (a slower K loop beside the same fix-up) are
# not measured.
STREAM_K_MIN_RANGE_K_TILES = 8
# ... for one-warpgroup tiles of at least this many rows (80 and 96 measured, and the 72-row tile
# of 65-72 tokens between them and the 80-row tile it replaced; 48- and 64-row tiles, which serve
# 33-64 tokens on layers of many tiles or a long K, keep stream-K)
STREAM_K_MIN_RANGE_ROWS = 72


def short_stream_k_ranges(*, tiles: int, k_tiles: int, slots: int, min_range_k_tiles: int) -> bool:
    """Whether a problem of fewer tiles than `slots` would cut stream-K ranges (tiles x k_tiles /
    slots) shorter than min_range_k_tiles K tiles: stream_k_ctas gives it the tail split, whose
    slices short_range_tail_splits counts."""
    return 0 < tiles < slots and tiles * k_tiles < min_range_k_tiles * slots


# The slices of that tail split: each costs this many K tiles of a CTA's time beyond its share of
# K (its prologue, its partial's round trip and the head's sum), and the slices run in waves of
# one CTA an SM, not of the two an SM the tile's registers allow: two CTAs of one consumer
# warpgroup on an SM share its tensor cores, so a second CTA there adds its whole K range to the
# SM's time. The longest slice, ceil(k_tiles / s) K tiles (schedule/tail_split_scheduler.cuh),
# sets each wave's time. Fitted on an H100, int4 g128, 80- and 96-row tiles of 128 channels at 72
# and 96 tokens, every slice count 2-12 forced (docs/performance/log.md sections 83-84: 17
# layers, 34 points): this model's count is the fastest at 30 points and within 4.7 % at all 34
# (2 to 2.75 K tiles a slice pick the same count at every point, 1.75 or 3 do worse);
# tail_split_schedule's (the slots' waves, 4 K tiles a slice) was up to 23 % off (2048 x 8192:
# 6 slices 17.2 us, 8 slices 14.2).
SHORT_RANGE_SLICE_COST_K_TILES = 2


def short_range_tail_splits(*, tiles: int, k_tiles: int, num_sms: int, max_splits: int = 16,
                            min_k_tiles: int = 4) -> int:
    """K slices for each of `tiles` output tiles, fewer than one wave, where short_stream_k_ranges
    holds: s minimizing ceil(tiles s / num_sms) ceil(k_tiles / s) / k_tiles (waves of one CTA an
    SM, each as long as the longest slice) plus s SHORT_RANGE_SLICE_COST_K_TILES / k_tiles, in
    whole-tile times; a split must save SPLIT_MARGIN of a tile, as in tail_split_schedule. Slice
    counts that leave a slice empty (no shorter longest slice than one fewer) are skipped."""
    best, best_time = 1, 1.0 - SPLIT_MARGIN
    for splits in range(2, min(max_splits, k_tiles // min_k_tiles) + 1):
        slice_k_tiles = -(-k_tiles // splits)
        if (splits - 1) * slice_k_tiles >= k_tiles:
            continue
        waves = -(-tiles * splits // num_sms)
        time = (waves * slice_k_tiles + SHORT_RANGE_SLICE_COST_K_TILES * splits) / k_tiles
        if time < best_time - 1e-9:
            best, best_time = splits, time
    return best


def stream_k_min_range_k_tiles(tile: TileConfig) -> int:
    """stream_k_ctas' min_range_k_tiles for a wgmma-ws tile: STREAM_K_MIN_RANGE_K_TILES for one
    consumer warpgroup of at least STREAM_K_MIN_RANGE_ROWS rows (two CTAs an SM), else 0 (two
    warpgroups, one CTA an SM, and fewer rows: not measured)."""
    if tile.mma is not MmaKind.WGMMA_WS or tile.warps_n != 4 or tile.block_m < STREAM_K_MIN_RANGE_ROWS:
        return 0
    return STREAM_K_MIN_RANGE_K_TILES


def stream_k_fixup_k_tiles(tile: TileConfig) -> int:
    """stream_k_ctas' fixup_k_tiles for a wgmma-ws tile: STREAM_K_FIXUP_K_TILES scaled by its rows
    over 128 for one consumer warpgroup (two CTAs an SM: the tiles the fit was measured on), 0
    (stream-K below one wave as before) for two (one CTA an SM, not measured)."""
    if tile.mma is not MmaKind.WGMMA_WS or tile.warps_n != 4:
        return 0
    return STREAM_K_FIXUP_K_TILES * tile.block_m // 128


# Decode-sized problems of more output tiles than resident CTAs whose whole-tile waves would run
# less full than WAVE_FILL on average (tiles / (waves x slots)) take stream-K over one wave of CTAs
# instead (partial_wave_stream_k); tiles of two consumer warpgroups only from STREAM_K_MIN_K
# columns of K up, where the fix-up is cheap beside a CTA's K range.
WAVE_FILL = 0.9
STREAM_K_MIN_K = 6144
PARTIAL_WAVE_MAX_M = 128


def partial_wave_stream_k(*, two_warpgroups: bool, m: int, tiles: int, k: int, slots: int, max_tiles: int) -> bool:
    """Whether a problem of `tiles` output tiles, at least one wave of `slots` resident CTAs, runs
    the wgmma-ws bodies' stream-K over those slots rather than whole tiles and the tail split: whole-
    tile waves less than WAVE_FILL full on average (a last wave under 80 % at two waves, 60 % at
    four), at most PARTIAL_WAVE_MAX_M tokens (there the weights' bytes, not the tiles, set the time,
    and a partial wave leaves DRAM bandwidth and tensor cores unused), and with two consumer
    warpgroups a K of at least STREAM_K_MIN_K. W8A8 float8 on an H200 (docs/performance/log.md
    section 35): 57344 x 8192 at 1 / 16 / 64 / 128 tokens 114.1 / 119.3 / 125.1 / 152.8 us with
    the tail split against 112.6 / 115.0 / 123.8 / 148.6 with stream-K, 59136 x 8192 at 128 tokens
    162.5 against 153.6; 28672 x 4096 at 128 tokens level. The 16-bit body's one-warpgroup tiles on
    an H100 (section 70), int4 g128: 57344 x 8192 at 32 / 64 / 128 tokens 124.9 / 158.3 / 208.3
    against 116.9 / 144.8 / 197.0; over 35 points of five layers and three formats 3.6 % less time
    in geometric mean, up to 6.4 % more on a layer of 1.09 waves (36864 x 7168)."""
    if tiles < slots or tiles > max_tiles or m > PARTIAL_WAVE_MAX_M:
        return False
    waves = -(-tiles // slots)
    if tiles >= WAVE_FILL * waves * slots:
        return False
    return not two_warpgroups or k >= STREAM_K_MIN_K
