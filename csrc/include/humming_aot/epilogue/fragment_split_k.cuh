#pragma once
// Deterministic split-K reduction in accumulator-fragment order, for epilogues whose threads hold
// many accumulators (the warp-specialized wgmma body: up to 128 per thread in 128 threads). Each
// K slice stores its fp32 accumulators as 16-byte vectors, thread-interleaved, so that every warp
// store and load is one contiguous 512-byte run; the CTA that arrives last at the tile's counter
// sums the slices in order 0..k_splits-1 (the result does not depend on arrival order) and resets
// the counter. Where it differs from epilogue/column_major_writer.cuh's reduction, which stores
// the partial tile in output order: 4x fewer memory instructions, and no scattered 32-byte
// segments, which made the reducing CTA's loads latency-bound (docs/performance/log.md section 21).
//
// Workspace: (split tiles, splits, kThreads * kAccumulators) fp32; within a slice, float v of
// thread t is at (v / 4 * kThreads + t) * 4 + v % 4. Counters: one per split tile. SM80+.

#include <humming_aot/epilogue/fragment_vectors.cuh>
#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/kernel/params.cuh>

namespace humming_aot::epilogue {

template <int kThreads,       // threads holding the tile's accumulators (the first kThreads of the CTA)
          int kAccumulators,  // fp32 accumulators per thread, a multiple of 4
          class Barrier>      // synchronizes exactly those threads
struct FragmentSplitK {
  using Vectors = FragmentVectors<kThreads, kAccumulators>;
  static constexpr i64 kSliceFloats = Vectors::kSlotFloats;

  // Store K slice `slice` (of `splits`) of split tile `index`, arrive; true in the threads of the
  // CTA that arrived last, whose acc then holds the sum of every slice.
  static __device__ __forceinline__ bool reduce(const kernel::GemmParams& p, float (&acc)[kAccumulators], int index,
                                                int slice, int splits, int* arrival_flag) {
    float4* tile = reinterpret_cast<float4*>(p.workspace + static_cast<i64>(index) * splits * kSliceFloats);
    Vectors::store(tile + slice * (kSliceFloats / 4) + threadIdx.x, acc);
    if (!arrive_last_at_tile<Barrier>(p.tile_counters + index, splits, arrival_flag)) return false;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    for (int s = 0; s < splits; ++s) Vectors::add(acc, tile + s * (kSliceFloats / 4) + threadIdx.x);
    if (threadIdx.x == 0) p.tile_counters[index] = 0;  // ready for the next launch
    return true;
  }
};

}  // namespace humming_aot::epilogue
