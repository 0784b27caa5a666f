#pragma once
// The K loop of the portable mma.sync bodies with 8- and 4-bit codes (kernel/dense_mma_ss.cuh,
// dense_mma_w4a8.cuh, dense_mma_fp4.cuh): one ring of kStages cp.async stages of kStageBytes
// shared by the whole CTA. The first kStages - 1 K tiles are issued up front; then, per K tile, the
// CTA waits for it (every thread's copies of it, then a barrier), issues the copies of the tile
// kStages - 1 ahead into the slot the barrier freed, and hands the tile to the body. One commit
// group per K tile, empty ones too (past the slice's end), keeps the wait counts uniform; nothing
// is left in flight at the end. SM80+ (cp.async).
//
// load(slot, index): the calling thread's copies of the slice's K tile `index` (0-based) into the
// stage at smem_base + slot * kStageBytes. consume(index): every thread's use of K tile `index`,
// at shared address stage(smem_base, index); it must be done with the stage when it returns (the
// next iteration's barrier is what lets a later load overwrite it). (The consumer works the
// address out itself, where it needs it: passed in, it changed ptxas's register allocation of
// the mma-ss block-scale keys, whose SASS this component was to keep.)

#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/numerics/types.cuh>

namespace humming_aot::mainloop {

template <int kStages,      // slots of the ring (K tiles in flight or held)
          int kStageBytes>  // a slot's bytes
struct CpAsyncRing {
  static_assert(kStages >= 2, "a ring of at least two K tiles");

  // The shared address of K tile `index`'s stage.
  static __device__ __forceinline__ u32 stage(u32 smem_base, int index) {
    return smem_base + static_cast<u32>((index % kStages) * kStageBytes);
  }

  // The `count` K tiles of the CTA's slice (count may be 0: nothing is loaded or consumed).
  template <class Load, class Consume>
  static __device__ __forceinline__ void run(u32 smem_base, int count, Load&& load, Consume&& consume) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) load(s, s);
      memory::cp_async_commit();
    }
    for (int it = 0; it < count; ++it) {
      memory::cp_async_wait<kStages - 2>();
      __syncthreads();  // K tile `it` is in; every warp is done with the slot the next load takes
      const int next = it + kStages - 1;
      if (next < count) load(next % kStages, next);
      memory::cp_async_commit();
      consume(it);
    }
    memory::cp_async_wait<0>();
  }
};

}  // namespace humming_aot::mainloop
