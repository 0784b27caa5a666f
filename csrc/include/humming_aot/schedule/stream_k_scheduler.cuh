#pragma once
// Stream-K: the problem's tiles x k_tiles K-tile iterations (tile-major, tiles in the raster order
// of schedule/tile_scheduler.cuh) cut into gridDim.x near-equal contiguous ranges, one per
// persistent CTA: each takes floor(T / G) iterations, the first T mod G CTAs one more, in CTA
// order. A range is walked as units,
// each one tile's K tiles [k_begin, k_end): at most one unit that starts inside a tile (the
// range's first), then whole tiles, then at most one that ends inside a tile (its last).
//
// Who writes a tile: the CTA whose range holds the tile's first K tile (its "head" unit, k_begin
// == 0); the later CTAs that hold the rest of the tile each hold it as their first unit, publish
// that partial sum in their own workspace slot (slot = CTA index), and never wait for anything,
// so the head's wait for them cannot deadlock as long as every CTA of the grid is resident at
// once (the host sizes the grid to that). Needs gridDim.x <= T (no empty range). SM80+.

#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::schedule {

template <int kBlockM, int kBlockN, int kBlockK>
struct StreamKScheduler {
  static constexpr u32 kGroupM = 8;  // M tiles per raster group

  struct Unit {
    int m_tile, n_tile;
    int tile;            // linear tile index (the tile's counter)
    int k_begin, k_end;  // K tiles [k_begin, k_end) of the tile
  };

  u32 m_tiles, n_tiles, k_tiles, iterations;
  u32 base, longer;  // every CTA takes base iterations, the first `longer` one more
  u32 cursor, end;   // this CTA's iterations still to walk

  // (32-bit divisions only: a 64-bit one is a helper call in the cubin.)
  __device__ __forceinline__ StreamKScheduler(int m, int n, int k) {
    m_tiles = (static_cast<u32>(m) + kBlockM - 1) / kBlockM;
    n_tiles = (static_cast<u32>(n) + kBlockN - 1) / kBlockN;
    k_tiles = static_cast<u32>(k) / kBlockK;
    iterations = m_tiles * n_tiles * k_tiles;
    base = iterations / gridDim.x;
    longer = iterations - base * gridDim.x;
    cursor = first_iteration(blockIdx.x);
    end = first_iteration(blockIdx.x + 1);
  }

  __device__ __forceinline__ u32 first_iteration(u32 cta) const { return cta * base + (cta < longer ? cta : longer); }
  // the CTA whose range holds `iteration`
  __device__ __forceinline__ u32 cta_of(u32 iteration) const {
    const u32 in_longer = longer * (base + 1);
    return iteration < in_longer ? iteration / (base + 1) : longer + (iteration - in_longer) / base;
  }

  // The next unit of this CTA's range; false once the range is walked.
  __device__ __forceinline__ bool next(Unit& unit) {
    if (cursor >= end) return false;
    const u32 tile = cursor / k_tiles, k_begin = cursor - tile * k_tiles;
    const u32 left = end - cursor;
    const u32 k_end = k_tiles - k_begin <= left ? k_tiles : k_begin + left;
    raster_tile<kGroupM>(tile, m_tiles, n_tiles, unit.m_tile, unit.n_tile);
    unit.tile = static_cast<int>(tile);
    unit.k_begin = static_cast<int>(k_begin);
    unit.k_end = static_cast<int>(k_end);
    cursor += k_end - k_begin;
    return true;
  }

  // For a head unit of this CTA: how many later CTAs hold partials of `tile` (in slots
  // blockIdx.x + 1 on); 0 when the unit is the whole tile.
  __device__ __forceinline__ int partials_of(int tile) const {
    return static_cast<int>(cta_of((static_cast<u32>(tile) + 1) * k_tiles - 1) - blockIdx.x);
  }
};

}  // namespace humming_aot::schedule
