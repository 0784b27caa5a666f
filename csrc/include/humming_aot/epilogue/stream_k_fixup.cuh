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
#include <humming_aot/memory/cp_async.cuh>

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

  // The partials' path through shared memory: items of kChunkVectors vectors of one slot per
  // thread, kBuffers of them in kScratchBytes. The chunk is the one of 4, 2 or 1 vectors (a divisor
  // of the thread's vectors) that keeps the most bytes in flight (kBuffers - 1 items, at most 15).
  template <int kScratchBytes, int kChunkVectors>
  struct Staging {
    static constexpr int kItemBytes = kThreads * kChunkVectors * 16;
    static constexpr int kFit = kScratchBytes / kItemBytes;
    static constexpr int kBuffers = kFit < 16 ? kFit : 16;
    static constexpr int kInFlightBytes =
        Vectors::kVectors % kChunkVectors == 0 && kBuffers >= 2 ? (kBuffers - 1) * kItemBytes : 0;
  };
  template <int kScratchBytes>
  static constexpr int chunk_vectors() {
    constexpr int b4 = Staging<kScratchBytes, 4>::kInFlightBytes, b2 = Staging<kScratchBytes, 2>::kInFlightBytes,
                  b1 = Staging<kScratchBytes, 1>::kInFlightBytes;
    return b4 >= b2 && b4 >= b1 ? 4 : b2 >= b1 ? 2 : 1;
  }
  // Loads straight into registers keep at most one slot in flight per thread, and in practice
  // fewer (the registers beside the accumulators): taken as 8 vectors.
  static constexpr int kDirectInFlightBytes = kThreads * 16 * (Vectors::kVectors < 8 ? Vectors::kVectors : 8);

  // Wait until `partials` partials have counted themselves at the tile's counter, then add slots
  // first_slot, first_slot + 1, ... to acc in that order (per accumulator, slot after slot).
  // `scratch`: kScratchBytes of shared memory free once every consumer thread has reached this call
  // (the caller's next barrier orders its own reuse after it). Where it holds more bytes in flight
  // than loads into registers would, the partials stream through it: each thread copies its own
  // vectors with cp.async, kBuffers - 1 items ahead of its adds, so that the head's read is bound
  // by bandwidth rather than by one L2 round trip per slot (docs/performance/log.md section 40).
  template <int kScratchBytes>
  static __device__ __forceinline__ void accumulate(const kernel::GemmParams& p, float (&acc)[kAccumulators],
                                                    int first_slot, int partials, int* counter, u32 scratch) {
    if (threadIdx.x == 0) {
      int counted;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(counted) : "l"(counter) : "memory");
      } while (counted < partials);
      *counter = 0;  // every partial of the tile has counted itself: ready for the next launch
    }
    Barrier::sync();
    constexpr int kChunkVectors = chunk_vectors<kScratchBytes>();
    using Stage = Staging<kScratchBytes, kChunkVectors>;
    if constexpr (Stage::kInFlightBytes <= kDirectInFlightBytes) {
      for (int s = 0; s < partials; ++s) Vectors::add(acc, slot_of(p, first_slot + s));
    } else {
      add_staged<kChunkVectors, Stage::kItemBytes, Stage::kBuffers>(p, acc, first_slot, partials, scratch);
    }
  }

  template <int kChunkVectors, int kItemBytes, int kBuffers>
  static __device__ __forceinline__ void add_staged(const kernel::GemmParams& p, float (&acc)[kAccumulators],
                                                    int first_slot, int partials, u32 scratch) {
    constexpr int kChunks = Vectors::kVectors / kChunkVectors;
    const float4* src0 = slot_of(p, first_slot);
    const u32 dst0 = scratch + threadIdx.x * 16;
    // the next item to copy: chunk c of slot s, chunk-major (the adds below see a chunk's slots in
    // order, and index the accumulators by a compile-time chunk)
    int copy_chunk = 0, copy_slot = 0;
    auto copy_next = [&](int buffer) {
      if (copy_chunk < kChunks) {
        const float4* src = src0 + copy_slot * kSlotVectors + copy_chunk * kChunkVectors * kThreads;
        const u32 dst = dst0 + buffer * kItemBytes;
#pragma unroll
        for (int v = 0; v < kChunkVectors; ++v) memory::cp_async_16(dst + v * kThreads * 16, src + v * kThreads, true);
        if (++copy_slot == partials) {
          copy_slot = 0;
          ++copy_chunk;
        }
      }
      memory::cp_async_commit();  // empty groups past the last item keep the count of groups exact
    };
#pragma unroll
    for (int b = 0; b < kBuffers - 1; ++b) copy_next(b);
    int buffer = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      for (int s = 0; s < partials; ++s) {
        // committed: kBuffers - 1 groups, then one per item added so far; this item's is complete
        memory::cp_async_wait<kBuffers - 2>();
        const u32 item = dst0 + buffer * kItemBytes;
#pragma unroll
        for (int v = 0; v < kChunkVectors; ++v) {
          float x, y, z, w;
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(x), "=f"(y), "=f"(z), "=f"(w)
                       : "r"(item + v * kThreads * 16));
          float* a = acc + 4 * (c * kChunkVectors + v);
          a[0] += x;
          a[1] += y;
          a[2] += z;
          a[3] += w;
        }
        // refill the buffer added in the previous step, whose loads were done then: a buffer's
        // loads and its next copy are never in the same step
        copy_next(buffer == 0 ? kBuffers - 1 : buffer - 1);
        buffer = buffer + 1 == kBuffers ? 0 : buffer + 1;
      }
    }
    memory::cp_async_wait<0>();
  }
};

}  // namespace humming_aot::epilogue
