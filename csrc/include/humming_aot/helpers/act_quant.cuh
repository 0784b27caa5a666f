#pragma once
// Activation quantization: 16-bit activations (rows, k) -> uint8 codes (rows, k) and float32 scales,
// bit for bit humming_aot.quant.activation's recipes with float32 scales: scale = amax / d with d
// the element's largest value (127 for int8, as vLLM), correctly rounded; codes = encode(x / scale),
// the quotient correctly rounded; int8 rounds half to even and saturates, fp8 (sm_89+: cvt
// .satfinite) rounds to nearest even and saturates. A tile of zeros gets scale 1; a nonzero tile
// whose scale underflows to 0 gets the smallest positive float. Per token (one pass over a CTA's
// row or part of at most one step of loads, else two), per group of G = 8 * lanes elements (one pass, each group
// in `lanes` consecutive lanes of a warp), or per tensor (static: a given scale; dynamic: an amax
// pass into one word, then an apply pass).
// The quotients x / scale are correctly rounded float32 through numerics::ReciprocalQuotient (a
// product with the scale's reciprocal and one fma correction per element, __fdiv_rn where the
// scale lies outside [2^-64, 2^64]; a given static scale's, which nothing bounds, in the form that
// overflows as the division does).
// Non-finite inputs give unspecified codes and scales (the reference refuses them).
// A row is one CTA of kThreads: 256, or 1024 for few rows (a wide CTA: decode's one to a few dozen
// tokens, where a row's per-element work on one SM, not the memory, sets the time), or for few
// long rows gridDim.y CTAs of 256 (helpers/row_parts.cuh: each a contiguous part; a per-token
// row's parts one cluster, sm_90+, which exchanges their amax). Programmatic dependent launch
// (sm_90+), both ways: every kernel waits for the upstream grid before it reads the activations
// (a kernel of the stream that wrote them may still run: the launch takes the attribute,
// quant/cuda_quant.py), so its launch and CTA start overlap the previous kernel's tail; and the
// kernels that write what a GEMM reads (token, group, tensor_apply) let the next kernel launch as
// they start: the GEMMs launched so wait for this grid's completion before they read activations
// (schedule/grid_dependency.cuh), so only their launch, prologue and first weights' L2 prefetches
// (kernel/scaled_ws_driver.cuh) overlap it.

#include <humming_aot/helpers/row_parts.cuh>
#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/numerics/reciprocal_quotient.cuh>
#include <humming_aot/numerics/types.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.quant.cuda_quant as "<9q" (72 bytes).
struct ActQuantParams {
  const void* in;        // (rows, k) activation dtype, row stride ld_in elements (a multiple of 8)
  unsigned char* codes;  // (rows, k) uint8, contiguous
  float* scales;         // token: (rows,); group: (rows, k / group); tensor: (1,), written by CTA (0, 0)
  const float* given;    // tensor, static: the given scale (1,); else nullptr
  u32* amax_bits;        // tensor, dynamic: (1,) the tensor's amax as float bits, zero before the amax pass
  i64 rows;              // gridDim.x
  i64 k;                 // a multiple of 8
  i64 ld_in;             //
  i64 group;             // group: G (a power of two from 16 to 256, dividing k); else 0
};
static_assert(sizeof(ActQuantParams) == 72, "ActQuantParams must match the Python struct format <9q");

enum class QuantElement { kInt8, kE4M3, kE5M2 };

template <class Act,              // numerics::Float16 or BFloat16
          QuantElement kElement,  //
          int kCtaThreads = 256>  // threads of a row's CTA: 256, or 1024 (few rows)
struct ActQuant {
  static_assert(kCtaThreads % 32 == 0 && kCtaThreads <= 1024, "whole warps, at most 1024 threads");
  static constexpr int kThreads = kCtaThreads;
  static constexpr int kVector = 8;  // elements per thread and step: one 16-byte load, one 8-byte store
  static constexpr float kFloat32SmallestPositive = 1.40129846e-45f;
  using Half2 = numerics::PackedHalf2<Act>;
  struct alignas(16) Loaded {
    u32 pair[kVector / 2];
  };
  struct alignas(8) Codes {
    u32 word[2];
  };

  // The element's largest value: the scale's divisor.
  static __device__ __forceinline__ float largest() {
    if constexpr (kElement == QuantElement::kInt8) return 127.0f;
    if constexpr (kElement == QuantElement::kE4M3) return 448.0f;
    return 57344.0f;
  }

  // amax -> scale (the reference's symmetric_scales with float32 scales).
  static __device__ __forceinline__ float scale_of(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    const float s = __fdiv_rn(amax, largest());
    return s == 0.0f ? kFloat32SmallestPositive : s;
  }

  static __device__ __forceinline__ void to_floats(const Loaded& v, float (&x)[kVector]) {
#pragma unroll
    for (int i = 0; i < kVector / 2; ++i) Half2::to_floats(v.pair[i], x[2 * i], x[2 * i + 1]);
  }

  static __device__ __forceinline__ float local_amax(const float (&x)[kVector]) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kVector; ++i) m = fmaxf(m, fabsf(x[i]));
    return m;
  }

  // Two quotients -> two codes in the low 16 bits (the first in the low byte).
  static __device__ __forceinline__ u32 encode2(float lo, float hi) {
    if constexpr (kElement == QuantElement::kInt8) {
      const int a = min(max(__float2int_rn(lo), -128), 127);
      const int b = min(max(__float2int_rn(hi), -128), 127);
      return (static_cast<u32>(a) & 0xFFu) | ((static_cast<u32>(b) & 0xFFu) << 8);
    } else {
      unsigned short d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      if constexpr (kElement == QuantElement::kE4M3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
      } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
      }
#else
      static_assert(kElement == QuantElement::kInt8, "fp8 codes need sm_89+ (cvt.satfinite e4m3x2 / e5m2x2)");
#endif
      return d;
    }
  }

  // The codes of x / scale (of_each's branch is uniform over a row or a group's lanes). kAnyQuotient: a
  // scale that does not bound the quotients (a given one), whose quotients may overflow to +-inf.
  template <bool kAnyQuotient = false>
  static __device__ __forceinline__ Codes encode(const float (&x)[kVector], const numerics::ReciprocalQuotient& scale) {
    float q[kVector];
    scale.of_each<kAnyQuotient>(x, q);
    Codes c;
#pragma unroll
    for (int w = 0; w < 2; ++w)
      c.word[w] = encode2(q[4 * w], q[4 * w + 1]) | (encode2(q[4 * w + 2], q[4 * w + 3]) << 16);
    return c;
  }

  static __device__ __forceinline__ const Loaded* row_in(const ActQuantParams& p, i64 row) {
    return reinterpret_cast<const Loaded*>(static_cast<const unsigned short*>(p.in) + row * p.ld_in);
  }
  static __device__ __forceinline__ Codes* row_codes(const ActQuantParams& p, i64 row) {
    return reinterpret_cast<Codes*>(p.codes + row * p.k);
  }

  // The CTA's largest value of `value` (every thread gets it); `shared` holds kThreads / 32 floats.
  static __device__ __forceinline__ float cta_max(float value, float* shared) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
    __syncthreads();
    float m = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, shared[w]);
    return m;
  }

  // kUnroll vectors per thread and step, all loaded before any is used: enough bytes in flight per
  // SM to stream at the memory's rate (one vector per step leaves a row's loads one at a time).
  static constexpr int kUnroll = 4;
  static constexpr int kStep = kThreads * kUnroll;  // vectors per CTA and step

  // The thread's vectors base + threadIdx.x + j * kThreads (j < kUnroll) of the row that exist.
  static __device__ __forceinline__ void load_step(const Loaded* in, i64 base, i64 vectors, Loaded (&v)[kUnroll]) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const i64 at = base + threadIdx.x + j * kThreads;
      if (at < vectors) v[j] = in[at];
    }
  }

  // The largest magnitude of the CTA's part of the row (each thread's own).
  static __device__ __forceinline__ float row_amax(const ActQuantParams& p, i64 row) {
    const Loaded* in = row_in(p, row);
    const RowPart part = RowPart::of(p.k / kVector, 1);
    float m = 0.0f;
    for (i64 base = part.begin; base < part.end; base += kStep) {
      Loaded v[kUnroll];
      load_step(in, base, part.end, v);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (base + threadIdx.x + j * kThreads < part.end) {
          float x[kVector];
          to_floats(v[j], x);
          m = fmaxf(m, local_amax(x));
        }
      }
    }
    return m;
  }

  // The codes of x / scale of the CTA's part of the row (kAnyQuotient: encode's).
  template <bool kAnyQuotient>
  static __device__ __forceinline__ void apply(const ActQuantParams& p, i64 row, float scale) {
    const numerics::ReciprocalQuotient divide(scale);
    const Loaded* in = row_in(p, row);
    Codes* out = row_codes(p, row);
    const RowPart part = RowPart::of(p.k / kVector, 1);
    for (i64 base = part.begin; base < part.end; base += kStep) {
      Loaded v[kUnroll];
      load_step(in, base, part.end, v);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const i64 at = base + threadIdx.x + j * kThreads;
        if (at < part.end) {
          float x[kVector];
          to_floats(v[j], x);
          out[at] = encode<kAnyQuotient>(x, divide);
        }
      }
    }
  }

  // The row's amax from the CTA's amax of its part: that alone for a whole row, else the largest
  // over the cluster of the row's gridDim.y parts (row_parts.cuh).
  static __device__ __forceinline__ float whole_row_max(float cta_amax) {
    return gridDim.y == 1 ? cta_amax : cluster_max(cta_amax);
  }

  // Grid (rows, parts): one scale per row; a row in gridDim.y parts (RowPart) is one cluster of
  // (1, parts, 1), sm_90+. A CTA's part of at most one step (kVector x kStep elements: 8,192 in
  // 256 threads, 32,768 in 1,024) is read once, its vectors kept in registers from the amax to the
  // codes; a longer one twice (the second pass mostly from L2).
  static __device__ void token(const ActQuantParams& p) {
    schedule::release_then_wait_for_upstream();
    __shared__ float shared[kThreads / 32];
    const i64 row = blockIdx.x;
    const RowPart part = RowPart::of(p.k / kVector, 1);
    if (part.end - part.begin <= kStep) {
      Loaded v[kUnroll];
      load_step(row_in(p, row), part.begin, part.end, v);
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (part.begin + threadIdx.x + j * kThreads < part.end) {
          float x[kVector];
          to_floats(v[j], x);
          m = fmaxf(m, local_amax(x));
        }
      }
      const float scale = scale_of(whole_row_max(cta_max(m, shared)));
      if (threadIdx.x == 0 && blockIdx.y == 0) p.scales[row] = scale;
      const numerics::ReciprocalQuotient divide(scale);
      Codes* out = row_codes(p, row);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const i64 at = part.begin + threadIdx.x + j * kThreads;
        if (at < part.end) {
          float x[kVector];
          to_floats(v[j], x);
          out[at] = encode(x, divide);
        }
      }
    } else {
      const float scale = scale_of(whole_row_max(cta_max(row_amax(p, row), shared)));
      if (threadIdx.x == 0 && blockIdx.y == 0) p.scales[row] = scale;
      apply<false>(p, row, scale);
    }
    if (gridDim.y != 1) cluster_exit();
  }

  // The vectors of this CTA's part of its row (blockIdx.x; RowPart, whole groups) in groups of
  // `lanes` consecutive lanes (of one of a step's kUnroll vectors per thread): body(x, amax, at,
  // valid) for each, amax the group's over its lanes, `at` the vector's index in the row. Every lane
  // runs every step (the shuffles); `valid` says whether its vector `at` exists (k is whole groups,
  // so a group is all valid or all not; an invalid one reads as zeros).
  template <class Body>
  static __device__ __forceinline__ void for_each_group_vector(const ActQuantParams& p, int lanes, Body&& body) {
    const Loaded* in = row_in(p, blockIdx.x);
    const RowPart part = RowPart::of(p.k / kVector, lanes);        // (whole groups a part)
    for (i64 base = part.begin; base < part.end; base += kStep) {  // the same trip count in every thread
      Loaded v[kUnroll];
      load_step(in, base, part.end, v);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const i64 at = base + threadIdx.x + j * kThreads;
        const bool valid = at < part.end;
        float x[kVector];
        if (valid) {
          to_floats(v[j], x);
        } else {
#pragma unroll
          for (int i = 0; i < kVector; ++i) x[i] = 0.0f;
        }
        float m = local_amax(x);
        for (int offset = 1; offset < lanes; offset *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
        body(x, m, at, valid);
      }
    }
  }

  // Grid (rows, parts): one scale per `group` elements of the row, each group in group / 8
  // consecutive lanes.
  static __device__ void group(const ActQuantParams& p) {
    schedule::release_then_wait_for_upstream();
    const i64 row = blockIdx.x;
    const int lanes = static_cast<int>(p.group / kVector);  // a power of two from 2 to 32
    const int lane_shift = __ffs(lanes) - 1;                // (shifts: no 64-bit division per vector)
    Codes* out = row_codes(p, row);
    float* row_scales = p.scales + row * ((p.k / kVector) >> lane_shift);  // the row's k / group scales
    for_each_group_vector(p, lanes, [&](const float (&x)[kVector], float amax, i64 at, bool valid) {
      const float scale = scale_of(amax);
      if (valid) {
        out[at] = encode(x, numerics::ReciprocalQuotient(scale));
        if ((threadIdx.x & (lanes - 1)) == 0) row_scales[at >> lane_shift] = scale;
      }
    });
  }

  // Grid (rows, parts), before tensor_apply of a dynamic scale: the tensor's amax into *amax_bits.
  static __device__ void tensor_amax(const ActQuantParams& p) {
    schedule::wait_for_upstream_grid();
    __shared__ float shared[kThreads / 32];
    const float m = cta_max(row_amax(p, blockIdx.x), shared);
    if (threadIdx.x == 0) atomicMax(p.amax_bits, __float_as_uint(m));  // non-negative floats order as their bits
  }

  // Grid (rows, parts): the one scale (given, or from the amax pass) applied; CTA (0, 0) writes it.
  static __device__ void tensor_apply(const ActQuantParams& p) {
    schedule::release_then_wait_for_upstream();
    float scale;
    if (p.given != nullptr) {
      scale = *p.given;
      scale = scale == 0.0f ? kFloat32SmallestPositive : scale;
    } else {
      scale = scale_of(__uint_as_float(*p.amax_bits));
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.scales = scale;
    if (p.given != nullptr) {
      apply<true>(p, blockIdx.x, scale);
    } else {
      apply<false>(p, blockIdx.x, scale);
    }
  }
};

}  // namespace humming_aot::helpers
