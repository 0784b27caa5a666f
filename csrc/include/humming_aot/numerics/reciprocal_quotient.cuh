#pragma once
// x / d for many x over one divisor d, by a product with d's reciprocal and one correction step
// (Markstein's): r = RN(1 / d) once, then per x
//   q0 = RN(x r),  e = x - q0 d (one fma, exact),  q = RN(q0 + e r) (one fma),
// and the sign of x on q. Where d lies in [2^-64, 2^64] (`by_reciprocal`), q is x / d correctly
// rounded (round to nearest even, as IEEE division and __fdiv_rn give) for every finite float x,
// except where the quotient is below 2^-36 in magnitude (x under 2^-100, whose remainder e falls
// below the subnormals, or a subnormal quotient): there q is too, with the sign of x, so an encoder
// whose smallest nonzero code lies far above (int8's 0.5, float8e4m3's 2^-9, float8e5m2's 2^-16,
// float4e2m1's 0.5) gives the same code. Two forms:
// - by_product: for quotients below 2^127 (a quantizer's own scale, |x| <= amax and d = amax /
//   its largest code, bounds them by that code);
// - by_product_any: any quotient, overflow to +-inf included, as the division's: q0 clamped to
//   +-FLT_MAX first (a q0 that overflowed is within an ulp of FLT_MAX or far past it, and the
//   correction rounds both right), for a scale given from outside (two instructions more).
// Outside that range of d, `of_each` divides. Why: the quantization kernels (helpers/act_quant*.cuh)
// divide every element by a scale shared by a row or a group, and __fdiv_rn costs a reciprocal,
// five fma, a check and a branch to its slow path per element, its reconvergence keeping a
// thread's divisions from overlapping; this is one multiplication and two fma, without branches.
// Non-finite x give unspecified results (the quantizers' references refuse them).
// tests/unit/test_reciprocal_quotient.py replays both forms in exact arithmetic over every 16-bit
// x. Any arch.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct ReciprocalQuotient {
  static constexpr float kLeastDivisor = 5.42101086e-20f;    // 2^-64
  static constexpr float kLargestDivisor = 1.84467441e+19f;  // 2^64
  static constexpr float kFloatMax = 3.40282347e+38f;        // FLT_MAX

  float divisor;
  float reciprocal;    // RN(1 / divisor)
  bool by_reciprocal;  // divisor in [2^-64, 2^64] (false for NaN)

  __device__ __forceinline__ explicit ReciprocalQuotient(float d)
      : divisor(d), reciprocal(__frcp_rn(d)), by_reciprocal(d >= kLeastDivisor && d <= kLargestDivisor) {}

  // The correction of q0 (within an ulp of x / divisor), the sign of x on it.
  __device__ __forceinline__ float corrected(float x, float q0) const {
    const float e = __fmaf_rn(-q0, divisor, x);
    const float q = __fmaf_rn(e, reciprocal, q0);
    return __uint_as_float((__float_as_uint(q) & 0x7FFFFFFFu) | (__float_as_uint(x) & 0x80000000u));
  }

  // x / divisor for |x / divisor| < 2^127; the caller has checked by_reciprocal.
  __device__ __forceinline__ float by_product(float x) const { return corrected(x, __fmul_rn(x, reciprocal)); }

  // x / divisor for any finite x; the caller has checked by_reciprocal.
  __device__ __forceinline__ float by_product_any(float x) const {
    return corrected(x, fminf(fmaxf(__fmul_rn(x, reciprocal), -kFloatMax), kFloatMax));
  }

  // x[i] / divisor for a vector of N: by_product (kAnyQuotient: by_product_any) where the divisor
  // allows it, else the division, the branch taken once for the vector.
  template <bool kAnyQuotient, int N>
  __device__ __forceinline__ void of_each(const float (&x)[N], float (&q)[N]) const {
    if (by_reciprocal) {
#pragma unroll
      for (int i = 0; i < N; ++i) q[i] = kAnyQuotient ? by_product_any(x[i]) : by_product(x[i]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) q[i] = __fdiv_rn(x[i], divisor);
    }
  }
};

}  // namespace humming_aot::numerics
