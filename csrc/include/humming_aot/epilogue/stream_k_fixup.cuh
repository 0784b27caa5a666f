#pragma once
// The stream-K fix-up of a tile whose K range is split between persistent CTAs
// (schedule/stream_k_scheduler.cuh): each CTA holding a later part of the tile publishes its
// partial accumulators in its own workspace slot and counts itself at the tile's counter; the
// tile's head CTA waits until every partial is counted, adds them to its own accumulators in
// slot order (its own first: the sum does not depend on timing) and resets the counter for the
// next launch.
//
// Workspace: gridDim.x slots, one per CTA (a CTA publishes at most one partial per launch: the
// unit its range starts inside), of what the Slots policy stores: FloatSlots, fp32 as 16-byte
// thread-interleaved vectors (epilogue/fragment_vectors.cuh, as in epilogue/fragment_split_k.cuh),
// kThreads * kAccumulators * 4 bytes; or HalfSlotVectors (epilogue/half_slot_vectors.cuh), scaled
// fp16 in about half of that. Counters: one per tile, zero between launches. Ordering as in
// epilogue/split_k_arrival.cuh: the barrier orders every thread's stores before thread 0's
// release; thread 0's acquire, then the barrier, orders the head's loads after them. SM80+.

#include <humming_aot/epilogue/fragment_vectors.cuh>
#include <humming_aot/epilogue/half_slot_vectors.cuh>
#include <humming_aot/kernel/params.cuh>

namespace humming_aot::epilogue {

// Slots of fp32 accumulators, as epilogue/fragment_vectors.cuh moves them.
template <int kThreads, int kAccumulators>
struct FloatSlots {
  using Vectors = FragmentVectors<kThreads, kAccumulators>;
  static constexpr i64 kSlotVectors = static_cast<i64>(kThreads) * Vectors::kVectors;
  static __device__ __forceinline__ float4* at(void* workspace, int slot) {
    return reinterpret_cast<float4*>(workspace) + slot * kSlotVectors + threadIdx.x;
  }
  static __device__ __forceinline__ void store(void* workspace, int slot, const float (&acc)[kAccumulators]) {
    Vectors::store(at(workspace, slot), acc);
  }
  static __device__ __forceinline__ void add(float (&acc)[kAccumulators], void* workspace, int slot) {
    Vectors::add(acc, at(workspace, slot));
  }
};

// Scaled fp16 slots (half the bytes) for a bfloat16 output whose accumulators come in eights: a
// partial's values round by at most 2^-11 of its thread's largest value, a bfloat16 output by up
// to 2^-8 of its own (partials that cancel can make the first comparable to the second: log
// section 82's bench error rose from about 3e-3 to 6e-3 on some layers); a float16 output rounds
// at 2^-11 itself and keeps fp32 slots.
template <int kThreads, int kAccumulators, bool kBFloat16Out, bool = kBFloat16Out && kAccumulators % 8 == 0>
struct CompactSlots {
  using Type = FloatSlots<kThreads, kAccumulators>;
};
template <int kThreads, int kAccumulators, bool kBFloat16Out>
struct CompactSlots<kThreads, kAccumulators, kBFloat16Out, true> {
  using Type = HalfSlotVectors<kThreads, kAccumulators>;
};

template <int kThreads,       // threads holding the tile's accumulators (the first kThreads of the CTA)
          int kAccumulators,  // fp32 accumulators per thread, a multiple of 4
          class Barrier,      // synchronizes exactly those threads
          class Slots = FloatSlots<kThreads, kAccumulators>>  // what a workspace slot holds
struct StreamKFixup {
  // Store acc in workspace slot `slot`, then count it at the tile's counter.
  static __device__ __forceinline__ void publish(const kernel::GemmParams& p, const float (&acc)[kAccumulators],
                                                 int slot, int* counter) {
    Slots::store(p.workspace, slot, acc);
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
    for (int s = 0; s < partials; ++s) Slots::add(acc, p.workspace, first_slot + s);
  }
};

}  // namespace humming_aot::epilogue
