#pragma once
// The stream-K fix-up of a tile whose K range is split between persistent CTAs
// (schedule/stream_k_scheduler.cuh): each CTA holding a later part of the tile publishes its fp32
// partial accumulators in its own workspace slot and counts itself at the tile's counter; the
// tile's head CTA waits until every partial is counted, adds them to its own accumulators in
// slot order (its own first: the sum does not depend on timing) and resets the counter for the
// next launch. Accumulators move as 16-byte vectors, thread-interleaved
// (epilogue/fragment_vectors.cuh, as in epilogue/fragment_split_k.cuh).
//
// Workspace: (gridDim.x, kThreads * kAccumulators) fp32, one slot per CTA (a CTA publishes at most
// one partial per launch: the unit its range starts inside). Counters: one per tile, zero between
// launches. Ordering as in epilogue/split_k_arrival.cuh: the barrier orders every thread's stores
// before thread 0's release; thread 0's acquire, then the barrier, orders the head's loads after
// them. SM80+.

#include <humming_aot/epilogue/fragment_vectors.cuh>
#include <humming_aot/kernel/params.cuh>

namespace humming_aot::epilogue {

template <int kThreads,       // threads holding the tile's accumulators (the first kThreads of the CTA)
          int kAccumulators,  // fp32 accumulators per thread, a multiple of 4
          class Barrier>      // synchronizes exactly those threads
struct StreamKFixup {
  using Vectors = FragmentVectors<kThreads, kAccumulators>;
  static constexpr i64 kSlotVectors = static_cast<i64>(kThreads) * Vectors::kVectors;

  static __device__ __forceinline__ float4* slot_of(const kernel::GemmParams& p, int slot) {
    return reinterpret_cast<float4*>(p.workspace) + slot * kSlotVectors + threadIdx.x;
  }

  // Store acc in workspace slot `slot`, then count it at the tile's counter.
  static __device__ __forceinline__ void publish(const kernel::GemmParams& p, const float (&acc)[kAccumulators],
                                                 int slot, int* counter) {
    Vectors::store(slot_of(p, slot), acc);
    Barrier::sync();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
  }

  // Wait until `partials` partials have counted themselves at the tile's counter, then add slots
  // first_slot, first_slot + 1, ... to acc in that order.
  static __device__ __forceinline__ void accumulate(const kernel::GemmParams& p, float (&acc)[kAccumulators],
                                                    int first_slot, int partials, int* counter) {
    if (threadIdx.x == 0) {
      int counted;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(counted) : "l"(counter) : "memory");
      } while (counted < partials);
      *counter = 0;  // every partial of the tile has counted itself: ready for the next launch
    }
    Barrier::sync();
    for (int s = 0; s < partials; ++s) Vectors::add(acc, slot_of(p, first_slot + s));
  }
};

}  // namespace humming_aot::epilogue
