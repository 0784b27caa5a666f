#pragma once
// Which output tile and which K slice a CTA computes, when only the last, partial wave of tiles is
// split along K: the first dp_ctas CTAs (whole waves of resident CTAs) take one tile each over all
// of K; every tile after them is split into tail_splits K slices, one CTA each, so that the last
// wave is filled instead of leaving SMs idle (with dp_ctas = 0 this is plain split-K of every
// tile). gridDim.x = dp_ctas + (tiles - dp_ctas) * tail_splits, gridDim.y = 1. Tiles are in the
// raster order of schedule/tile_scheduler.cuh; the split tiles are numbered from 0 for the
// split-K workspace and counters (split_index). SM80+.

#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::schedule {

template <int kBlockM, int kBlockN, int kBlockK>
struct TailSplitScheduler {
  static constexpr u32 kGroupM = 8;  // M tiles per raster group

  int m_tile, n_tile;
  int split_index;               // this tile among the split tiles (valid when splits > 1)
  int slice, splits;             // this CTA's K slice of `splits` (1: the whole of K)
  int k_tile_begin, k_tile_end;  // this CTA's K tiles [begin, end)

  // `cta`: this CTA's place in the schedule (blockIdx.x, unless persistent CTAs walk the whole
  // tiles: schedule/work_units.cuh)
  __device__ __forceinline__ TailSplitScheduler(int m, int n, int k, int dp_ctas, int tail_splits,
                                                u32 cta = blockIdx.x) {
    const u32 m_tiles = (static_cast<u32>(m) + kBlockM - 1) / kBlockM;
    const u32 n_tiles = (static_cast<u32>(n) + kBlockN - 1) / kBlockN;
    const u32 dp = static_cast<u32>(dp_ctas);
    u32 tile;
    if (cta < dp) {
      tile = cta;
      split_index = 0;
      slice = 0;
      splits = 1;
    } else {
      const u32 rest = cta - dp, per = static_cast<u32>(tail_splits);
      split_index = static_cast<int>(rest / per);
      slice = static_cast<int>(rest - static_cast<u32>(split_index) * per);
      splits = tail_splits;
      tile = dp + static_cast<u32>(split_index);
    }
    raster_tile<kGroupM>(tile, m_tiles, n_tiles, m_tile, n_tile);
    const u32 k_tiles = static_cast<u32>(k) / kBlockK;
    const u32 per_slice = (k_tiles + static_cast<u32>(splits) - 1) / static_cast<u32>(splits);
    const u32 begin = static_cast<u32>(slice) * per_slice;
    k_tile_begin = static_cast<int>(begin < k_tiles ? begin : k_tiles);
    k_tile_end = static_cast<int>(begin + per_slice < k_tiles ? begin + per_slice : k_tiles);
  }
};

}  // namespace humming_aot::schedule
