#pragma once
// cp.async copies of K-major 8-bit code tiles into a pipeline stage (SM80+): kRows rows of 128
// codes (one 128-byte row each) from a (rows, K) row-major matrix in global memory, whose rows are
// row_bytes apart. Chunk c (16 bytes) of row r lands at r * 128 + 16 * (c ^ (r & 7)): eight rows
// that ldmatrix reads at one column chunk fall in eight different bank groups. Rows at or past the
// tile's valid rows and chunks at or past the codes' K are zero-filled (never read), so a tile
// needs no edge case beyond K % 16 == 0 (whole chunks) and 16-byte aligned rows.

#include <humming_aot/memory/cp_async.cuh>

namespace humming_aot::memory {

template <int kRows,     // rows of the tile (activation tokens or weight channels)
          int kThreads>  // the CTA's threads, all of which issue copies
struct KMajorCodeTile {
  static constexpr int kRowBytes = 128;  // K codes per row and stage
  static constexpr int kBytes = kRows * kRowBytes;
  static constexpr int kChunks = kRows * 8;
  static constexpr int kRowsPerPass = kThreads / 8;
  static constexpr int kPasses = (kChunks + kThreads - 1) / kThreads;
  static_assert(kThreads % 8 == 0, "a pass covers whole rows: each thread keeps one column chunk");
  static_assert(kPasses <= 32, "validity bits are kept in one 32-bit mask");

  const char* src;  // this thread's chunk of its first row at K = 0
  i64 pass_bytes;   // global bytes between a thread's rows in consecutive passes
  u32 valid;        // bit pass: this thread's row of that pass exists and is valid
  int chunk_k;      // K of this thread's column chunk within a stage (0, 16, ..., 112)
  int k_end;        // the codes' K (row length): chunks at or past it are zero-filled

  // codes: the matrix's first row of the tile; valid_rows: rows of the tile that exist (may be
  // <= 0 or > kRows); k: the codes' own K.
  __device__ __forceinline__ KMajorCodeTile(const void* codes, i64 row_bytes, int valid_rows, int k) {
    const int chunk = threadIdx.x & 7, row0 = threadIdx.x >> 3;
    src = static_cast<const char*>(codes) + row0 * row_bytes + 16 * chunk;
    pass_bytes = kRowsPerPass * row_bytes;
    chunk_k = 16 * chunk;
    k_end = k;
    valid = 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      if (row < kRows && row < valid_rows) valid |= 1u << pass;
    }
  }

  // Issue the copies of the stage of codes [k0, k0 + 128) into the stage at smem_stage.
  __device__ __forceinline__ void load(u32 smem_stage, int k0) const {
    const bool k_ok = k0 + chunk_k < k_end;
    const int row0 = threadIdx.x >> 3;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      if (pass * kThreads + static_cast<int>(threadIdx.x) < kChunks) {
        const int row = row0 + pass * kRowsPerPass;
        const u32 to = chunk_address(smem_stage, row, threadIdx.x & 7);
        cp_async_16(to, src + pass * pass_bytes + k0, k_ok && ((valid >> pass) & 1u));
      }
    }
  }

  // Shared-memory address of the 16-byte chunk `chunk` of row `row` in the stage at smem_stage.
  static __device__ __forceinline__ u32 chunk_address(u32 smem_stage, int row, int chunk) {
    return smem_stage + static_cast<u32>(row * kRowBytes + 16 * (chunk ^ (row & 7)));
  }
};

}  // namespace humming_aot::memory
