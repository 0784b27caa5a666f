"""Tile tables per arch, the shared-memory formula of the mma.sync body, and split-K sizing."""
from __future__ import annotations

import functools

from humming_aot.catalog_data import load_toml
from humming_aot.spec import MmaKind, TileConfig, parse_arch

# The mma.sync body stages up to this many scale (and zero-point) rows per 64-wide K stage:
# 64 / 16, for the smallest group size it accepts.
MAX_SCALE_ROWS_PER_STAGE = 4


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


@functools.cache
def arch_tile_table(arch: str) -> tuple[tuple[int, TileConfig], ...]:
    """((max_m, tile), ...) in M order for an arch."""
    entry = load_toml("tiles.toml")["arch"][table_arch_for(arch)]
    table = []
    for row in entry["tiles"]:
        row = dict(row)
        max_m = row.pop("max_m")
        mma = MmaKind(row.pop("mma", MmaKind.MMA_SYNC.value))
        table.append((max_m, TileConfig(mma=mma, **row)))
    return tuple(table)


def smem_limit(arch: str) -> int:
    return int(load_toml("tiles.toml")["arch"][table_arch_for(arch)]["smem_limit"])


def smem_bytes(tile: TileConfig, w_bits: int, has_zero_point: bool) -> int:
    """Dynamic shared memory of one CTA (must equal the C++ kSmemBytes of the tile's body; the
    generated source static_asserts it)."""
    a_bytes = tile.block_m * tile.block_k * 2
    w_bytes = tile.block_n * tile.block_k * w_bits // 8
    scale_bytes = MAX_SCALE_ROWS_PER_STAGE * tile.block_n * 2
    zp_bytes = scale_bytes if has_zero_point else 0
    stage = a_bytes + w_bytes + scale_bytes + zp_bytes
    if tile.mma is MmaKind.WGMMA:
        # stages on 1024-byte boundaries (128-byte swizzle); the epilogue stages the output tile
        # (rows padded by 16 bytes) in the same memory; +1024 to align the base at run time
        pipeline = tile.stages * (-(-stage // 1024) * 1024)
        staging = tile.block_m * (tile.block_n + 8) * 2
        return max(pipeline, staging) + 1024
    pipeline = tile.stages * stage
    # warps_k > 1: after the K loop, warps 1.. of each K group park their fp32 accumulators
    # (block_m / warps_m / 16 m16 fragments x 8 n8 fragments x 4 floats x 32 lanes) in the same
    # shared memory for warp 0 of the group to add up
    reduction = (tile.warps_k - 1) * tile.warps_m * tile.warps_n * (tile.block_m // tile.warps_m // 16) * 4096
    return max(pipeline, reduction)


def select_tile(arch: str, m: int) -> TileConfig:
    """The table's tile for a problem with m rows."""
    for max_m, tile in arch_tile_table(arch):
        if m <= max_m:
            return tile
    return arch_tile_table(arch)[-1][1]


def split_k_factor(*, m: int, n: int, k: int, tile: TileConfig, num_sms: int, max_tiles: int,
                   ctas_per_sm: int = 2) -> int:
    """How many K slices to split each output tile into, so that small problems fill the GPU.

    Splits only when the output tiles leave CTA slots idle (num_sms * ctas_per_sm); keeps at least
    4 K tiles (of 64) per slice so that the pipeline has work; at most 16 slices; never more
    output tiles than there are split-K counters.
    """
    tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
    if tiles > max_tiles:
        return 1
    k_tiles = k // tile.block_k
    # Measured on an H200 (docs/PERFORMANCE.md): filling every resident slot makes the slices so
    # short that their prologue and reduction dominate; ~4 CTAs per SM is the sweet spot.
    slots = num_sms * max(1, min(ctas_per_sm, 4))
    return max(1, min(slots // max(tiles, 1), k_tiles // 4, 16))


def ctas_per_sm(tile: TileConfig, smem: int, smem_per_sm: int, max_warps_per_sm: int = 64) -> int:
    """Resident CTAs per SM allowed by shared memory and warps (registers are not modelled)."""
    by_smem = smem_per_sm // max(smem + 1024, 1)  # the driver reserves 1 KiB per CTA
    by_warps = max_warps_per_sm // (tile.threads // 32)
    return max(1, min(by_smem, by_warps, 8))
