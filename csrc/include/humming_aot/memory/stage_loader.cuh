#pragma once
// Global -> shared loads of one pipeline stage of the dense mixed-input GEMM: a K tile (64 to 512
// wide, a power of two) of activations (swizzled 128-byte rows), packed weights, scales and zero points, issued
// with cp.async by every thread of the CTA. Shared by the mma.sync and the wgmma bodies. SM80+.
//
// Stage layout (byte offsets from the stage base):
//   [0, kABytes)              activations, kBlockK / 64 sub-tiles of (kBlockM rows, 8 chunks of
//                             16 bytes) for 64 K each; chunk c of row r lives at r * 8 + (c ^ (r & 7)):
//                             conflict-free for ldmatrix, and the 128-byte swizzle of wgmma when
//                             the stage base is 1024-byte aligned
//   [kABytes, + kWBytes)      packed weights, (kBlockK / 16 K steps, kUnits, 32 lanes, kBits words)
//   [.., + kSBytes)           scales, (kBlockK / 16 rows, kBlockN), permuted per 64-column unit
//   [.., + kZBytes)           zero points like scales (kHasZeroPoint only)

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::memory {

template <int kBlockM, int kBlockN, int kBlockK, int kBits, bool kHasZeroPoint>
struct StageLayout {
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr int kASubTileBytes = kBlockM * 128;
  static constexpr int kUnits = kBlockN / 64;          // packed 64-column units per CTA
  static constexpr int kScaleRows = kBlockK / 16;      // scale rows staged per K tile (group >= 16)
  static constexpr int kABytes = kBlockM * kBlockK * 2;
  static constexpr int kWBytes = kBlockN * kBlockK * kBits / 8;
  static constexpr int kSBytes = kScaleRows * kBlockN * 2;
  static constexpr int kZBytes = kHasZeroPoint ? kSBytes : 0;
  static constexpr int kBytes = kABytes + kWBytes + kSBytes + kZBytes;  // every part a multiple of 16
  static_assert(kBlockN % 64 == 0, "weights are packed in 64-column units");
  static_assert(kBlockK == 64 || kBlockK == 128 || kBlockK == 256 || kBlockK == 512, "K tiles are 64 to 512 wide");

  // Shared-memory byte offset of 16-byte chunk `chunk` (0 .. kBlockK / 8) of activation row `row`.
  static __device__ __forceinline__ u32 a_chunk_offset(int row, int chunk) {
    return (chunk >> 3) * kASubTileBytes + 16 * (row * 8 + ((chunk & 7) ^ (row & 7)));
  }
};

// How the 16-row K steps of a staged K tile map onto its staged scale rows.
template <int kBlockK>
struct GroupWalk {
  int step_shift;  // scale row of step kk = kk >> step_shift (group >= kBlockK: always row 0)
  __device__ __forceinline__ explicit GroupWalk(int group) {
    const int span = group < kBlockK ? group : kBlockK;  // K of one staged scale row
    step_shift = span >= 512 ? 5 : span == 256 ? 4 : span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0;
  }
};

// Per-thread cp.async issuer of the pipeline stages. Every source pointer and predicate is
// computed once per CTA; a stage load only adds the K offset, so the main loop carries no 64-bit
// multiplies or divisions. Stages must be loaded in K order (advance() after each).
template <int kBlockM, int kBlockN, int kBlockK, int kBits, bool kHasZeroPoint, int kThreads>
struct StageLoader {
  using Layout = StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>;
  static constexpr int kRowChunks = kBlockK / 8;  // 16-byte chunks per activation row
  static constexpr int kAChunks = kBlockM * kRowChunks;  // 16-byte chunks per stage
  static constexpr int kWChunksPerStep = Layout::kUnits * 8 * kBits;
  static constexpr int kWChunks = Layout::kK16Steps * kWChunksPerStep;
  static constexpr int kSChunksPerRow = kBlockN / 8;
  static constexpr int kSChunks = Layout::kScaleRows * kSChunksPerRow;
  static constexpr int kAIters = (kAChunks + kThreads - 1) / kThreads;
  static constexpr int kWIters = (kWChunks + kThreads - 1) / kThreads;
  static constexpr int kSIters = (kSChunks + kThreads - 1) / kThreads;
  static_assert(kAIters <= 32 && kWIters <= 32, "validity bits are kept in one 32-bit mask");

  const char* a_src[kAIters];  // this thread's activation chunks at the current K tile
  u32 a_dst[kAIters];          // their shared-memory offsets inside a stage
  u32 a_valid;                 // bit it: a chunk of this thread, in a row < M
  const u32* w_src[kWIters];   // packed weight chunks at the current K tile
  u32 w_dst;                   // shared-memory offset of chunk 0 (chunk it is kThreads * 16 it further)
  u32 w_issue;                 // bit it: chunk it exists
  u32 w_valid;                 // bit it: its unit is in range (else it is zero-filled)
  i64 w_tile_words;            // words between consecutive K tiles of the packed weight
  const char* s_src;           // first scale row of the current K tile, this thread's column chunk
  const char* z_src;
  i64 s_row_bytes;             // bytes between scale rows (2 n)
  i64 s_offset[kSIters];       // chunk it's row offset from s_src
  u32 s_dst[kSIters];          // chunk it's shared-memory offset inside the scale block
  u32 s_issue;                 // bit it: chunk it exists, its row is staged and its columns < N
  int tiles_per_row;           // K tiles per scale row (group >= 64), else 0
  int tile_in_row;             // position of the current K tile in its scale row
  int rows;                    // scale rows per K tile
  bool s_valid;                // this thread's scale column chunk is in range

  // Unsigned: divisions by the tile constants below then compile to plain shifts and masks.
  static __device__ __forceinline__ u32 chunk(int it) { return threadIdx.x + static_cast<u32>(it * kThreads); }

  __device__ __forceinline__ StageLoader(const kernel::GemmParams& p, int m0, int n0, int k_tile) {
    const char* a = static_cast<const char*>(p.a) + 2 * static_cast<i64>(k_tile) * kBlockK;
    a_valid = 0;
#pragma unroll
    for (int it = 0; it < kAIters; ++it) {
      const u32 i = chunk(it), row = i / kRowChunks;
      const bool valid = (kAChunks % kThreads == 0 || i < kAChunks) && m0 + static_cast<int>(row) < p.m;
      a_valid |= static_cast<u32>(valid) << it;
      a_src[it] = a + 2 * ((valid ? m0 + row : 0) * p.lda + (i % kRowChunks) * 8);
      a_dst[it] = Layout::a_chunk_offset(row, i % kRowChunks);
    }
    const int units_total = p.n >> 6;
    const i64 row_words = static_cast<i64>(units_total) * 32 * kBits;
    w_tile_words = Layout::kK16Steps * row_words;
    const u32* w = static_cast<const u32*>(p.w) + (n0 >> 6) * 32 * kBits + k_tile * w_tile_words;
    w_valid = w_issue = 0;
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      const u32 i = chunk(it), kk = i / kWChunksPerStep, rem = i % kWChunksPerStep;
      const bool exists = kWChunks % kThreads == 0 || i < kWChunks;
      const bool valid = exists && (n0 >> 6) + static_cast<int>(rem / (8 * kBits)) < units_total;
      w_issue |= static_cast<u32>(exists) << it;
      w_valid |= static_cast<u32>(valid) << it;
      w_src[it] = w + (valid ? kk * row_words + rem * 4 : 0);
    }
    w_dst = 16 * threadIdx.x;
    asm volatile("" : "+r"(w_dst));  // kept, not recomputed from threadIdx every stage
    const int group = p.group_size;
    rows = group >= kBlockK ? 1 : kBlockK / group;
    tiles_per_row = group >= kBlockK ? group / kBlockK : 0;
    tile_in_row = group >= kBlockK ? k_tile % tiles_per_row : 0;
    const int row0 = group >= kBlockK ? k_tile / tiles_per_row : k_tile * rows;
    s_row_bytes = 2 * static_cast<i64>(p.n);
    const int col = n0 + static_cast<int>(threadIdx.x % kSChunksPerRow) * 8;
    s_valid = col < p.n;
    const i64 offset = s_valid ? row0 * s_row_bytes + 2 * col : 0;
    s_src = static_cast<const char*>(p.w_scale) + offset;
    z_src = kHasZeroPoint ? static_cast<const char*>(p.w_zero_point) + offset : nullptr;
    s_issue = 0;
#pragma unroll
    for (int it = 0; it < kSIters; ++it) {
      // threads of one column chunk share s_src; row r is r rows further down
      const u32 i = chunk(it), r = i / kSChunksPerRow, c = i % kSChunksPerRow;
      const bool issue = (kSChunks % kThreads == 0 || i < kSChunks) && static_cast<int>(r) < rows && s_valid;
      s_issue |= static_cast<u32>(issue) << it;
      s_offset[it] = issue ? r * s_row_bytes : 0;
      s_dst[it] = 2 * (r * kBlockN + c * 8);
    }
  }

  // Issue the copies of the activations of the current K tile into the stage at `stage_smem`.
  // Rows past M are not loaded: whatever shared memory holds there only reaches output rows
  // (tokens) that are never stored.
  __device__ __forceinline__ void load_activations(u32 stage_smem) const {
#pragma unroll
    for (int it = 0; it < kAIters; ++it) {
      if ((a_valid >> it) & 1) cp_async_16(stage_smem + a_dst[it], a_src[it], true);
    }
  }

  // Issue the copies of the weights, scales and zero points of the current K tile.
  __device__ __forceinline__ void load_weights(u32 stage_smem) const {
    const u32 w_smem = stage_smem + Layout::kABytes + w_dst;
    const u32 s_smem = stage_smem + Layout::kABytes + Layout::kWBytes;
    const u32 z_smem = s_smem + Layout::kSBytes;
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      if ((w_issue >> it) & 1) cp_async_16(w_smem + 16 * kThreads * it, w_src[it], (w_valid >> it) & 1);
    }
    // Scale chunks of columns >= N are not loaded: they only reach outputs that are never stored.
#pragma unroll
    for (int it = 0; it < kSIters; ++it) {
      if ((s_issue >> it) & 1) {
        cp_async_16(s_smem + s_dst[it], s_src + s_offset[it], true);
        if constexpr (kHasZeroPoint) cp_async_16(z_smem + s_dst[it], z_src + s_offset[it], true);
      }
    }
  }

  __device__ __forceinline__ void load(u32 stage_smem) const {
    load_activations(stage_smem);
    load_weights(stage_smem);
  }

  // The pipeline's prologue: stages 0 .. kAhead - 1 at smem_base + s * kStageBytes (those of
  // the `count` K tiles this CTA has), one cp.async group each. The weights, scales and zero
  // points are fetched before waiting for the upstream grid (no kernel writes them,
  // schedule/grid_dependency.cuh) and join the first stage's group; the activations after it.
  template <int kAhead, int kStageBytes>
  __device__ __forceinline__ void load_prologue(u32 smem_base, int count) {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) {
        load_weights(smem_base + s * kStageBytes);
        advance_weights();
      }
    }
    schedule::wait_for_upstream_grid();
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) {
        load_activations(smem_base + s * kStageBytes);
        advance_activations();
      }
      cp_async_commit();
    }
  }

  // Move the activation sources to the next K tile.
  __device__ __forceinline__ void advance_activations() {
#pragma unroll
    for (int it = 0; it < kAIters; ++it) a_src[it] += 2 * kBlockK;
  }

  // Move the weight, scale and zero-point sources to the next K tile.
  __device__ __forceinline__ void advance_weights() {
#pragma unroll
    for (int it = 0; it < kWIters; ++it) w_src[it] += w_tile_words;
    int next_rows = rows;
    if (tiles_per_row > 0) {
      next_rows = ++tile_in_row == tiles_per_row ? 1 : 0;
      if (next_rows) tile_in_row = 0;
    }
    if (s_valid) {
      s_src += next_rows * s_row_bytes;
      if constexpr (kHasZeroPoint) z_src += next_rows * s_row_bytes;
    }
  }

  __device__ __forceinline__ void advance() {
    advance_activations();
    advance_weights();
  }
};

}  // namespace humming_aot::memory
