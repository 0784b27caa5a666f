#pragma once
// fp32 accumulators moved through global memory as 16-byte vectors, thread-interleaved: float v
// of thread t of a slot lives at (v / 4 * kThreads + t) * 4 + v % 4, so every warp access is one
// contiguous 512-byte run. The layout both deterministic K reductions of the wgmma-ws body share
// (epilogue/fragment_split_k.cuh, epilogue/stream_k_fixup.cuh). SM80+ (L2-only .cg accesses).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::epilogue {

template <int kThreads,       // threads of the slot (the first kThreads of the CTA)
          int kAccumulators>  // fp32 accumulators per thread, a multiple of 4
struct FragmentVectors {
  static_assert(kAccumulators % 4 == 0, "accumulators move as 16-byte vectors");
  static constexpr int kVectors = kAccumulators / 4;
  static constexpr i64 kSlotFloats = static_cast<i64>(kThreads) * kAccumulators;

  // Store acc at dst, this thread's first vector of a slot (slot start + threadIdx.x vectors).
  static __device__ __forceinline__ void store(float4* dst, const float (&acc)[kAccumulators]) {
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      __stcg(dst + v * kThreads, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
    }
  }

  // acc += the vectors at src, this thread's first vector of a slot.
  static __device__ __forceinline__ void add(float (&acc)[kAccumulators], const float4* src) {
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const float4 x = __ldcg(src + v * kThreads);
      acc[4 * v] += x.x;
      acc[4 * v + 1] += x.y;
      acc[4 * v + 2] += x.z;
      acc[4 * v + 3] += x.w;
    }
  }
};

}  // namespace humming_aot::epilogue
