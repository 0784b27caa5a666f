#pragma once
// The arrival counter of the deterministic split-K reduction: every K slice of an output tile
// stores its fp32 partial, then arrives; the CTA that arrives last sums the partials. SM80+.
//
// Ordering without full fences: the CTA barrier orders every thread's partial stores before
// thread 0's arrival, an atomic with release semantics at GPU scope (cumulative, so it publishes
// the whole CTA's stores); its acquire side lets the last CTA's thread 0, and after the second
// barrier every thread of that CTA, see the other slices' partials.

#include <humming_aot/numerics/types.cuh>
#include <humming_aot/ptx/warpgroup.cuh>

namespace humming_aot::epilogue {

// Called by every thread of the CTA (of Barrier: the threads that hold the tile's partials) after
// its partial stores; true in every such thread of the CTA that arrived last (which must reset
// the counter once it is done with the partials).
template <class Barrier = ptx::CtaBarrier>
__device__ __forceinline__ bool arrive_last_at_tile(int* counter, int k_splits, int* flag_smem) {
  Barrier::sync();
  if (threadIdx.x == 0) {
    int arrived;
    asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;\n" : "=r"(arrived) : "l"(counter) : "memory");
    *flag_smem = arrived == k_splits - 1;
  }
  Barrier::sync();
  return *flag_smem != 0;
}

}  // namespace humming_aot::epilogue
