#pragma once
// The K loop of the wgmma-ss body's consumers for s8 codes (kernel/dense_wgmma_ss.cuh): the
// int32 sums are exact, so every K tile's wgmma add into one set of registers (the first tile's
// first step overwrites it) with no promotion, and the sums become fp32 once, at the end. Up to
// two groups are in flight: K tile t + 1 is issued before K tile t is waited for, and t's slot is
// released then. Contract: `consume` leaves acc with the unit's sums as fp32 (exactly rounded
// from int32) and every slot it took released; the scales are applied by the caller.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/wgmma_ss_ring.cuh>

namespace humming_aot::mainloop {

template <class Ring>  // mainloop::WgmmaSsRing over mma::WgmmaS8<kBlockM>
struct IntegerSums {
  static constexpr int kAccumulators = Ring::kAccumulators;

  // `count` K tiles from the ring's next slot into acc (params, the tile and k_tile0 are the
  // promotion's interface: unused, the scales come after the sums).
  template <class Params>
  static __device__ __forceinline__ void consume(const Params&, int, int, int, int count, u32 smem_base, u32 full0,
                                                 u32 empty0, typename Ring::State& ring, float (&acc)[kAccumulators]) {
    int sums[kAccumulators];
    if (count <= 0) {
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
      return;
    }
    int pending = Ring::template issue<false>(smem_base, full0, ring, sums);
    for (int it = 1; it < count; ++it) {
      // the same registers in both groups: the hardware orders wgmma on one accumulator set,
      // and nothing else touches them until the last wait
      const int slot = Ring::template issue<true>(smem_base, full0, ring, sums);
      mma::wgmma_wait_group<1>();
      Ring::release(empty0, pending);
      pending = slot;
    }
    mma::wgmma_wait_group<0>();
    mma::wgmma_fence_operands(sums);
    Ring::release(empty0, pending);
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = static_cast<float>(sums[i]);
  }
};

}  // namespace humming_aot::mainloop
