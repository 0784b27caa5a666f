#pragma once
// The units of one CTA's work for the warp-specialized TMA bodies (kernel/dense_wgmma_ws.cuh,
// kernel/dense_wgmma_ss.cuh): each unit is one output tile's K tiles [k_begin, k_end), either a
// stream-K range of the problem's K-tile iterations (schedule/stream_k_scheduler.cuh) or the one
// tile (or K slice of a split tile) of the tail split (schedule/tail_split_scheduler.cuh). One
// walk for both schedules keeps one copy of a body's producer and consumer loops in the kernel.
// Producer and consumers each build their own and walk it in the same order.
//
// kPersistentTiles (the W8A8 body): a launch of fewer CTAs than the tail split's dp_ctas whole
// tiles has P = gridDim.x - (tiles - dp_ctas) x tail_splits persistent CTAs, CTA c < P walking
// the whole tiles c, c + P, c + 2P, ... < dp_ctas (in raster order, so the tiles in flight at once
// are neighbours), and the CTAs from P on taking the split tail's slices, as CTAs dp_ctas, ... of
// the tail split would. With P = dp_ctas it is the tail split. The host keeps P at most the CTAs
// resident at once: the split tail's CTAs start as walkers finish (its K slices meet through the
// split-K workspace, where the last to arrive sums: nothing waits for a CTA not yet resident).

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/stream_k_scheduler.cuh>
#include <humming_aot/schedule/tail_split_scheduler.cuh>

namespace humming_aot::schedule {

template <int kBlockM, int kBlockN, int kBlockK, bool kPersistentTiles = false>
struct WorkUnits {
  using StreamK = StreamKScheduler<kBlockM, kBlockN, kBlockK>;
  using TailSplit = TailSplitScheduler<kBlockM, kBlockN, kBlockK>;

  StreamK range;
  typename StreamK::Unit single;   // the tail split's unit
  int split_index, slice, splits;  // the tail split's K slicing (splits == 1: whole tiles)
  bool stream_k, single_left;
  u32 walk_tile = 0, walk_step = 0, walk_end = 0;  // kPersistentTiles: the whole tiles still to walk

  __device__ __forceinline__ explicit WorkUnits(const kernel::TmaGemmParams& params)
      : range(params.gemm.m, params.gemm.n, params.gemm.k), stream_k(params.stream_k != 0), single_left(false) {
    if (!stream_k) {
      u32 cta = blockIdx.x;
      if constexpr (kPersistentTiles) {
        const u32 dp = static_cast<u32>(params.dp_ctas);
        const u32 persistent = gridDim.x - (range.m_tiles * range.n_tiles - dp) * static_cast<u32>(params.tail_splits);
        if (cta < persistent) {
          walk_tile = cta;
          walk_step = persistent;
          walk_end = dp;
        } else {
          cta += dp - persistent;  // the tail split's CTA of this slice
        }
      }
      const TailSplit tile(params.gemm.m, params.gemm.n, params.gemm.k, params.dp_ctas, params.tail_splits, cta);
      single.m_tile = tile.m_tile;
      single.n_tile = tile.n_tile;
      single.tile = tile.split_index;
      single.k_begin = tile.k_tile_begin;
      single.k_end = tile.k_tile_end;
      split_index = tile.split_index;
      slice = tile.slice;
      splits = tile.splits;
      single_left = true;
    }
  }

  __device__ __forceinline__ bool next(typename StreamK::Unit& unit) {
    if (stream_k) return range.next(unit);
    if (single_left) {
      unit = single;
      single_left = false;
      return true;
    }
    if constexpr (kPersistentTiles) {
      walk_tile += walk_step;
      if (walk_step != 0 && walk_tile < walk_end) {
        raster_tile<StreamK::kGroupM>(walk_tile, range.m_tiles, range.n_tiles, unit.m_tile, unit.n_tile);
        unit.tile = static_cast<int>(walk_tile);
        unit.k_begin = 0;
        unit.k_end = static_cast<int>(range.k_tiles);
        return true;
      }
    }
    return false;
  }
};

}  // namespace humming_aot::schedule
