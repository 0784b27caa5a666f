#pragma once
// fp32 accumulators moved through a global workspace slot in half the bytes: each thread's values
// times one power of two (its scale), rounded to fp16, as 16-byte vectors of eight halves,
// thread-interleaved (vector v of thread t at v * kThreads + t, so every warp access is one
// contiguous 512-byte run), then one word a thread holding the scale's exponent field. The scale
// puts the thread's largest finite magnitude in [2^14, 2^15): every value within 2^28 of it keeps
// fp16's 11 significant bits (rounded to at most 2^-11 of the thread's largest value, against a
// bfloat16 output's 2^-8 of its own), Inf and NaN pass as themselves, and the bits are a function
// of the values alone (deterministic). One edge is not kept: a finite value within 2^-12 of
// 2^128 (a thread whose largest exponent is float's last) rounds to 2^15 in fp16 and comes back
// as Inf, where a bfloat16 output overflows anyway unless other parts cancel it. For the
// stream-K fix-up, whose cost below one wave is its partials' bytes through L2 (docs/design.md).
// SM80+ (L2-only .cg accesses).

#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/numerics/types.cuh>

namespace humming_aot::epilogue {

template <int kThreads,       // threads of the slot (the first kThreads of the CTA)
          int kAccumulators>  // fp32 accumulators per thread, a multiple of 8
struct HalfSlotVectors {
  using Half2 = numerics::PackedHalf2<numerics::Float16>;
  static_assert(kAccumulators % 8 == 0, "accumulators move as 16-byte vectors of eight halves");
  static constexpr int kVectors = kAccumulators / 8;
  static constexpr i64 kHalfBytes = static_cast<i64>(kThreads) * kAccumulators * 2;
  static constexpr i64 kSlotBytes = kHalfBytes + static_cast<i64>(kThreads) * 4;

  // The exponent field of this thread's scale: 2^(field - 127) maps a largest finite magnitude of
  // biased exponent b into [2^14, 2^15) (field 268 - b: 14 for the largest finite b, 254), at most
  // 253 so that the scale and its inverse 2^(127 - field) are normal floats (a thread of zeros and
  // subnormals takes 253; the lower clamp at 1 never binds).
  static __device__ __forceinline__ u32 scale_field(const float (&acc)[kAccumulators]) {
    u32 top = 0;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) {
      const u32 b = (__float_as_uint(acc[i]) >> 23) & 0xffu;
      top = max(top, b == 0xffu ? 0u : b);  // Inf and NaN set no scale
    }
    const int field = 268 - static_cast<int>(top);
    return static_cast<u32>(field < 1 ? 1 : field > 253 ? 253 : field);
  }

  // Slot `slot` of the workspace (slots kSlotBytes apart).
  static __device__ __forceinline__ char* at(void* workspace, int slot) {
    return reinterpret_cast<char*>(workspace) + slot * kSlotBytes;
  }

  // Store acc in slot `slot` (every thread of the slot calls this).
  static __device__ __forceinline__ void store(void* workspace, int slot_index, const float (&acc)[kAccumulators]) {
    char* slot = at(workspace, slot_index);
    const u32 field = scale_field(acc);
    const float scale = __uint_as_float(field << 23);
    uint4* dst = reinterpret_cast<uint4*>(slot) + threadIdx.x;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      u32 h[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) h[j] = Half2::from_floats(acc[8 * v + 2 * j] * scale, acc[8 * v + 2 * j + 1] * scale);
      __stcg(dst + v * kThreads, make_uint4(h[0], h[1], h[2], h[3]));
    }
    __stcg(reinterpret_cast<unsigned int*>(slot + kHalfBytes) + threadIdx.x, field);
  }

  // acc += the values stored in slot `slot` (the same thread's).
  static __device__ __forceinline__ void add(float (&acc)[kAccumulators], void* workspace, int slot_index) {
    const char* slot = at(workspace, slot_index);
    const u32 field = __ldcg(reinterpret_cast<const unsigned int*>(slot + kHalfBytes) + threadIdx.x);
    const float inverse = __uint_as_float((254u - field) << 23);
    const uint4* src = reinterpret_cast<const uint4*>(slot) + threadIdx.x;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const uint4 x = __ldcg(src + v * kThreads);
      const u32 h[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float lo, hi;
        Half2::to_floats(h[j], lo, hi);
        acc[8 * v + 2 * j] += lo * inverse;
        acc[8 * v + 2 * j + 1] += hi * inverse;
      }
    }
  }
};

}  // namespace humming_aot::epilogue
