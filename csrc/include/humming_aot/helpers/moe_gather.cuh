#pragma once
// The permute step of a MoE layer: each grouped row gets its token's hidden state, rows[r] =
// hidden[slot_of_row[r] / top_k], and a padding row (slot -1) zeros (humming_aot.moe.permute and
// permute_aligned, bit for bit: a copy). Any arch. Memory bound: each thread copies kWords 32-bit
// words (16 bytes when kWords is 4) of one row. PDL as in moe_route.cuh.

#include <humming_aot/numerics/types.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.moe.cuda_steps as "<8q" (64 bytes).
struct GatherParams {
  const void* hidden;      // (tokens, cols) 16-bit, row stride ld_hidden elements
  const i64* slot_of_row;  // (rows,): the flat slot of each row, -1 for padding
  void* out;               // (rows, cols) 16-bit, row stride ld_out elements
  i64 rows;                // gridDim.x
  i64 cols;                // even
  i64 ld_hidden;           // even
  i64 ld_out;              // even
  i64 top_k;               // slots per token
};
static_assert(sizeof(GatherParams) == 64, "GatherParams must match the Python struct format <8q");

template <int kWords>  // 32-bit words per thread: 4 (cols, ld_hidden, ld_out multiples of 8, 16-byte bases) or 1
struct MoeGather {
  static constexpr int kThreads = 128;
  static_assert(kWords == 1 || kWords == 4, "a thread copies 4 or 16 bytes");
  struct alignas(4 * kWords) Vector {  // one 16-byte access, or one word
    u32 word[kWords];
  };

  // Grid (rows, ceil(cols / (2 * kWords * kThreads))).
  static __device__ void run(const GatherParams& p) {
    schedule::release_then_wait_for_upstream();
    const i64 row = blockIdx.x;
    const i64 column = (static_cast<i64>(blockIdx.y) * kThreads + threadIdx.x) * 2 * kWords;
    if (column >= p.cols) return;
    const i64 slot = p.slot_of_row[row];
    Vector v;
    if (slot >= 0) {
      const i64 token = slot / p.top_k;
      v = *reinterpret_cast<const Vector*>(static_cast<const unsigned short*>(p.hidden) + token * p.ld_hidden + column);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) v.word[i] = 0u;
    }
    *reinterpret_cast<Vector*>(static_cast<unsigned short*>(p.out) + row * p.ld_out + column) = v;
  }
};

}  // namespace humming_aot::helpers
