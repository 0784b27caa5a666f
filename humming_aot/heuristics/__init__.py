"""Tile selection: per-arch M-interval tables (data in catalog/tiles.toml) and split-K sizing.

Shared by the run time (which tile serves this problem) and the enumerator (which tiles a catalog
compiles). Python branches on arch here and in catalog/ only.
"""
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
    split_k_factor,
    stream_k_ctas,
    table_arch_for,
    tail_split_schedule,
    tile_fits,
    twin_reachable,
)

__all__ = [
    "MOE_BODIES",
    "MOE_MASKED_BODIES",
    "MOE_SCALED_BODIES",
    "arch_tile_table",
    "ctas_per_sm",
    "ctas_per_sm_by_registers",
    "moe_bodies",
    "moe_tile_table",
    "narrow_twin",
    "offsets_depth_pair",
    "offsets_ring_twin",
    "select_masked_tile",
    "select_tile",
    "smem_bytes",
    "smem_limit",
    "split_ctas_per_sm",
    "split_k_factor",
    "stream_k_ctas",
    "table_arch_for",
    "tail_split_schedule",
    "tile_fits",
    "twin_reachable",
]
