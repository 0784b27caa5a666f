#pragma once
// Which output tile and which K slice a CTA computes. One CTA per (tile, K slice): gridDim.x
// enumerates output tiles, grouped along M so that CTAs running together share activation rows
// and weight columns in L2; gridDim.y enumerates split-K slices. SM80+.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::schedule {

template <int kBlockM, int kBlockN, int kBlockK>
struct TileScheduler {
  static constexpr int kGroupM = 8;  // M tiles per raster group

  int m_tile, n_tile, tile_index;  // tile_index = m_tile * n_tiles + n_tile (split-K counter slot)
  int k_tile_begin, k_tile_end;    // this CTA's K tiles [begin, end)

  __device__ __forceinline__ TileScheduler(int m, int n, int k, int k_splits) {
    const int m_tiles = (m + kBlockM - 1) / kBlockM;
    const int n_tiles = (n + kBlockN - 1) / kBlockN;
    const int tile = blockIdx.x;
    const int group_size = kGroupM * n_tiles;
    const int first_m = (tile / group_size) * kGroupM;
    const int group_rows = min(m_tiles - first_m, kGroupM);
    const int in_group = tile % group_size;
    m_tile = first_m + in_group % group_rows;
    n_tile = in_group / group_rows;
    tile_index = m_tile * n_tiles + n_tile;
    const int k_tiles = k / kBlockK;
    const int per_split = (k_tiles + k_splits - 1) / k_splits;
    k_tile_begin = blockIdx.y * per_split;
    k_tile_end = min(k_tiles, k_tile_begin + per_split);
  }
};

}  // namespace humming_aot::schedule
