#pragma once
// cp.async copies of block-scale tiles into a pipeline stage (SM80+): kRows rows of kRowBytes
// scale bytes (a row's scales of one K tile: 16 NVFP4 ue4m3 or 8 MXFP4 ue8m0 bytes for 256 codes)
// from a (rows, k_tiles x kRowBytes) row-major byte matrix whose rows are row_bytes apart. Row r
// lands at r x kRowBytes; rows at or past the tile's valid rows are zero-filled. One copy per row
// and stage, the CTA's threads taking rows in turn. word() reads a row's 32-bit scale word back
// (the block-scaled mma's scale operand, mma/mma_sync_fp4.cuh).

#include <humming_aot/memory/cp_async.cuh>

namespace humming_aot::memory {

template <int kRows,      // rows of the tile (activation tokens or weight channels)
          int kThreads,   // the CTA's threads, all of which may issue copies
          int kRowBytes>  // scale bytes of a row per stage: 16 or 8
struct KMajorScaleTile {
  static_assert(kRowBytes == 16 || kRowBytes == 8, "whole 16- or 8-byte copies");
  static constexpr int kBytes = kRows * kRowBytes;
  static constexpr int kPasses = (kRows + kThreads - 1) / kThreads;
  static_assert(kPasses <= 32, "validity bits are kept in one 32-bit mask");

  const char* src;  // this thread's first row at K tile 0
  i64 pass_bytes;   // global bytes between a thread's rows in consecutive passes
  u32 valid;        // bit pass: this thread's row of that pass exists and is valid

  // scales: the matrix's first row of the tile; row_bytes: bytes between its rows; valid_rows:
  // rows of the tile that exist (may be <= 0 or > kRows).
  __device__ __forceinline__ KMajorScaleTile(const void* scales, i64 row_bytes, int valid_rows) {
    const int row0 = threadIdx.x;
    src = static_cast<const char*>(scales) + row0 * row_bytes;
    pass_bytes = kThreads * row_bytes;
    valid = 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kThreads;
      if (row < kRows && row < valid_rows) valid |= 1u << pass;
    }
  }

  // Issue the copies of K tile k_tile's scales into the stage at smem_stage.
  __device__ __forceinline__ void load(u32 smem_stage, int k_tile) const {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = static_cast<int>(threadIdx.x) + pass * kThreads;
      if (row < kRows) {
        const u32 to = smem_stage + static_cast<u32>(row * kRowBytes);
        const char* from = src + pass * pass_bytes + static_cast<i64>(k_tile) * kRowBytes;
        if constexpr (kRowBytes == 16)
          cp_async_16(to, from, (valid >> pass) & 1u);
        else
          cp_async_8(to, from, (valid >> pass) & 1u);
      }
    }
  }

  // The 32-bit word at byte `byte` (a multiple of 4) of row `row`'s scales in the stage.
  static __device__ __forceinline__ u32 word(u32 smem_stage, int row, int byte) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_stage + static_cast<u32>(row * kRowBytes + byte)));
    return v;
  }
};

}  // namespace humming_aot::memory
