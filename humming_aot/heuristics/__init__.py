"""Tile selection: per-arch M-interval tables (data in catalog/tiles.toml), and how a tile's problem is
cut (split-K, the tail split, stream-K: heuristics/schedule.py).

Shared by the run time (which tile serves this problem) and the enumerator (which tiles a catalog
compiles). Python branches on arch here and in catalog/ only.
"""
from humming_aot.heuristics.schedule import (
    STREAM_K_FIXUP_K_TILES,
    STREAM_K_MIN_RANGE_K_TILES,
    STREAM_K_MIN_RANGE_ROWS,
    partial_wave_stream_k,
    split_k_factor,
    stream_k_ctas,
    stream_k_fixup_k_tiles,
    stream_k_min_range_k_tiles,
    tail_split_schedule,
)
from humming_aot.heuristics.tiles import (
    MOE_BODIES,
    MOE_MASKED_BODIES,
    MOE_SCALED_BODIES,
    arch_tile_table,
    ctas_per_sm,
    ctas_per_sm_by_registers,
    moe_bodies,
    moe_tile_table,
    narrow_twin,
    offsets_depth_pair,
    offsets_ring_twin,
    select_masked_tile,
    select_tile,
    smem_bytes,
    smem_limit,
    split_ctas_per_sm,
    table_arch_for,
    tile_fits,
    twin_reachable,
)

__all__ = [
    "MOE_BODIES",
    "MOE_MASKED_BODIES",
    "MOE_SCALED_BODIES",
    "STREAM_K_FIXUP_K_TILES",
    "STREAM_K_MIN_RANGE_K_TILES",
    "STREAM_K_MIN_RANGE_ROWS",
    "arch_tile_table",
    "ctas_per_sm",
    "ctas_per_sm_by_registers",
    "moe_bodies",
    "moe_tile_table",
    "narrow_twin",
    "offsets_depth_pair",
    "offsets_ring_twin",
    "partial_wave_stream_k",
    "select_masked_tile",
    "select_tile",
    "smem_bytes",
    "smem_limit",
    "split_ctas_per_sm",
    "split_k_factor",
    "stream_k_ctas",
    "stream_k_fixup_k_tiles",
    "stream_k_min_range_k_tiles",
    "table_arch_for",
    "tail_split_schedule",
    "tile_fits",
    "twin_reachable",
]
