#pragma once
// Warpgroup roles of a warp-specialized CTA (SM90): register reallocation between the producer
// warpgroup and the consumer warpgroups, and named barriers that only some warps take part in.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::ptx {

// Every warp of the warpgroup must execute the same setmaxnreg (.sync.aligned). kRegisters: a
// multiple of 8 in [24, 256].
template <int kRegisters>
__device__ __forceinline__ void warpgroup_release_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void warpgroup_claim_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// A CTA barrier of the whole block (barrier 0): the default of components that take a barrier.
struct CtaBarrier {
  static __device__ __forceinline__ void sync() { __syncthreads(); }
};

// Named barrier kId (1..15) over the first kThreads threads (whole warps) of the CTA.
template <int kThreads, int kId>
struct NamedBarrier {
  static_assert(kThreads % 32 == 0 && kId >= 1 && kId < 16, "whole warps, barrier ids 1..15");
  static __device__ __forceinline__ void sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
  }
};

}  // namespace humming_aot::ptx
