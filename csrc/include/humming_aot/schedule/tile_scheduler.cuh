#pragma once
// Which output tile and which K slice a CTA computes. One CTA per (tile, K slice): gridDim.x
// enumerates output tiles (or a persistent schedule names the tile), grouped along M so that CTAs running together share activation rows
// and weight columns in L2; gridDim.y enumerates split-K slices. SM80+.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::schedule {

// Output tile (m_tile, n_tile) of linear tile index `tile` in raster order: groups of kGroupM rows
// of M tiles, column by column inside a group, so that CTAs running together share activation
// rows and weight columns in L2.
template <u32 kGroupM>
__device__ __forceinline__ void raster_tile(u32 tile, u32 m_tiles, u32 n_tiles, int& m_tile, int& n_tile) {
  if (m_tiles == 1) {  // small M: one row of tiles, no raster groups to find
    m_tile = 0;
    n_tile = static_cast<int>(tile);
  } else {
    const u32 group_size = kGroupM * n_tiles;
    const u32 first_m = (tile / group_size) * kGroupM;
    const u32 rows_left = m_tiles - first_m;  // (explicit: min() of unsigned differs between nvcc and NVRTC)
    const u32 group_rows = rows_left < kGroupM ? rows_left : kGroupM;
    const u32 in_group = tile % group_size;
    m_tile = static_cast<int>(first_m + in_group % group_rows);
    n_tile = static_cast<int>(in_group / group_rows);
  }
}

template <int kBlockM, int kBlockN, int kBlockK>
struct TileScheduler {
  static constexpr int kGroupM = 8;  // M tiles per raster group

  int m_tile, n_tile, tile_index;  // tile_index = m_tile * n_tiles + n_tile (split-K counter slot)
  int k_tile_begin, k_tile_end;    // this CTA's K tiles [begin, end)

  // Unsigned arithmetic throughout: every value is non-negative, and signed division by the
  // tile constants would cost sign fix-ups in every thread of every CTA.
  __device__ __forceinline__ TileScheduler(int m, int n, int k, int k_splits) {
    const u32 m_tiles = (static_cast<u32>(m) + kBlockM - 1) / kBlockM;
    const u32 n_tiles = (static_cast<u32>(n) + kBlockN - 1) / kBlockN;
    raster_tile<kGroupM>(blockIdx.x, m_tiles, n_tiles, m_tile, n_tile);
    tile_index = m_tile * static_cast<int>(n_tiles) + n_tile;
    set_k_slice(k, k_splits);
  }

  // The tile of linear index `tile` in the raster instead of blockIdx.x's (a persistent schedule
  // walking several tiles per CTA: kernel/grouped_masked.cuh).
  __device__ __forceinline__ TileScheduler(int m, int n, int k, int k_splits, u32 tile) {
    const u32 m_tiles = (static_cast<u32>(m) + kBlockM - 1) / kBlockM;
    const u32 n_tiles = (static_cast<u32>(n) + kBlockN - 1) / kBlockN;
    raster_tile<kGroupM>(tile, m_tiles, n_tiles, m_tile, n_tile);
    tile_index = m_tile * static_cast<int>(n_tiles) + n_tile;
    set_k_slice(k, k_splits);
  }

 private:
  __device__ __forceinline__ void set_k_slice(int k, int k_splits) {
    const u32 k_tiles = static_cast<u32>(k) / kBlockK;
    const u32 splits = static_cast<u32>(k_splits);
    const u32 per_split = splits == 1 ? k_tiles : (k_tiles + splits - 1) / splits;
    const u32 begin = blockIdx.y * per_split;
    k_tile_begin = static_cast<int>(begin);
    k_tile_end = static_cast<int>(begin + per_split < k_tiles ? begin + per_split : k_tiles);
  }
};

}  // namespace humming_aot::schedule
