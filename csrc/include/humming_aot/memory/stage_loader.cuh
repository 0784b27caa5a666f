#pragma once
// Global -> shared loads of one pipeline stage of the dense mixed-input GEMM, issued with cp.async:
// a K run (16 to 512 wide, a power of two) of activations (swizzled 128-byte rows), packed
// weights, scales and zero points. Shared by the mma.sync and the wgmma bodies. SM80+.
//
// Who copies what: a CTA-wide loader (kThreads = the CTA's threads) copies a whole kBlockK-wide K
// tile of the CTA's columns, and every warp reads its part after a CTA barrier; a per-warp loader
// (kThreads = 32, the swapped 8-, 16- and 32-token tiles) copies only what its warp multiplies - the run of K
// steps [k_offset, + kBlockK) of each kStageK-wide K tile, for the warp's 64 columns - into a
// region of the stage that no other warp reads, so the main loop needs no CTA barrier. Scale
// rows and activations that several warps share are then copied once per warp.
//
// Stage (or warp region) layout, byte offsets from its base:
//   [0, kABytes)              activations, max(1, kBlockK / 64) sub-tiles of (kBlockM rows, 8 chunks
//                             of 16 bytes) for 64 K each; chunk c of row r lives at r * 8 + (c ^ (r & 7)):
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
  static constexpr int kASubTiles = kBlockK >= 64 ? kBlockK / 64 : 1;
  static constexpr int kASubTileBytes = kBlockM * 128;
  static constexpr int kUnits = kBlockN / 64;      // packed 64-column units per CTA
  static constexpr int kScaleRows = kBlockK / 16;  // scale rows staged per K tile (group >= 16)
  static constexpr int kABytes = kASubTiles * kASubTileBytes;
  static constexpr int kWBytes = kBlockN * kBlockK * kBits / 8;
  static constexpr int kSBytes = kScaleRows * kBlockN * 2;
  static constexpr int kZBytes = kHasZeroPoint ? kSBytes : 0;
  static constexpr int kBytes = kABytes + kWBytes + kSBytes + kZBytes;  // every part a multiple of 16
  static_assert(kBlockN % 64 == 0, "weights are packed in 64-column units");
  static_assert(kBlockK >= 16 && kBlockK <= 512 && (kBlockK & (kBlockK - 1)) == 0,
                "K runs are 16 to 512 wide, a power of two");

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

// cp.async issuer of the pipeline stages (see the top of the file): the K run [k_offset,
// + kBlockK) of every kStageK-wide K tile, columns [n0, + kBlockN), rows [m0, + kBlockM), by
// kThreads issuers (`issuer` is this thread's index among them). Every source pointer and
// predicate is computed once per CTA; a stage load only adds the K offset, so the main loop
// carries no 64-bit multiplies or divisions. Stages must be loaded in K order (advance() after
// each).
//
// Set up in three parts, in the order load_prologue() issues the first stages: the constructor
// computes only the packed-weight sources (they need nothing but the tile), so the first DRAM
// requests leave within a few dozen instructions of the kernel's start; the scale sources (a
// division for groups wider than a K tile) and the activation sources follow inside
// load_prologue(), which must be called once before load() or advance().
template <int kBlockM, int kBlockN, int kBlockK, int kBits, bool kHasZeroPoint, int kThreads, int kStageK = kBlockK>
struct StageLoader {
  using Layout = StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>;
  static constexpr int kRowChunks = kBlockK / 8;         // 16-byte chunks per activation row
  static constexpr int kAChunks = kBlockM * kRowChunks;  // 16-byte chunks per stage
  static constexpr int kWChunksPerStep = Layout::kUnits * 8 * kBits;
  static constexpr int kWChunks = Layout::kK16Steps * kWChunksPerStep;
  static constexpr int kSChunksPerRow = kBlockN / 8;
  static constexpr int kSChunks = Layout::kScaleRows * kSChunksPerRow;
  static constexpr int kAIters = (kAChunks + kThreads - 1) / kThreads;
  static constexpr int kWIters = (kWChunks + kThreads - 1) / kThreads;
  static constexpr int kSIters = (kSChunks + kThreads - 1) / kThreads;
  // scale rows that one pass of the issuers covers
  static constexpr int kSRowsPerIter = kThreads / kSChunksPerRow;
  // Activation chunk i = issuer + it * kThreads lies in row i / kRowChunks, column chunk
  // i % kRowChunks. Both counts are powers of two, so either a pass covers whole rows (the column
  // chunk is the issuer's in every pass) or a row takes whole passes (every issuer starts in row
  // 0): pass it's chunk is pass 0's moved by a compile-time number of rows and column chunks.
  static_assert((kThreads % kRowChunks == 0) || (kRowChunks % kThreads == 0), "activation passes: powers of two");
  static constexpr int kAPassRows = kThreads >= kRowChunks ? kThreads / kRowChunks : 0;
  static constexpr int kAPassesPerRow = kThreads >= kRowChunks ? 1 : kRowChunks / kThreads;
  static __device__ __forceinline__ constexpr int a_pass_rows(int it) {
    return kThreads >= kRowChunks ? it * kAPassRows : it / kAPassesPerRow;
  }
  static __device__ __forceinline__ constexpr int a_pass_chunks(int it) {
    return kThreads >= kRowChunks ? 0 : (it % kAPassesPerRow) * kThreads;
  }
  static_assert(kAIters <= 32 && kWIters <= 32, "validity bits are kept in one 32-bit mask");
  static_assert(kThreads % kSChunksPerRow == 0, "every pass over the scale chunks starts a new scale row");
  static_assert(kStageK % kBlockK == 0, "the K run lies inside a K tile");

  // The per-warp loader (the swapped tiles, 8 to 32 tokens) keeps one activation source, pass 0's, and
  // skips passes past M with a branch; CTA-wide loaders keep one source per pass and predicate
  // (fewer instructions in their stages, docs/performance/log.md section 16).
  static constexpr bool kOneActivationSource = kThreads == 32;
  const char* a_src[kOneActivationSource ? 1 : kAIters];  // this thread's activation chunks at the current K tile
  i64 a_row_bytes;                                        // bytes between activation rows (2 lda)
  u32 a_dst[kAIters];                                     // the shared-memory addresses of its chunks in stage 0
  u32 a_valid;                                            // bit it: a chunk of this thread, in a row < M
  u32 a_bytes0;               // kOneActivationSource: pass 0's source bytes, 16 (a row < M) or 0 (zero-filled)
  int a_iters;                // passes with a row < M for some issuer (uniform)
  bool a_all_rows;            // every row of the tile is < M (uniform)
  const u32* w_src[kWIters];  // packed weight chunks at the current K tile
  u32 w_dst;                  // shared-memory address of chunk 0 in stage 0 (chunk it is kThreads * 16 it further)
  u32 w_issue;                // bit it: chunk it exists
  u32 w_valid;                // bit it: its unit is in range (else it is zero-filled)
  i64 w_tile_words;           // words between consecutive K tiles of the packed weight
  const char* s_src;          // this thread's first scale chunk (pass 0) at the current K tile
  const char* z_src;
  i64 s_row_bytes;    // bytes between scale rows (2 n)
  i64 s_next_bytes;   // bytes from the scale rows of a K tile to those of the next K tile
                      // that has new ones
  u32 s_dst;          // pass 0's shared-memory address in stage 0
  u32 s_issue;        // bit it: pass it's chunk exists, its row is staged and its columns < N
  int s_iters;        // passes that stage some row (uniform)
  int tiles_per_row;  // K tiles per staged scale row: group / kStageK (group >= kStageK), else 1
  int tile_in_row;    // position of the current K tile in its scale row
  int rows;           // scale rows staged per K tile
  // the loader's place, kept for load_prologue's later setup steps
  int m0_, n0_, k_tile_, k_offset_;
  u32 issuer_;

  // Unsigned: divisions by the tile constants below then compile to plain shifts and masks.
  __device__ __forceinline__ u32 chunk(int it) const { return issuer_ + static_cast<u32>(it * kThreads); }

  // The packed-weight sources of K tile k_tile (and the place of the loader, for load_prologue).
  __device__ __forceinline__ StageLoader(const kernel::GemmParams& p, int m0, int n0, int k_tile, int k_offset = 0,
                                         u32 issuer = threadIdx.x)
      : m0_(m0), n0_(n0), k_tile_(k_tile), k_offset_(k_offset), issuer_(issuer) {
    const int units_total = p.n >> 6;
    const i64 row_words = static_cast<i64>(units_total) * 32 * kBits;
    w_tile_words = (kStageK / 16) * row_words;
    const u32* w =
        static_cast<const u32*>(p.w) + (n0 >> 6) * 32 * kBits + k_tile * w_tile_words + (k_offset / 16) * row_words;
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
    w_dst = 16 * issuer;
    asm volatile("" : "+r"(w_dst));  // kept, not recomputed from threadIdx every stage
  }

  // The scale and zero-point sources of the current K tile. A group narrower than a K tile divides
  // it (humming_aot.heuristics.tile_fits), so it is a power of two and needs no division.
  __device__ __forceinline__ void init_scales(const kernel::GemmParams& p, u32 smem_base) {
    const u32 group = static_cast<u32>(p.group_size), tile = static_cast<u32>(k_tile_);
    s_row_bytes = 2 * static_cast<i64>(p.n);
    u32 row0;
    if (group >= kStageK) {
      rows = 1;
      tiles_per_row = static_cast<int>(group / kStageK);
      row0 = tile / static_cast<u32>(tiles_per_row);
      tile_in_row = static_cast<int>(tile - row0 * static_cast<u32>(tiles_per_row));
      s_next_bytes = s_row_bytes;
    } else {
      const int shift = 31 - __clz(group);
      rows = kBlockK >> shift > 0 ? kBlockK >> shift : 1;
      tiles_per_row = 1;
      tile_in_row = 0;
      row0 = (tile * kStageK + static_cast<u32>(k_offset_)) >> shift;
      s_next_bytes = (kStageK >> shift) * s_row_bytes;
    }
    s_iters = (rows * kSChunksPerRow + kThreads - 1) / kThreads;
    // issuers of one column chunk share a column; pass it reads row r0 + it * kSRowsPerIter
    const u32 r0 = issuer_ / kSChunksPerRow, c = issuer_ % kSChunksPerRow;
    const int col = n0_ + static_cast<int>(c) * 8;
    const bool col_valid = col < p.n;
    const i64 offset = col_valid ? (row0 + r0) * s_row_bytes + 2 * col : 0;
    s_src = static_cast<const char*>(p.w_scale) + offset;
    z_src = kHasZeroPoint ? static_cast<const char*>(p.w_zero_point) + offset : nullptr;
    s_dst = smem_base + Layout::kABytes + Layout::kWBytes + 2 * (r0 * kBlockN + c * 8);
    s_issue = 0;
#pragma unroll
    for (int it = 0; it < kSIters; ++it) {
      const u32 i = chunk(it), r = i / kSChunksPerRow;
      const bool issue = (kSChunks % kThreads == 0 || i < kSChunks) && static_cast<int>(r) < rows && col_valid;
      s_issue |= static_cast<u32>(issue) << it;
    }
    asm volatile("" : "+r"(s_dst));  // kept, not recomputed from threadIdx every stage
  }

  // The activation sources of the current K tile.
  __device__ __forceinline__ void init_activations(const kernel::GemmParams& p, u32 smem_base) {
    const char* a = static_cast<const char*>(p.a) + 2 * (static_cast<i64>(k_tile_) * kStageK + k_offset_);
    const int rows_left = p.m - m0_;
    a_iters = rows_left >= kBlockM ? kAIters : (rows_left * kRowChunks + kThreads - 1) / kThreads;
    if constexpr (kOneActivationSource) {
      a_all_rows = rows_left >= kBlockM;
      // pass 0's chunk; its row, or row 0 where that is past M (the chunks of rows past M are
      // zero-filled from a source that stays inside the activations)
      a_row_bytes = 2 * p.lda;
      const u32 row0 = issuer_ / kRowChunks, chunk0 = issuer_ % kRowChunks;
      const i64 src_row = static_cast<int>(row0) < rows_left ? m0_ + static_cast<int>(row0) : 0;
      a_src[0] = a + 2 * (src_row * p.lda + chunk0 * 8);
    }
    a_valid = 0;
#pragma unroll
    for (int it = 0; it < kAIters; ++it) {
      const u32 i = chunk(it), row = i / kRowChunks;  // = row0 + a_pass_rows(it)
      const bool valid = (kAChunks % kThreads == 0 || i < kAChunks) && static_cast<int>(row) < rows_left;
      a_valid |= static_cast<u32>(valid) << it;
      if constexpr (!kOneActivationSource) a_src[it] = a + 2 * ((valid ? m0_ + row : 0) * p.lda + (i % kRowChunks) * 8);
      a_dst[it] = smem_base + Layout::a_chunk_offset(row, i % kRowChunks);
    }
    // kept: the pass every stage issues, and whether its row is < M, not recomputed
    if constexpr (kOneActivationSource) {
      a_bytes0 = (a_valid & 1) ? 16u : 0u;
      asm volatile("" : "+r"(a_dst[0]), "+r"(a_bytes0));
    }
  }

  // Issue the copies of the activations of the current K tile into the stage `stage_offset` bytes
  // after stage 0 (so for every load below).
  // Rows past M only reach output rows (tokens) that are never stored: CTA-wide loaders leave
  // their chunks alone, the per-warp loader zero-fills them without a global read and skips the
  // passes whose rows are all past M by a (uniform) branch (at M = 1: one pass, not kAIters).
  __device__ __forceinline__ void load_activations(u32 stage_offset) const {
    if constexpr (!kOneActivationSource) {
#pragma unroll
      for (int it = 0; it < kAIters; ++it) {
        if (it < a_iters && ((a_valid >> it) & 1)) cp_async_16(stage_offset + a_dst[it], a_src[it], true);
      }
    } else if (a_all_rows) {  // straight-line code
#pragma unroll
      for (int it = 0; it < kAIters; ++it) load_activation_pass<false>(stage_offset, it);
    } else {
#pragma unroll
      for (int it = 0; it < kAIters; ++it) {
        if (it > 0 && it >= a_iters) break;
        load_activation_pass<true>(stage_offset, it);
      }
    }
  }

  // Pass it of the activation copies (kRowsPastM: some of its rows may be past M, whose chunks
  // get zeros and keep a source inside the activations); a thread without a chunk in the last
  // pass issues nothing.
  template <bool kRowsPastM>
  __device__ __forceinline__ void load_activation_pass(u32 stage_offset, int it) const {
    if (!(kAChunks % kThreads == 0 || chunk(it) < kAChunks)) return;  // no chunk of this thread in the pass
    if (it == 0) {                                                    // its source is a_src[0] either way
      cp_async_16_bytes(stage_offset + a_dst[0], a_src[0], a_bytes0);
      return;
    }
    const bool valid = (a_valid >> it) & 1;
    const char* src = a_src[0] + a_pass_rows(it) * a_row_bytes + 16 * a_pass_chunks(it);
    if (kRowsPastM && !valid) src = a_src[0];
    cp_async_16(stage_offset + a_dst[it], src, valid);
  }

  // Issue the copies of the packed weights of the current K tile.
  __device__ __forceinline__ void load_packed(u32 stage_offset) const {
    const u32 w_smem = stage_offset + w_dst;
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      if ((w_issue >> it) & 1) cp_async_16(w_smem + 16 * kThreads * it, w_src[it], (w_valid >> it) & 1);
    }
  }

  // Issue the copies of the scales and zero points of the current K tile. Chunks of columns >= N
  // are not loaded: they only reach outputs that are never stored.
  __device__ __forceinline__ void load_scales(u32 stage_offset) const {
#pragma unroll
    for (int it = 0; it < kSIters; ++it) {
      if (it > 0 && it >= s_iters) break;  // passes past the staged rows (uniform) issue nothing
      load_scale_pass(stage_offset, it);
    }
  }

  // Pass it of the scale and zero-point copies.
  __device__ __forceinline__ void load_scale_pass(u32 stage_offset, int it) const {
    if ((s_issue >> it) & 1) {
      const i64 pass = static_cast<i64>(it) * kSRowsPerIter * s_row_bytes;
      const u32 dst = stage_offset + s_dst + 2 * it * kSRowsPerIter * kBlockN;
      cp_async_16(dst, s_src + pass, true);
      if constexpr (kHasZeroPoint) cp_async_16(dst + Layout::kSBytes, z_src + pass, true);
    }
  }

  __device__ __forceinline__ void load(u32 stage_offset) const {
    load_activations(stage_offset);
    load_packed(stage_offset);
    load_scales(stage_offset);
  }

  // load() where the caller knows (uniformly, for the whole loop) that every row of the tile lies
  // in the first activation pass (kRowsInPass0: M - m0 <= kAPassRows) and/or that a K tile stages
  // one scale row (kOneScaleRow: s_iters == 1); the passes it leaves out would issue nothing, and
  // the per-warp loader then tests for none of them.
  template <bool kRowsInPass0, bool kOneScaleRow>
  __device__ __forceinline__ void load_known(u32 stage_offset) const {
    if constexpr (kRowsInPass0) {
      static_assert(kOneActivationSource, "pass 0 alone: the per-warp loader");
      load_activation_pass<true>(stage_offset, 0);
    } else {
      load_activations(stage_offset);
    }
    load_packed(stage_offset);
    if constexpr (kOneScaleRow) {
      load_scale_pass(stage_offset, 0);
    } else {
      load_scales(stage_offset);
    }
  }

  // Whether every K tile has new scale rows (a group no wider than a K tile): advance<true>() then
  // moves the scale sources without counting K tiles. Uniform.
  __device__ __forceinline__ bool scales_every_tile() const { return tiles_per_row == 1; }

  // The pipeline's prologue: stages 0 .. kAhead - 1 at smem_base + s * kStageBytes (those of the
  // `count` K tiles this CTA has), one cp.async group each; smem_base is folded into every
  // shared-memory address here, so later stages are load(their offset from stage 0). In the
  // order that gets the first DRAM requests out soonest: the packed weights, then the scales and
  // zero points (fetched before waiting for the upstream grid: no kernel writes them,
  // schedule/grid_dependency.cuh; they join the first stage's group), then `setup()` (the
  // caller's own per-thread setup, done while those copies fly and the upstream grid finishes),
  // then the wait for the upstream grid and the activations.
  template <int kAhead, int kStageBytes, class Setup>
  __device__ __forceinline__ void load_prologue(const kernel::GemmParams& p, u32 smem_base, int count, Setup&& setup) {
    w_dst += smem_base + Layout::kABytes;
    asm volatile("" : "+r"(w_dst));  // kept, not recomputed from threadIdx every stage
    each_prologue_stage<kAhead, kStageBytes, false>(count, [&](u32 stage_offset) {
      load_packed(stage_offset);
      advance_packed();
    });
    init_scales(p, smem_base);
    each_prologue_stage<kAhead, kStageBytes, false>(count, [&](u32 stage_offset) {
      load_scales(stage_offset);
      advance_scales();
    });
    setup();
    schedule::wait_for_upstream_grid();
    init_activations(p, smem_base);
    each_prologue_stage<kAhead, kStageBytes, true>(count, [&](u32 stage_offset) {
      load_activations(stage_offset);
      advance_activations();
    });
  }

  // load(stage s's offset) for each of the prologue's stages 0 .. kAhead - 1 that the CTA has;
  // kCommit: then one cp.async group per stage, had or not.
  template <int kAhead, int kStageBytes, bool kCommit, class Load>
  static __device__ __forceinline__ void each_prologue_stage(int count, Load&& load) {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) load(static_cast<u32>(s * kStageBytes));
      if constexpr (kCommit) cp_async_commit();
    }
  }

  // Move the activation sources to the next K tile.
  __device__ __forceinline__ void advance_activations() {
#pragma unroll
    for (int it = 0; it < (kOneActivationSource ? 1 : kAIters); ++it) a_src[it] += 2 * kStageK;
  }

  // Move the packed-weight sources to the next K tile.
  __device__ __forceinline__ void advance_packed() {
#pragma unroll
    for (int it = 0; it < kWIters; ++it) w_src[it] += w_tile_words;
  }

  // Move the scale and zero-point sources to the next K tile (kEveryTile: scales_every_tile()).
  template <bool kEveryTile = false>
  __device__ __forceinline__ void advance_scales() {
    if constexpr (!kEveryTile) {
      if (++tile_in_row != tiles_per_row) return;  // the same scale rows
      tile_in_row = 0;
    }
    s_src += s_next_bytes;
    if constexpr (kHasZeroPoint) z_src += s_next_bytes;
  }

  template <bool kScalesEveryTile = false>
  __device__ __forceinline__ void advance() {
    advance_activations();
    advance_packed();
    advance_scales<kScalesEveryTile>();
  }
};

}  // namespace humming_aot::memory
