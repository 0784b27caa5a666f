#pragma once
// The stream-K fix-up of the tiles whose K range persistent CTAs share
// (schedule/stream_k_scheduler.cuh). Every CTA that holds part of such a tile publishes its fp32
// partial accumulators in a workspace slot of its own and counts itself at the tile's counter,
// without waiting. Once a CTA has computed and published all of its range, it sums one share of
// each tile it took part in: the tile's token blocks (8 tokens each) are split evenly between the
// n CTAs that share it, and CTA j of them waits until all n partials are counted, adds them in CTA
// order (the sum does not depend on timing) over its blocks, and writes those rows (n >= 2). Spreading the
// reads over the n CTAs, rather than one CTA reading every partial while the others' SMs go idle,
// is what keeps the fix-up short (docs/PERFORMANCE.md section 23). The reducers count themselves
// again at the counter; the last one (the counter reaching 2 n) resets it for the next launch.
//
// Accumulators move as 16-byte vectors, thread-interleaved, as in epilogue/fragment_split_k.cuh
// (every warp access one contiguous 512-byte run); vector v of a thread holds token block
// v % kTokenBlocks of its 64-column unit (epilogue/column_major_writer.cuh's WarpgroupFragments).
// Workspace: (slots, kThreads * kAccumulators) fp32. Ordering as in epilogue/split_k_arrival.cuh:
// the barrier orders every thread's stores before thread 0's release; thread 0's acquire, then
// the barrier, orders the reducer's loads after them. SM80+.

#include <humming_aot/kernel/params.cuh>

namespace humming_aot::epilogue {

template <int kThreads,       // threads holding the tile's accumulators (the first kThreads of the CTA)
          int kAccumulators,  // fp32 accumulators per thread, a multiple of 4
          int kTokenBlocks,   // 8-token blocks of the tile: consecutive vectors of a unit
          class Barrier>      // synchronizes exactly those threads
struct StreamKFixup {
  static_assert(kAccumulators % 4 == 0, "accumulators move as 16-byte vectors");
  static constexpr int kVectors = kAccumulators / 4;
  static_assert(kVectors % kTokenBlocks == 0, "every unit holds every token block");
  static constexpr i64 kSlotVectors = static_cast<i64>(kThreads) * kVectors;

  static __device__ __forceinline__ const float4* slot_of(const kernel::GemmParams& p, u32 slot) {
    return reinterpret_cast<const float4*>(p.workspace) + slot * kSlotVectors + threadIdx.x;
  }

  // Store acc in workspace slot `slot`, then count it at the tile's counter.
  static __device__ __forceinline__ void publish(const kernel::GemmParams& p, const float (&acc)[kAccumulators],
                                                 u32 slot, int* counter) {
    float4* mine = reinterpret_cast<float4*>(p.workspace) + slot * kSlotVectors + threadIdx.x;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      __stcg(mine + v * kThreads, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
    }
    Barrier::sync();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
  }

  // Wait until the tile's `sharers` (at least 2) partials are counted, then sum, over sharers
  // 0, 1, ... in that order (their slots: slot_of_sharer(c)), this thread's accumulators of token
  // blocks [block_begin, block_end) and hand each sum to stage(accumulator index, value). A share
  // holds at most half of the blocks; its vectors sit in registers of their own (the tile's
  // accumulators are not needed any more), so that each sharer's loads all go out at once.
  template <class SlotOfSharer, class Stage>
  static __device__ __forceinline__ void sum_share(const kernel::GemmParams& p, int sharers,
                                                   SlotOfSharer slot_of_sharer, int block_begin, int block_end,
                                                   int* counter, Stage stage) {
    constexpr int kUnits = kVectors / kTokenBlocks;
    constexpr int kMaxBlocks = (kTokenBlocks + 1) / 2;
    if (threadIdx.x == 0) {
      int counted;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(counted) : "l"(counter) : "memory");
      } while (counted < sharers);
    }
    Barrier::sync();
    const int blocks = block_end - block_begin;
    float4 sum[kUnits * kMaxBlocks];
#pragma unroll
    for (int k = 0; k < kUnits * kMaxBlocks; ++k) sum[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int c = 0; c < sharers; ++c) {
      const float4* slot = slot_of(p, slot_of_sharer(c));
      float4 x[kUnits * kMaxBlocks];
#pragma unroll
      for (int k = 0; k < kUnits * kMaxBlocks; ++k) {
        const int unit = k / kMaxBlocks, b = k % kMaxBlocks;
        if (b < blocks) x[k] = __ldcg(slot + (unit * kTokenBlocks + block_begin + b) * kThreads);
      }
#pragma unroll
      for (int k = 0; k < kUnits * kMaxBlocks; ++k) {
        if (k % kMaxBlocks < blocks) {
          sum[k].x += x[k].x;
          sum[k].y += x[k].y;
          sum[k].z += x[k].z;
          sum[k].w += x[k].w;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kUnits * kMaxBlocks; ++k) {
      const int unit = k / kMaxBlocks, b = k % kMaxBlocks;
      if (b < blocks) {
        const int index = 4 * (unit * kTokenBlocks + block_begin + b);
        stage(index, sum[k].x);
        stage(index + 1, sum[k].y);
        stage(index + 2, sum[k].z);
        stage(index + 3, sum[k].w);
      }
    }
  }

  // After this CTA's share is summed (every thread's loads of the partials are done once the
  // share is stored): count the reducer; the tile's last reducer resets the counter.
  static __device__ __forceinline__ void done(int sharers, int* counter) {
    if (threadIdx.x == 0) {
      int before;
      asm volatile("atom.add.relaxed.gpu.global.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
      if (before == 2 * sharers - 1) *counter = 0;
    }
  }
};

}  // namespace humming_aot::epilogue
