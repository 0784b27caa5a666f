#pragma once
// The activation between a MoE layer's two GEMMs, (R, 2 I) -> (R, I), in fp32 and rounded once to
// the activation dtype, bit for bit what humming_aot.moe.silu_and_mul / swiglu_oai compute with
// torch (each op rounded separately, no fma; IEEE division; expf). Any arch the activation dtype
// runs on. Memory bound: each thread owns kPairs pairs of output columns of one row. PDL as in
// moe_route.cuh.
//   kSiluAndMul: gate = x[:, :I], up = x[:, I:]; out = silu(gate) * up
//   kSwigluOai (gpt-oss): gate = x[:, 0::2] clamped above at `limit`, up = x[:, 1::2] clamped to
//     [-limit, limit]; out = (up + 1) * gate * sigmoid(alpha * gate)

#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/numerics/types.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.moe.cuda_steps as "<6q2f" (56 bytes).
struct ActivationParams {
  const void* in;  // (rows, 2 * inter) activation dtype, row stride ld_in elements
  void* out;       // (rows, inter) activation dtype, row stride ld_out elements
  i64 rows;        // gridDim.x
  i64 inter;       // I, even
  i64 ld_in;       // even
  i64 ld_out;      // even
  float alpha;     // kSwigluOai only
  float limit;     // kSwigluOai only
};
static_assert(sizeof(ActivationParams) == 56, "ActivationParams must match the Python struct format <6q2f");

enum class ActivationKind { kSiluAndMul, kSwigluOai };

template <class Act,             // numerics::Float16 or BFloat16
          ActivationKind kKind,  //
          int kPairs>            // output column pairs per thread: 4 (I, ld_in, ld_out multiples of 8) or 1
struct MoeActivation {
  static constexpr int kThreads = 128;
  static constexpr int kColumns = 2 * kPairs;  // outputs per thread
  static_assert(kPairs == 1 || kPairs == 4, "a thread stores 4 or 16 bytes");
  using Half2 = numerics::PackedHalf2<Act>;
  template <int kWords>  // 16-byte aligned for 16-byte accesses, else word by word
  struct alignas(kWords >= 4 ? 16 : 4) Vector {
    u32 word[kWords];
  };

  static __device__ __forceinline__ float silu_and_mul(float gate, float up) {
    return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
  }

  static __device__ __forceinline__ float swiglu_oai(float gate, float up, float alpha, float limit) {
    gate = gate > limit ? limit : gate;  // comparisons keep a NaN, as torch.clamp does
    up = up > limit ? limit : (up < -limit ? -limit : up);
    const float sigmoid = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(alpha, gate))));
    return __fmul_rn(__fmul_rn(__fadd_rn(up, 1.0f), gate), sigmoid);
  }

  // Grid (rows, ceil(inter / (kThreads * kColumns))).
  static __device__ void run(const ActivationParams& p) {
    schedule::release_then_wait_for_upstream();
    const i64 row = blockIdx.x;
    const i64 column = (static_cast<i64>(blockIdx.y) * kThreads + threadIdx.x) * kColumns;
    if (column >= p.inter) return;
    const unsigned short* in = static_cast<const unsigned short*>(p.in) + row * p.ld_in;
    float result[kColumns];
    if constexpr (kKind == ActivationKind::kSiluAndMul) {
      const Vector<kPairs> gate = *reinterpret_cast<const Vector<kPairs>*>(in + column);
      const Vector<kPairs> up = *reinterpret_cast<const Vector<kPairs>*>(in + p.inter + column);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        float g0, g1, u0, u1;
        Half2::to_floats(gate.word[i], g0, g1);
        Half2::to_floats(up.word[i], u0, u1);
        result[2 * i] = silu_and_mul(g0, u0);
        result[2 * i + 1] = silu_and_mul(g1, u1);
      }
    } else {  // gate and up interleaved: word i holds (gate, up) of output column + i
      const Vector<2 * kPairs> pairs = *reinterpret_cast<const Vector<2 * kPairs>*>(in + 2 * column);
#pragma unroll
      for (int i = 0; i < kColumns; ++i) {
        float gate, up;
        Half2::to_floats(pairs.word[i], gate, up);
        result[i] = swiglu_oai(gate, up, p.alpha, p.limit);
      }
    }
    Vector<kPairs> out;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) out.word[i] = Half2::from_floats(result[2 * i], result[2 * i + 1]);
    *reinterpret_cast<Vector<kPairs>*>(static_cast<unsigned short*>(p.out) + row * p.ld_out + column) = out;
  }
};

}  // namespace humming_aot::helpers
