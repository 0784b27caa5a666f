#pragma once
// Shared-memory mbarriers (SM90): the full / empty handshake of a warp-specialized pipeline, in
// which a producer thread's bulk copies complete a transaction count on the stage's "full"
// barrier and the consumer warps arrive on its "empty" barrier once they are done reading it.
// A barrier's phase flips when its pending arrivals and transaction bytes both reach zero;
// waiters name the parity of the phase they wait for (0 for the first completion, then 1, ...).
// All addresses are 32-bit shared-memory addresses of 8-byte aligned u64 slots.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::ptx {

// Set up a barrier that completes a phase after `arrivals` arrivals (and every byte it was told
// to expect). One thread initializes; fence_barrier_init() and a CTA barrier publish it.
__device__ __forceinline__ void mbarrier_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Make initialized barriers visible to the async proxy (the bulk copies that complete on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more transaction bytes for the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// One plain arrival (release semantics: this thread's earlier shared-memory reads are done).
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Spin until the phase of parity `parity` has completed (acquire: the bytes it counted, and the
// reads of whoever arrived, are then visible / done).
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace humming_aot::ptx
