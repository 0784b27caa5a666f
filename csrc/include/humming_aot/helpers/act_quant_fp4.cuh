#pragma once
// 4-bit float activation quantization per group: 16-bit activations (rows, k) -> float4e2m1 codes
// (one per byte, the low nibble) and the group scales as float32 values, bit for bit
// humming_aot.quant.activation's two recipes:
// - MXFP4 (groups of 32, float8e8m0 scales): scale = 2^(floor(log2(amax)) - 2), within [2^-127,
//   2^127] (OCP MX: 2 = floor(log2(6)), the element's largest exponent);
// - NVFP4 (groups of 16, float8e4m3 scales, two levels): the global scale g (given, or the
//   tensor's amax / (448 x 6) from the amax pass of act_quant.cuh, 1 for a tensor of zeros),
//   scale = e4m3(amax / 6 / g) rounded to nearest even and saturated at 448 (a nonzero group
//   whose scale rounds to 0 gets 2^-9, e4m3's smallest), and the divisor scale x g.
// A group of zeros gets scale 1. Codes = e2m1(x / divisor): nearest even on {0, 0.5, 1, 1.5, 2, 3,
// 4, 6}, saturating at 6, the sign kept (a negative that rounds to 0 is -0, code 8). The division
// and every product are float32 and correctly rounded, as the reference's (the division as a
// product with the divisor's reciprocal corrected once: numerics/reciprocal_quotient.cuh).

#include <humming_aot/helpers/act_quant.cuh>
#include <humming_aot/numerics/reciprocal_quotient.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.quant.cuda_quant as "<10q" (80 bytes): ActQuantParams (its `given` is the
// NVFP4 global scale given, or nullptr; `amax_bits` the amax pass's word for a dynamic one;
// `group` 16 or 32; `scales` (rows, k / group)), then the global scale's output.
struct Fp4QuantParams {
  ActQuantParams base;
  float* global_out;  // NVFP4: (1,) the global scale the codes were divided by, written by CTA (0, 0)
};
static_assert(sizeof(Fp4QuantParams) == 80, "Fp4QuantParams must match the Python struct format <10q");

enum class Fp4Scale { kE8M0, kE4M3Global };

template <class Act,        // numerics::Float16 or BFloat16
          Fp4Scale kScale>  // MXFP4's or NVFP4's scales
struct ActQuantFp4 {
  // the loads, the float conversions and the amax of ActQuant (the element does not enter them)
  using Base = ActQuant<Act, QuantElement::kInt8>;
  static constexpr int kThreads = Base::kThreads;
  static constexpr int kVector = Base::kVector;
  static constexpr float kElementMax = 6.0f;

  // The e2m1 code of a float32 q (the reference's encode: nearest, ties to even, saturating at 6,
  // the sign kept; NaN reads as 6) in integer steps, with no conversion instruction:
  // - below 1: rint(2m), 0 to 2 (0, 0.5, 1.0), the low bits of 2m + 2^23 (a sum rounded half to
  //   even to an integer; 2m is exact);
  // - from 1 up: m rounded half to even to one mantissa bit within its own bits (a carry moves it
  //   to the next binade); its exponent field and that bit, less 252, are the codes 2 (1.0) to 7
  //   (6.0).
  static __device__ __forceinline__ u32 encode_e2m1(float q) {
    const float m = fminf(fabsf(q), kElementMax);
    const u32 below_one = __float_as_uint(__fmaf_rn(m, 2.0f, 8388608.0f)) & 3u;
    const u32 u = __float_as_uint(m);
    const u32 rounded = u + 0x1FFFFFu + ((u >> 22) & 1u);
    const u32 code = m < 1.0f ? below_one : (rounded >> 22) - 252u;
    return code + ((__float_as_uint(q) >> 31) << 3);  // the sign bit
  }

  // 2^e for e in [-127, 127]: a normal float's exponent field, or 2^-127's subnormal bit.
  static __device__ __forceinline__ float power_of_two(int e) {
    return e >= -126 ? __uint_as_float(static_cast<u32>(e + 127) << 23) : __uint_as_float(1u << 22);
  }

  // MXFP4's scale of a group whose amax is `amax` (>= 0) as its exponent (0 for a group of zeros,
  // whose scale is 1).
  static __device__ __forceinline__ int mx_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    const u32 bits = __float_as_uint(amax);
    const u32 field = bits >> 23;  // (amax >= 0: no sign bit)
    // floor(log2(amax)): the exponent field, or for a subnormal its highest set bit
    const int log2 = field != 0 ? static_cast<int>(field) - 127 : (31 - __clz(static_cast<int>(bits))) - 149;
    const int shared = log2 - 2;
    return shared < -127 ? -127 : (shared > 127 ? 127 : shared);
  }

  // raw rounded to the nearest float8e4m3 value (ties to even), saturated at 448, as a float.
  static __device__ __forceinline__ float e4m3_nearest(float raw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short code = 0, half = 0;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(code) : "f"(0.0f), "f"(raw));  // raw in the low byte
    u32 pair = 0;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(code));
    half = static_cast<unsigned short>(pair & 0xFFFFu);
    float value = 0.0f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(half));
    return value;
#else
    static_assert(kScale != Fp4Scale::kE4M3Global, "float8e4m3 scales need sm_89+ (cvt.satfinite e4m3x2)");
    return raw;
#endif
  }

  // The eight quotients x / divisor of one vector, correctly rounded. MXFP4's divisor is a power
  // of two, whose reciprocal is exact: the product is the quotient rounded once. NVFP4's is not
  // (a product with a rounded reciprocal lands within 2 ulps, and deferring to the division near
  // e2m1's rounding boundaries cost as many instructions as it saved, session 26): one fma
  // correction of that product makes it exact (numerics::ReciprocalQuotient, in the form for any
  // quotient: a given global scale bounds none).
  static __device__ __forceinline__ void quotients(const float (&x)[kVector], float divisor, float reciprocal,
                                                   float (&q)[kVector]) {
    if constexpr (kScale == Fp4Scale::kE8M0) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) q[i] = x[i] * reciprocal;
    } else {
      numerics::ReciprocalQuotient(divisor).of_each<true>(x, q);
    }
  }

  // The eight codes of one vector, a byte each (the first element in the lowest byte).
  static __device__ __forceinline__ typename Base::Codes encode(const float (&x)[kVector], float divisor,
                                                                float reciprocal) {
    float q[kVector];
    quotients(x, divisor, reciprocal, q);
    typename Base::Codes c;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      u32 word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= encode_e2m1(q[4 * w + i]) << (8 * i);
      c.word[w] = word;
    }
    return c;
  }

  // Grid (rows, parts): the groups of the CTA's part of its row (RowPart), each in group / 8
  // consecutive lanes (of one of a step's kUnroll vectors per thread). NVFP4 with a dynamic global
  // scale runs after ActQuant::tensor_amax (base.amax_bits).
  static __device__ void group(const Fp4QuantParams& q) {
    schedule::release_then_wait_for_upstream();
    const ActQuantParams& p = q.base;
    const i64 row = blockIdx.x;
    const int lanes = static_cast<int>(p.group / kVector);  // 2 (NVFP4) or 4 (MXFP4)
    const int lane_shift = __ffs(lanes) - 1;
    typename Base::Codes* out = Base::row_codes(p, row);
    float* row_scales = p.scales + row * ((p.k / kVector) >> lane_shift);
    float global = 1.0f;
    if constexpr (kScale == Fp4Scale::kE4M3Global) {
      if (p.given != nullptr) {
        global = *p.given;
      } else {
        const float amax = __uint_as_float(*p.amax_bits);
        global = amax > 0.0f ? __fdiv_rn(amax, 448.0f * kElementMax) : 1.0f;
      }
      if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *q.global_out = global;
    }
    Base::for_each_group_vector(p, lanes, [&](const float (&x)[kVector], float amax, i64 at, bool valid) {
      float scale, divisor, reciprocal;
      if constexpr (kScale == Fp4Scale::kE8M0) {
        const int e = mx_exponent(amax);
        scale = divisor = power_of_two(e);
        reciprocal = power_of_two(-e);  // exact: e in [-127, 127]
      } else {
        scale = 1.0f;
        if (amax > 0.0f) {
          scale = e4m3_nearest(__fdiv_rn(__fdiv_rn(amax, kElementMax), global));
          if (scale == 0.0f) scale = 0.001953125f;  // 2^-9
        }
        divisor = __fmul_rn(scale, global);
        reciprocal = 0.0f;  // (unused: quotients takes the divisor's own)
      }
      if (valid) {
        out[at] = encode(x, divisor, reciprocal);
        if ((threadIdx.x & (lanes - 1)) == 0) row_scales[at >> lane_shift] = scale;
      }
    });
  }
};

}  // namespace humming_aot::helpers
