#pragma once
// Arithmetic on two 16-bit activation values packed in one 32-bit register (f16x2 / bf16x2),
// written as inline PTX so that it needs no toolkit header. SM80+: bf16x2 add and mul only
// exist from SM90, so everything is an fma (x * 1 + y, x * y + (-0)), which is exact where the
// plain op would be and rounds identically otherwise.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

template <class Act>
struct PackedHalf2 {
  static constexpr u32 kOne2 = Act::kIsBFloat16 ? 0x3F803F80u : 0x3C003C00u;
  static constexpr u32 kNegZero2 = 0x80008000u;
  static constexpr u32 kSignMask2 = 0x80008000u;

  // a * b + c, round to nearest even, per 16-bit lane.
  static __device__ __forceinline__ u32 fma(u32 a, u32 b, u32 c) {
    u32 d;
    if constexpr (Act::kIsBFloat16) {
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    } else {
      asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    }
    return d;
  }
  static __device__ __forceinline__ u32 sub(u32 a, u32 b) { return fma(a, kOne2, b ^ kSignMask2); }
  static __device__ __forceinline__ u32 add(u32 a, u32 b) { return fma(a, kOne2, b); }
  static __device__ __forceinline__ u32 mul(u32 a, u32 b) { return fma(a, b, kNegZero2); }

  // Both lanes set to the low (or high) lane of x.
  static __device__ __forceinline__ u32 broadcast_low(u32 x) { return __byte_perm(x, 0, 0x1010); }
  static __device__ __forceinline__ u32 broadcast_high(u32 x) { return __byte_perm(x, 0, 0x3232); }

  // Round two floats to one packed pair: `lo` in bits 0-15, `hi` in bits 16-31.
  static __device__ __forceinline__ u32 from_floats(float lo, float hi) {
    u32 d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // no packed cvt before SM80 (and no bf16 there: SM75 kernels are float16)
    unsigned short l, h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
    asm("mov.b32 %0, {%1, %2};" : "=r"(d) : "h"(l), "h"(h));
    return d;
#endif
    if constexpr (Act::kIsBFloat16) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    } else {
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    }
    return d;
  }

  // Widen one packed pair to floats (exact).
  static __device__ __forceinline__ void to_floats(u32 x, float& lo, float& hi) {
    if constexpr (Act::kIsBFloat16) {
      lo = __uint_as_float(x << 16);
      hi = __uint_as_float(x & 0xFFFF0000u);
    } else {
      unsigned short l = static_cast<unsigned short>(x & 0xFFFFu);
      unsigned short h = static_cast<unsigned short>(x >> 16);
      asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
      asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
    }
  }
};

}  // namespace humming_aot::numerics
