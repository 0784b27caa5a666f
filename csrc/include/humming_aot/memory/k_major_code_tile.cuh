#pragma once
// cp.async copies of K-major 8-bit code tiles into a pipeline stage (SM80+): kRows rows of 128
// codes (one 128-byte row each) from a (rows, K) row-major matrix in global memory, whose rows are
// row_bytes apart. Chunk c (16 bytes) of row r lands at r * 128 + 16 * (c ^ (r & 7)): eight rows
// that ldmatrix reads at one column chunk fall in eight different bank groups. Rows at or past the
// tile's valid rows and chunks at or past the codes' K are zero-filled (never read), so a tile
// needs no edge case beyond K % 16 == 0 (whole chunks) and 16-byte aligned rows. The tile's rows
// are read back as mma.sync m16n8k32 fragments (a_fragment, b_fragments: ldmatrix, SM75+).

#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>

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

  // The lane's mma.sync m16n8k32 A fragment of rows [row0, row0 + 16) at k32 step `step` (0..3)
  // of the stage: one ldmatrix.x4 of (rows 0-7, K 0-15), (8-15, K 0-15), (0-7, K 16-31), (8-15,
  // K 16-31), a[0..3] in mma order (a row of 8-bit codes is a row of b16 pairs).
  static __device__ __forceinline__ void a_fragment(u32 smem_stage, int row0, int step, int lane, u32 (&a)[4]) {
    ldmatrix_x4(a, chunk_address(smem_stage, row0 + (lane & 15), 2 * step + (lane >> 4)));
  }

  // The lane's B fragments of kPairs x 16 rows from row0 on at k32 step `step` (a row is a column
  // of B): per 16 rows one ldmatrix.x4 of (rows 0-7, K 0-15), (0-7, K 16-31), (8-15, K 0-15),
  // (8-15, K 16-31), the b[0..1] of two n8 fragments.
  template <int kPairs>
  static __device__ __forceinline__ void b_fragments(u32 smem_stage, int row0, int step, int lane,
                                                     u32 (&b)[2 * kPairs][2]) {
    const int row = row0 + (lane & 7) + ((lane >> 4) << 3), chunk = 2 * step + ((lane >> 3) & 1);
#pragma unroll
    for (int pair = 0; pair < kPairs; ++pair) {
      u32 r[4];
      ldmatrix_x4(r, chunk_address(smem_stage, row + 16 * pair, chunk));
      b[2 * pair][0] = r[0];
      b[2 * pair][1] = r[1];
      b[2 * pair + 1][0] = r[2];
      b[2 * pair + 1][1] = r[3];
    }
  }
};

}  // namespace humming_aot::memory
