#pragma once
// Where a thread's accumulators sit in the tile when wgmma's M is the tokens (the activations are
// the A operand, 64 tokens a warpgroup, and the weights the B operand, kColumns channels): the
// plain m64nN accumulator layout, the transpose of epilogue/column_major_writer.cuh's
// WarpgroupFragments. Threads in warpgroups of 128, warpgroup wg holding tokens 64 wg + [0, 64):
// acc[index(j, e)] = acc[4 j + e] is token first_token() + 8 (e >> 1), column first_column() +
// 8 j + (e & 1), where first_token() = 64 wg + 16 w + g and first_column() = 2 t (w: warp in the
// warpgroup, g = lane / 4, t = lane % 4). Per 8-column chunk j, the m16n8 accumulator layout of an
// 8 x 8 block of tokens g and one of tokens 8 + g: what stmatrix (not transposed) stores as rows.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::epilogue {

template <int kColumnsPerTile>
struct TokenMajorFragments {
  static_assert(kColumnsPerTile % 16 == 0, "whole pairs of 8-column chunks (stmatrix x4)");
  static constexpr bool kTokenMajor = true;
  static constexpr int kColumns = kColumnsPerTile;
  static constexpr int kTokensPerWarpGroup = 64;
  static constexpr int kAccumulators = kColumns / 2;
  static constexpr int kChunks = kColumns / 8;

  static __device__ __forceinline__ int first_token() {
    return 16 * static_cast<int>(threadIdx.x >> 5) + static_cast<int>((threadIdx.x & 31) >> 2);
  }
  static __device__ __forceinline__ int first_column() { return 2 * (threadIdx.x & 3); }
  static constexpr __host__ __device__ int index(int j, int e) { return 4 * j + e; }

  template <class Fn>
  static __device__ __forceinline__ void for_each(Fn&& fn) {
    const int token0 = first_token(), col0 = first_column();
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) fn(i, token0 + 8 * ((i >> 1) & 1), col0 + 8 * (i >> 2) + (i & 1));
  }
};

}  // namespace humming_aot::epilogue
