"""Tile tables per arch, the shared-memory formula of the mma.sync body, and split-K sizing."""
from __future__ import annotations

import dataclasses
import functools

from humming_aot.catalog_data import load_toml
from humming_aot.spec import MmaKind, TileConfig, parse_arch


def table_arch_for(arch: str) -> str:
    """The tiles.toml table that serves a target: exact name, then the plain arch, then the
    nearest lower arch of the same major (sm87 -> sm86 -> sm80)."""
    tables = load_toml("tiles.toml")["arch"]
    if arch in tables:
        return arch
    number, _suffix = parse_arch(arch)
    # an arch-specific table ('a': wgmma tiles) serves only its own arch
    candidates = sorted(
        (parse_arch(name)[0], name) for name in tables
        if parse_arch(name)[0] // 10 == number // 10 and (parse_arch(name)[1] != "a" or name == arch)
    )
    lower = [name for num, name in candidates if num <= number]
    if lower:
        return lower[-1]
    raise ValueError(
        f"no tile table for arch {arch!r}: tiles.toml has {sorted(tables)}; add one for this arch"
    )


# Split-K aims at this many resident CTAs per SM unless a table row says otherwise (measured on
# an H200 for 2-warp 16-row tiles: filling every slot made the slices too short).
DEFAULT_SPLIT_CTAS_PER_SM = 4


@dataclasses.dataclass(frozen=True, slots=True)
class FillCondition:
    """When a table row serves a problem beyond its M interval and code width: at most
    max_tiles_per_sm of the row tile's output tiles per SM, and at most max_k_per_sm columns of K
    per SM summed over those tiles (output tiles x K / SMs: how much of the reduction each SM runs).
    Few output tiles favour a tile with fewer, larger CTAs per SM; the swapped 32-token tile at
    33-64 tokens runs two token tiles per weight tile, which pays only while each SM's share of the
    K loop is short (docs/performance/log.md sections 23, 41, 42 and 43)."""

    max_tiles_per_sm: float | None = None
    max_k_per_sm: int | None = None

    def admits(self, tile: TileConfig, m: int, n: int | None, k: int | None, num_sms: int | None) -> bool:
        """Whether the problem meets the condition; a quantity the caller does not give (N, K, the
        SM count) does not rule the row out."""
        if n is None or num_sms is None:
            return True
        tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
        if self.max_tiles_per_sm is not None and tiles > self.max_tiles_per_sm * num_sms:
            return False
        return self.max_k_per_sm is None or k is None or tiles * k <= self.max_k_per_sm * num_sms


# A row's `codes`: "any" (the default), or "integer" for a row that serves integer weight codes
# (int / uint, with or without zero points) only; float codes (eXmY, MXFP4, NVFP4) skip it.
ROW_CODES = ("any", "integer")


@functools.cache
def _table_rows(arch: str) -> tuple[tuple[int, TileConfig, int, int, FillCondition | None, bool], ...]:
    """((max_m, tile, split-K CTAs per SM, max_w_bits, fill condition or None, integer codes only),
    ...) in M order."""
    entry = load_toml("tiles.toml")["arch"][table_arch_for(arch)]
    rows = []
    for row in entry["tiles"]:
        row = dict(row)
        max_m = row.pop("max_m")
        split = row.pop("split_ctas_per_sm", DEFAULT_SPLIT_CTAS_PER_SM)
        max_w_bits = row.pop("max_w_bits", 8)
        codes = row.pop("codes", "any")
        if codes not in ROW_CODES:
            raise ValueError(f"tiles.toml [arch.{table_arch_for(arch)}]: codes = {codes!r}; a row takes one of "
                             f"{', '.join(map(repr, ROW_CODES))}")
        fill = FillCondition(max_tiles_per_sm=row.pop("max_tiles_per_sm", None),
                             max_k_per_sm=row.pop("max_k_per_sm", None))
        mma = MmaKind(row.pop("mma", MmaKind.MMA_SYNC.value))
        rows.append((max_m, TileConfig(mma=mma, **row), split, max_w_bits,
                     fill if fill != FillCondition() else None, codes == "integer"))
    return tuple(rows)


@functools.cache
def arch_tile_table(arch: str, w_bits: int = 8, float_codes: bool = False) -> tuple[tuple[int, TileConfig], ...]:
    """((max_m, tile), ...) in M order for an arch and weight codes of w_bits bits (float codes
    or not): the rows without max_w_bits, and those whose max_w_bits admits the codes (a row for
    narrow codes comes before the general row it overrides); for float codes, not the rows of
    integer codes only."""
    return tuple((max_m, tile) for max_m, tile, _ in _tile_rows(arch, w_bits, float_codes))


@functools.cache
def _tile_rows(arch: str, w_bits: int, float_codes: bool = False) -> tuple[tuple[int, TileConfig, FillCondition | None], ...]:
    """((max_m, tile, fill condition or None), ...): arch_tile_table with each row's fill condition.
    A row that select_tile can never reach for these codes is left out (so that the catalog does not
    build its tile for them): one after a row of the same or a wider M interval that serves every
    problem of it (no fill condition, 64-wide K stages). That is how a row for wider codes follows
    the row of narrower ones it gives way to (max_w_bits = 7 before a row for 8-bit codes)."""
    rows: list[tuple[int, TileConfig, FillCondition | None]] = []
    for max_m, tile, _, max_w_bits, fill, integer_only in _table_rows(arch):
        if w_bits > max_w_bits or (float_codes and integer_only):
            continue
        if any(kept_m >= max_m and kept_fill is None and kept.block_k == 64 for kept_m, kept, kept_fill in rows):
            continue
        rows.append((max_m, tile, fill))
    return tuple(rows)


def _warps(tile: TileConfig) -> int:
    return tile.warps_m * tile.warps_n * tile.warps_k


@functools.cache
def _split_rows(arch: str, tile: TileConfig) -> tuple[tuple[int, int], ...]:
    """((max_m, split-K CTAs per SM), ...) of the table rows holding ``tile`` or its wide-K original.
    A twin with fewer warps than its original (narrow_twin) aims at proportionally more CTAs, so
    that split-K fills the same warps per SM."""
    return tuple((max_m, split * max(1, _warps(row_tile) // _warps(tile)))
                 for max_m, row_tile, split, _, _, _ in _table_rows(arch)
                 if tile in (row_tile, narrow_twin(row_tile)))


def split_ctas_per_sm(arch: str, m: int, tile: TileConfig) -> int:
    """How many CTAs per SM split-K should aim at for ``tile`` serving m rows: the value of the
    table row that holds the tile (or its wide-K original) for m, else the last row holding
    it, else the default. (On every launch: the rows are looked up once per (arch, tile).)"""
    rows = _split_rows(arch, tile)
    for max_m, split in rows:
        if m <= max_m:
            return split
    return rows[-1][1] if rows else DEFAULT_SPLIT_CTAS_PER_SM


def smem_limit(arch: str) -> int:
    return int(load_toml("tiles.toml")["arch"][table_arch_for(arch)]["smem_limit"])


def smem_bytes(tile: TileConfig, w_bits: int, has_zero_point: bool) -> int:
    """Dynamic shared memory of one CTA: the tile's body's (humming_aot.bodies; must equal the C++
    kSmemBytes, which the generated source static_asserts)."""
    return tile.body.smem_bytes(tile, w_bits, has_zero_point)


def tile_fits(tile: TileConfig, k: int, group: int) -> bool:
    """Whether a tile's K stages line up with K and the scale groups: K a multiple of block_k, and
    each group either inside one stage (a divisor of block_k) or whole stages (a multiple)."""
    return k % tile.block_k == 0 and (tile.block_k % group == 0 or group % tile.block_k == 0)


def narrow_twin(tile: TileConfig) -> TileConfig:
    """The 64-wide-K tile that serves problems a wider (128- to 512-wide) tile does not fit
    (tile_fits); every catalog with a wider tile also holds this twin. It keeps at least 3
    stages: two 64-wide stages hold too little in flight (measured 23.8 vs 17.5 us at M = 1 on
    an H200, docs/performance/log.md section 11), and 3 of them take less shared memory than 2 of
    the wide tile's.

    The swapped tiles (8 or 16 tokens) run one cp.async pipeline per K warp (swapped_warp_pipeline.cuh),
    so its twin keeps at least 32 of K per warp and stage (at most 2 K warps) and half the wide
    tile's K in flight: 4 K warps of 16 took 55.4 us at M = 1 on 8192 x 29568, 2 K warps with 4
    stages 34.0 (log section 25)."""
    if tile.block_k == 64 or tile.body.fixed_block_k:  # (wgmma-ss: its K stage is 128, always)
        return tile
    if tile.body.pipeline_per_warp(tile):
        return dataclasses.replace(tile, block_k=64, warps_k=min(tile.warps_k, 2),
                                   stages=max(3, tile.stages * tile.block_k // 128))
    return dataclasses.replace(tile, block_k=64, stages=max(tile.stages, 3))


def twin_reachable(arch: str, w_bits: int, tile: TileConfig, float_codes: bool = False) -> bool:
    """Whether select_tile can pick the narrow twin of `tile`, a row of the arch's table for
    w_bits-bit codes (float codes or not): not when a later row of its M interval serves every K
    (64-wide stages) with no fill condition, since that row takes the problems the wide tile does
    not fit (and a K that 64 does not divide is refused at launch). A tile in no row: True."""
    rows = _tile_rows(arch, w_bits, float_codes)
    found = False
    for index, (max_m, row_tile, _) in enumerate(rows):
        if row_tile != tile:
            continue
        found = True
        if not any(later_m == max_m and later.block_k == 64 and fill is None
                   for later_m, later, fill in rows[index + 1:]):
            return True
    return not found


def select_tile(arch: str, m: int, k: int | None = None, group: int | None = None, w_bits: int = 8,
                n: int | None = None, num_sms: int | None = None, dense_rows: bool = True,
                float_codes: bool = False) -> TileConfig:
    """The table's tile for a problem with m rows and w_bits-bit weight codes (float codes, such as
    MXFP4, skip the rows of integer codes only). When given, K and the group size rule out a
    wide-K tile that does not fit them (it gives way to the next row of the same M that fits, else
    to its own 64-wide twin), and N, K and the device's SM count rule out a row whose fill
    condition the problem does not meet (FillCondition; the next row of the same M serves it).
    dense_rows=False leaves out the rows with a fill condition (choices measured on dense layers,
    which the MoE schedules do not share: select_masked_tile)."""
    rows = [row for row in _tile_rows(arch, w_bits, float_codes) if dense_rows or row[2] is None]
    row_m = next((max_m for max_m, _, _ in rows if m <= max_m), rows[-1][0])
    candidates = [(tile, fill) for max_m, tile, fill in rows if max_m == row_m]

    def fits(tile: TileConfig) -> bool:
        return k is None or group is None or tile_fits(tile, k, group)

    for tile, fill in candidates:
        if fits(tile) and (fill is None or fill.admits(tile, m, n, k, num_sms)):
            return tile
    return next((tile for tile, _ in candidates if fits(tile)), narrow_twin(candidates[0][0]))


# The bodies the MoE schedules (kernel/grouped_masked.cuh, grouped_contiguous.cuh) wrap: those
# with run_tile, several tiles per CTA in turn (kernel/dense_mma_sync.cuh).
MOE_BODIES = (MmaKind.MMA_SYNC, MmaKind.MMA_SWAPPED)
# The bodies the grouped masked schedule and its offsets form take: those, and the warp-specialized
# TMA body (kernel/grouped_masked_ws.cuh drives its producer and consumers over the same walk).
# sm90a's moe_tiles rows of more than 16 rows per expert name it (log section 30); the grouped
# row-expert GEMM skips those rows and takes the mma.sync tiles below.
MOE_MASKED_BODIES = MOE_BODIES + (MmaKind.WGMMA_WS,)


# The bodies both MoE schedules take for 8-bit activations (the W4A8 and W8A8 pairings;
# kernel/grouped_masked.cuh over MaskedScaledGemmParams, grouped_contiguous.cuh over
# GroupedScaledGemmParams): the portable mma-w4a8 and mma-ss bodies, whose run_tile takes the
# rows' codes and scales.
MOE_SCALED_BODIES = (MmaKind.MMA_W4A8, MmaKind.MMA_SS)


# The masked schedule (and its offsets form) also takes the warp-specialized Hopper W4A8 and W8A8
# bodies (kernel/grouped_masked_scaled_ws.cuh drives their producer and consumers over the same walk),
# and so does the row-expert form (the same schedule over schedule/row_block_walk.cuh).
MOE_SCALED_MASKED_BODIES = MOE_SCALED_BODIES + (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS)


def moe_bodies(masked: bool, quantized: bool = False) -> tuple[MmaKind, ...]:
    """The bodies a MoE schedule takes: the masked one's (and its offsets form's), else the grouped
    row-expert one's; with quantized (8-bit) activations MOE_SCALED_MASKED_BODIES for both (the
    warp-specialized ones through kernel/grouped_masked_scaled_ws.cuh's two walks)."""
    if quantized:
        return MOE_SCALED_MASKED_BODIES
    return MOE_MASKED_BODIES if masked else MOE_BODIES


@functools.cache
def _moe_rows_all(arch: str) -> tuple[tuple[int, int | None, int, TileConfig], ...]:
    """((max_m, max_k or None, max_w_bits, tile), ...) of the arch's moe_tiles table in M order
    (empty without one)."""
    rows = []
    for row in load_toml("tiles.toml")["arch"][table_arch_for(arch)].get("moe_tiles", []):
        row = dict(row)
        max_m = row.pop("max_m")
        max_k = row.pop("max_k", None)
        max_w_bits = row.pop("max_w_bits", 8)
        mma = MmaKind(row.pop("mma", MmaKind.MMA_SYNC.value))
        tile = TileConfig(mma=mma, **row)
        if tile.mma not in MOE_MASKED_BODIES:
            raise ValueError(f"tiles.toml: moe_tiles of {arch} holds {tile.label} of body {tile.mma.value!r}; "
                             f"the MoE schedules wrap {', '.join(b.value for b in MOE_MASKED_BODIES)} only")
        rows.append((max_m, max_k, max_w_bits, tile))
    return tuple(rows)


@functools.cache
def _moe_rows(arch: str, w_bits: int = 8) -> tuple[tuple[int, int | None, TileConfig], ...]:
    """((max_m, max_k or None, tile), ...) of the arch's moe_tiles rows that serve w_bits-bit
    codes: the first of each (max_m, max_k, body) whose max_w_bits (default 8) admits them (a row
    for narrow codes comes before the row of the same max_m and max_k that serves the rest, which
    then serves no narrow code: the catalog holds no kernel no selection picks)."""
    rows, seen = [], set()
    for max_m, max_k, max_w_bits, tile in _moe_rows_all(arch):
        if w_bits <= max_w_bits and (max_m, max_k, tile.mma) not in seen:
            seen.add((max_m, max_k, tile.mma))
            rows.append((max_m, max_k, tile))
    return tuple(rows)


# fit_ctas_per_sm: an 8-token tile gives up at most this many of its row's stages for a third CTA
# per SM, and keeps at least THREE_PER_SM_MIN_STAGES (uint4 with zero points: 6 -> 5 measured 6-9 %
# faster at 4-64 tokens on DeepSeek-V3 TP8's down projection, log section 51; since the rows run 4
# stages, log section 67, every code width's 8-row tile of 4 bits or fewer fits three as it is)
THREE_PER_SM_STAGES_GIVEN = 1
THREE_PER_SM_MIN_STAGES = 5


def fit_ctas_per_sm(arch: str, tile: TileConfig, w_bits: int, zero_point: bool) -> TileConfig:
    """A masked-schedule wgmma-ws tile of one consumer warpgroup with the stages that let it run the
    CTAs per SM its kernel is built for (bodies/wgmma_ws.masked_ctas_per_sm, which
    kernel/grouped_masked_ws.cuh kThreePerSm follows): for 8 tokens, three where the row's stages,
    or one fewer (at least THREE_PER_SM_MIN_STAGES), fit three (the kernel then holds three by its
    registers, which is where the 8-token tile gains: log section 51); else the most stages, up to
    the row's, whose shared memory (bodies/wgmma_ws.py masked_smem_bytes) lets two be resident on an
    SM of the arch (smem_limit + 1 KB). A row sized for 4-bit codes without zero points thus takes
    fewer stages with zero points or wider codes (the 32-row tile, 8-bit codes with zero points: 4
    -> 3), rather than run one CTA
    per SM (H200: DSv3-TP8 down, 512 tokens, uint4 zp, 242 us against 151 for int4). An 8-row row
    of 4 stages is not searched for three: where its shared memory fits three, the kernel holds
    three anyway (5- to 8-bit codes run so). Other tiles are returned as they are."""
    if tile.mma is not MmaKind.WGMMA_WS or tile.threads != 256:
        return tile
    from humming_aot.bodies.wgmma_ws import CTA_SMEM_OVERHEAD, masked_ctas_per_sm, masked_smem_bytes

    if tile.block_m == 8:
        for stages in range(tile.stages, max(tile.stages - THREE_PER_SM_STAGES_GIVEN, THREE_PER_SM_MIN_STAGES) - 1,
                            -1):
            fitted = dataclasses.replace(tile, stages=stages)
            if masked_ctas_per_sm(fitted, w_bits, zero_point) == 3:
                return tile if stages == tile.stages else fitted
    capacity = smem_limit(arch) + 1024
    stages = tile.stages
    while stages > 2 and 2 * (masked_smem_bytes(dataclasses.replace(tile, stages=stages), w_bits, zero_point)
                              + CTA_SMEM_OVERHEAD) > capacity:
        stages -= 1
    return tile if stages == tile.stages else dataclasses.replace(tile, stages=stages)


def moe_tile_table(arch: str, w_bits: int = 8, masked: bool = True,
                   zero_point: bool = False) -> tuple[TileConfig, ...]:
    """Every tile select_masked_tile can pick on an arch for w_bits-bit codes (before twins), for
    the masked schedule or (masked=False) the grouped row-expert one: the rows of the arch's
    moe_tiles table of the bodies that schedule takes, else its dense table's rows of the MoE
    bodies; then, above the largest M those serve, the rows of the same arch's mma.sync table
    without its suffix (sm90a's wgmma rows give way to sm90's). zero_point: the codes have zero
    points (a row's one-warpgroup TMA tile may then take fewer stages: fit_ctas_per_sm)."""
    bodies = moe_bodies(masked)
    moe = [(max_m, tile) for max_m, _, tile in _moe_rows(arch, w_bits) if tile.mma in bodies]
    if moe:
        own = moe
    else:
        own = [(max_m, tile) for max_m, tile in arch_tile_table(arch, w_bits) if tile.mma in MOE_BODIES]
    served = max((max_m for max_m, _ in own), default=0)
    tiles = [fit_ctas_per_sm(arch, tile, w_bits, zero_point) for _, tile in own]
    if masked:  # the offsets form's 4-stage twin of its shallow 8-row tile (offsets_ring_twin)
        tiles += [twin for twin in (_ring_twin(arch, tile, w_bits) for tile in tiles) if twin is not None]
    if any(tile.mma not in MOE_BODIES for _, tile in arch_tile_table(arch, w_bits)):
        number, _ = parse_arch(arch)
        tiles += [tile for max_m, tile in arch_tile_table(f"sm{number}", w_bits)
                  if max_m > served and tile.mma in MOE_BODIES]
    return tuple(dict.fromkeys(tiles))


def _select_moe_row(arch: str, m: int, k: int | None, group: int | None, masked: bool,
                    w_bits: int) -> TileConfig | None:
    """The moe_tiles row's tile for m rows per expert, K and w_bits-bit codes, or None when the
    table has no row for m (or no table): the first row of m's interval whose max_k admits K and
    whose stages fit K and the groups, else the first other mma.sync row that fits, else the
    narrow twin of the first admitted row where it fits, else the first row that fits, else the
    narrow twin of the first row for K."""
    bodies = moe_bodies(masked)
    rows = [row for row in _moe_rows(arch, w_bits) if row[2].mma in bodies]
    row_m = next((max_m for max_m, _, _ in rows if m <= max_m), None)
    if row_m is None:
        return None
    candidates = [(max_k, tile) for max_m, max_k, tile in rows if max_m == row_m]
    admitted = [tile for max_k, tile in candidates if k is None or max_k is None or k <= max_k]
    ordered = admitted + [tile for _, tile in candidates if tile not in admitted]

    def fits(tile: TileConfig) -> bool:
        return k is None or group is None or tile_fits(tile, k, group)

    # an admitted row; else a row whose max_k is below K (the mma.sync bodies split K), but a
    # wgmma-ws one only after the admitted row's narrow twin (the TMA body's MoE schedule has no
    # K slices: a short-K tile would run a long K in one CTA per tile)
    chosen = next((tile for tile in ordered if fits(tile) and (tile in admitted or tile.mma is not MmaKind.WGMMA_WS)),
                  None)
    if chosen is None and admitted and fits(narrow_twin(admitted[0])):
        chosen = narrow_twin(admitted[0])
    return chosen or next((tile for tile in ordered if fits(tile)), narrow_twin(ordered[0]))


@functools.cache
def offsets_depth_pair(arch: str, tile: TileConfig, k: int, group: int,
                       w_bits: int = 8) -> tuple[TileConfig, TileConfig] | None:
    """(shallow, deep) where `tile` is one of a pair of the arch's moe_tiles rows that differ only
    in the K each stage takes and the warps sharing it (an 8-row mma.sync tile of 128 of K in 2 K
    warps, and its twin of 256 in 4: twice the warps and bytes in flight per tile, half the CTAs
    per SM) and both fit K and the groups; else None. The offsets form picks between them by the
    rows' tiles (moe.kernels, offsets_depth): the catalog holds every moe_tiles row, so both are
    there."""
    pair = _depth_rows(arch, tile, w_bits)
    if pair is None or not all(tile_fits(twin, k, group) for twin in pair):
        return None
    return pair


def _depth_rows(arch: str, tile: TileConfig, w_bits: int) -> tuple[TileConfig, TileConfig] | None:
    """(shallow, deep) where `tile` is either of an 8-row mma.sync pair of 128 of K in 2 K warps
    and 256 in 4 and both are moe_tiles rows of the arch for w_bits-bit codes, whatever K; else
    None (offsets_depth_pair adds the fit to K and the groups)."""
    if tile.mma not in MOE_BODIES or tile.block_m != 8 or (tile.block_k, tile.warps_k) not in ((128, 2), (256, 4)):
        return None
    shallow = dataclasses.replace(tile, block_k=128, warps_k=2)
    deep = dataclasses.replace(tile, block_k=256, warps_k=4)
    rows = {row_tile for _, _, row_tile in _moe_rows(arch, w_bits)}
    return (shallow, deep) if shallow in rows and deep in rows else None


# offsets_ring_twin: the stages of the shallow 8-row tile's twin, and the widest codes that have one
# (for every code width the default sm90a catalog would gain 113 masked keys, ~2 MB of a wheel with
# ~5 MB of room; up to 4 bits it gains 42, ~0.8 MB: 4,851 -> 4,893 keys. The MoE checkpoints'
# experts are 4-bit: int4, uint4, MXFP4, NVFP4)
RING_TWIN_STAGES = 4
RING_TWIN_MAX_W_BITS = 4


def _ring_twin(arch: str, tile: TileConfig, w_bits: int) -> TileConfig | None:
    """The shallow tile of an offsets_depth_pair of the arch's moe_tiles rows at RING_TWIN_STAGES
    stages, for codes of at most RING_TWIN_MAX_W_BITS bits, whatever K; else None."""
    pair = _depth_rows(arch, tile, w_bits) if w_bits <= RING_TWIN_MAX_W_BITS and tile.stages == 2 else None
    return dataclasses.replace(tile, stages=RING_TWIN_STAGES) if pair is not None and tile == pair[0] else None


@functools.cache
def offsets_ring_twin(arch: str, tile: TileConfig, k: int, group: int, w_bits: int = 8) -> TileConfig | None:
    """The twin of the offsets form's shallow 8-row tile (the first of offsets_depth_pair: 128 of K
    per stage in 2 K warps, 2 stages) with RING_TWIN_STAGES stages: three stages in flight per CTA
    instead of one, so one CTA alone streams its tile faster, and fewer CTAs fit an SM (3 for 4-bit
    codes, against 4). moe.decode_tiles.offsets_depth takes it where the rows' tiles would leave a
    few of the shallow tile's CTAs alone in a last wave. None where the tile is no such shallow
    tile for K and the groups, or the codes are wider than RING_TWIN_MAX_W_BITS; the catalog holds
    the twin of every such row (moe_tile_table). (Cached: the offsets form asks on every decode
    call.)"""
    pair = offsets_depth_pair(arch, tile, k, group, w_bits)
    if pair is None or tile != pair[0]:
        return None
    return _ring_twin(arch, tile, w_bits)


def select_masked_tile(arch: str, m: int, k: int | None = None, group: int | None = None,
                       w_bits: int = 8, masked: bool = True, zero_point: bool = False) -> TileConfig:
    """The tile of a grouped MoE GEMM whose experts hold about m rows each, for the masked schedule
    and its offsets form (kernel/grouped_masked.cuh, grouped_masked_ws.cuh) or, with masked=False,
    the grouped row-expert one (grouped_contiguous.cuh): the arch's moe_tiles row for m and K of a
    body that schedule takes where it has one; else the arch's table tile for m where it is an
    mma.sync one (the bodies whose run_tile the persistent MoE schedules call), else the mma.sync
    table of the same arch without its suffix (sm90a's wgmma rows give way to sm90's). A row's
    one-warpgroup TMA tile keeps at least two CTAs per SM for the codes' width and zero points,
    three with 8 rows where one stage less allows it (fit_ctas_per_sm). The offsets form may then
    trade an 8-row mma.sync tile for its twin of the other K depth (moe.decode_tiles.offsets_depth)."""
    tile = _select_moe_row(arch, m, k, group, masked, w_bits)
    if tile is not None:
        return fit_ctas_per_sm(arch, tile, w_bits, zero_point)
    tile = select_tile(arch, m, k, group, w_bits, dense_rows=False)
    if tile.mma in MOE_BODIES:
        return tile
    number, _ = parse_arch(arch)
    plain = select_tile(f"sm{number}", m, k, group, w_bits, dense_rows=False)
    if plain.mma not in MOE_BODIES:
        raise ValueError(f"no mma.sync tile in the tables of {arch} and sm{number} for the grouped masked GEMM")
    return plain


def ctas_per_sm_by_registers(threads: int, registers_per_thread: int, registers_per_sm: int = 65536) -> int:
    """Resident CTAs per SM allowed by registers: the hardware allocates a warp's registers in units
    of 256."""
    per_warp = -(-max(registers_per_thread, 1) * 32 // 256) * 256
    return max(1, registers_per_sm // (per_warp * -(-threads // 32)))


def ctas_per_sm(tile: TileConfig, smem: int, smem_per_sm: int, max_warps_per_sm: int = 64) -> int:
    """Resident CTAs per SM allowed by shared memory and warps (registers are not modelled)."""
    by_smem = smem_per_sm // max(smem + 1024, 1)  # the driver reserves 1 KiB per CTA
    by_warps = max_warps_per_sm // (tile.threads // 32)
    return max(1, min(by_smem, by_warps, 8))
