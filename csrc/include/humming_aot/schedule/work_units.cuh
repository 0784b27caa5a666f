#pragma once
// The units of one CTA's work for the warp-specialized TMA bodies (kernel/dense_wgmma_ws.cuh,
// kernel/dense_wgmma_ss.cuh): each unit is one output tile's K tiles [k_begin, k_end), either a
// stream-K range of the problem's K-tile iterations (schedule/stream_k_scheduler.cuh) or the one
// tile (or K slice of a split tile) of the tail split (schedule/tail_split_scheduler.cuh). One
// walk for both schedules keeps one copy of a body's producer and consumer loops in the kernel.
// Producer and consumers each build their own and walk it in the same order.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/stream_k_scheduler.cuh>
#include <humming_aot/schedule/tail_split_scheduler.cuh>

namespace humming_aot::schedule {

template <int kBlockM, int kBlockN, int kBlockK>
struct WorkUnits {
  using StreamK = StreamKScheduler<kBlockM, kBlockN, kBlockK>;
  using TailSplit = TailSplitScheduler<kBlockM, kBlockN, kBlockK>;

  StreamK range;
  typename StreamK::Unit single;   // the tail split's unit
  int split_index, slice, splits;  // the tail split's K slicing (splits == 1: whole tiles)
  bool stream_k, single_left;

  __device__ __forceinline__ explicit WorkUnits(const kernel::TmaGemmParams& params)
      : range(params.gemm.m, params.gemm.n, params.gemm.k), stream_k(params.stream_k != 0), single_left(false) {
    if (!stream_k) {
      const TailSplit tile(params.gemm.m, params.gemm.n, params.gemm.k, params.dp_ctas, params.tail_splits);
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
    if (!single_left) return false;
    unit = single;
    single_left = false;
    return true;
  }
};

}  // namespace humming_aot::schedule
