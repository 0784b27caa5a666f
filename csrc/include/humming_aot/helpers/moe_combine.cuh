#pragma once
// The last step of a MoE layer: each token's top_k expert outputs, gathered from their grouped
// rows, times the routing weights, summed in fp32 in slot order 0..top_k-1 and rounded once to the
// output dtype (what humming_aot.moe.weighted_sum(unpermute(...)) computes, bit for bit: every
// product and sum is rounded separately, no fma). Any arch the activation dtype runs on. Memory
// bound: each thread owns kPairs pairs of columns (16 bytes when kPairs is 4) of one token. PDL as
// in moe_route.cuh.

#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/numerics/types.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.moe.cuda_steps as "<9q" (72 bytes).
struct CombineParams {
  const void* rows;        // (R, n) activation dtype, row stride ld_rows elements: the grouped outputs
  const int* row_of_slot;  // (tokens * top_k,): the row of each flat slot, -1: the slot adds nothing
  const void* weights;     // (tokens, top_k) contiguous, fp32 or the activation dtype (the kernel's Weight)
  void* out;               // (tokens, n) activation dtype, row stride ld_out elements
  i64 tokens;              // gridDim.x
  i64 top_k;
  i64 n;        // columns, even
  i64 ld_rows;  // even (rows 4-byte aligned)
  i64 ld_out;   // even
};
static_assert(sizeof(CombineParams) == 72, "CombineParams must match the Python struct format <9q");

template <class Act,          // numerics::Float16 or BFloat16
          bool kFp32Weights,  // weights in fp32 (else in the activation dtype)
          int kPairs>         // column pairs per thread: 4 (16-byte loads; n, ld_rows, ld_out multiples of 8) or 1
struct MoeCombine {
  static constexpr int kThreads = 128;
  static constexpr int kColumns = 2 * kPairs;  // per thread
  static_assert(kPairs == 1 || kPairs == 4, "a thread loads 4 or 16 bytes of each row");
  using Half2 = numerics::PackedHalf2<Act>;
  struct alignas(4 * kPairs) Vector {  // one 16-byte access, or one word
    u32 pair[kPairs];
  };

  static __device__ __forceinline__ float weight(const CombineParams& p, i64 index) {
    if constexpr (kFp32Weights) {
      return static_cast<const float*>(p.weights)[index];
    } else {
      const unsigned short bits = static_cast<const unsigned short*>(p.weights)[index];
      float lo, hi;
      Half2::to_floats(bits, lo, hi);
      return lo;
    }
  }

  // Grid (tokens, ceil(n / (kThreads * kColumns))).
  static __device__ void run(const CombineParams& p) {
    schedule::release_then_wait_for_upstream();
    const i64 token = blockIdx.x;
    const i64 column = (static_cast<i64>(blockIdx.y) * kThreads + threadIdx.x) * kColumns;
    if (column >= p.n) return;
    float sum[kColumns];
#pragma unroll
    for (int i = 0; i < kColumns; ++i) sum[i] = 0.0f;
    for (i64 j = 0; j < p.top_k; ++j) {
      const int row = p.row_of_slot[token * p.top_k + j];
      if (row < 0) continue;
      const float w = weight(p, token * p.top_k + j);
      const Vector v =
          *reinterpret_cast<const Vector*>(static_cast<const unsigned short*>(p.rows) + row * p.ld_rows + column);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        float lo, hi;
        Half2::to_floats(v.pair[i], lo, hi);
        sum[2 * i] = __fadd_rn(sum[2 * i], __fmul_rn(lo, w));
        sum[2 * i + 1] = __fadd_rn(sum[2 * i + 1], __fmul_rn(hi, w));
      }
    }
    Vector out;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) out.pair[i] = Half2::from_floats(sum[2 * i], sum[2 * i + 1]);
    *reinterpret_cast<Vector*>(static_cast<unsigned short*>(p.out) + token * p.ld_out + column) = out;
  }
};

}  // namespace humming_aot::helpers
