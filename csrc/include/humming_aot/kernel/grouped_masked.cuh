#pragma once
// The grouped masked MoE GEMM (DeepGEMM's masked layout, DeepEP low-latency decode):
// out[e, m, n] = a[e, m, k] @ dequant(w[e])[n, k]^T (+ bias) for every expert e and its first
// expert_rows[e] rows of a slab of max_m; the rows past the count are neither read for any stored
// output nor written. A persistent schedule around a dense body, not a body of its own: the grid
// is at most the resident CTAs, and CTA c runs the tiles c, c + gridDim.x, ... of the real work,
// the dense tiles of expert 0's rows, then expert 1's, and so on (an expert of r rows has
// ceil(r / kBlockM) x n_tiles tiles: the dense raster of r rows is a bijection onto them). An
// empty expert costs no CTA: with 256 experts of which 8 hold a token, one CTA per tile of every
// slab would launch 32 times the CTAs that have work.
//
// The same schedule runs the grouped contiguous layout with no alignment (DeepGEMM's offsets
// form): rows grouped expert after expert in one (m, K) activation, expert e owning rows
// [row_offsets[e], row_offsets[e + 1]) (each offset clamped to [0, m], so that no expert's rows
// leave the tensors), its "slab" then starting at its first row. Its tiles are the dense tiles of
// those rows, so an expert's last tile ends at its last row and no row needs padding; rows of no
// expert are neither read nor written. The offsets must rise (the caller's contract, not checked):
// offsets that do not rise make experts overlap, whose rows are then computed twice or not at all
// (the walk finds no tile past the bound of tile_limit, nor one that wrapped the 32-bit tile
// counts); no row outside the tensors and no split-K counter past the bound is touched.
//
// Each CTA waits on the upstream grid (the counts may be its output), then finds each tile's
// expert by walking the counts in windows of 256 experts (ExpertWalk: every warp computes the same
// walk, so the result is uniform without shared memory), one tile ahead: while it runs a tile, the
// next one's weights are on their way into L2 (Dense::prefetch_tile; CTAs of more than 4 warps,
// kPrefetchNext), so that the tiles of one CTA (a few dozen of short K at decode sizes) do not each
// wait on DRAM for their first stages. Each
// tile runs the dense body on a copy of GemmParams whose pointers are moved to the expert's slab,
// whose M is the count and whose global scale is the expert's. A count outside [0, max_m] is read
// as the nearest bound. K slices (gridDim.y = gemm.k_splits, the offsets form only): every CTA
// (x, y) walks the tiles of column x with slice y, and the dense body reduces a tile's slices
// through the workspace; an expert's partials lie at workspace + k_splits x first row x N floats
// (the experts' row ranges are disjoint, so are their (k_splits, rows, N) blocks: k_splits x R x
// N floats in all) and its tiles' counters at tile_counters + the walk's index of its first tile
// (as many counters as tiles, zero between launches: the last slice of a tile resets its own).
// Preconditions (the host checks them): gemm.k_splits == 1 for slabs; a body with
// run_tile(rows, tile, at_epilogue) and prefetch_tile(rows, tile), rows being what expert_tile
// makes of the Params: GemmParams for the 16-bit mma.sync bodies (MaskedGemmParams), ScaledRows
// for the 8-bit-activation ones (MaskedScaledGemmParams: codes, lda in bytes, and per-row scales).
// SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::kernel {

// Where a persistent CTA's tile lies among the experts' tiles: find(tile) walks the counts from
// expert 0 in windows of 256 experts, 8 consecutive ones per lane (eight independent loads: one
// memory latency per window, L1 hits after a CTA's first tile), a warp scan of the lanes' tiles,
// and a ballot for the lane whose experts hold the tile (with offsets, each count is the
// difference of two clamped offsets). The walk keeps no state between tiles (the schedule keeps
// the next tile's three values; the 8-bit 8-row tiles still fit 128 registers without spills): with
// at most 256 experts each find reads one window.
template <int kBlockM>
struct ExpertWalk {
  static constexpr int kPerLane = 8;
  static constexpr u32 kWindow = 32 * kPerLane;

  const int* rows_of;  // the counts (slabs)
  const int* offsets;  // the prefix offsets of the rows (one activation), or nullptr (slabs)
  u32 experts, max_rows, n_tiles;

  // The tiles a walk may find: every tile with slabs; with offsets, the most that R rows make,
  // (R / kBlockM + min(E, R)) x n_tiles (rows summing to at most R, in at most min(E, R) experts
  // with rows, each with one partial tile at most), which the host sizes the split-K counters by:
  // offsets that do not rise (more rows in all) find no tile past it.
  __device__ __forceinline__ u32 tile_limit() const {
    if (offsets == nullptr) return 0xffffffffu;
    return (max_rows / kBlockM + (experts < max_rows ? experts : max_rows)) * n_tiles;
  }

  // v clamped to [lo, max_rows].
  __device__ __forceinline__ u32 clamp_rows(int v, u32 lo) const {
    return v <= static_cast<int>(lo) ? lo : (static_cast<u32>(v) < max_rows ? static_cast<u32>(v) : max_rows);
  }

  // Expert e's first row: 0 in its slab; with offsets, offsets[e] clamped to [0, max_rows].
  __device__ __forceinline__ u32 first_row(u32 e) const { return offsets == nullptr ? 0u : clamp_rows(offsets[e], 0); }

  // The rows of experts [base, base + kPerLane) (0 past the last expert): each count clamped to
  // [0, max_rows]; with offsets, from the expert's first row to offsets[e + 1] clamped to [first
  // row, max_rows], so that no expert's rows leave the activation and output, whatever the
  // offsets hold. The form is uniform (a launch argument), tested once; each form issues all of
  // its loads (predicated, no branch per expert) before it uses any.
  __device__ __forceinline__ void rows_from(u32 base, u32 (&counts)[kPerLane]) const {
    if (offsets != nullptr) {
      int bound[kPerLane + 1];
#pragma unroll
      for (int i = 0; i <= kPerLane; ++i) bound[i] = base + i <= experts ? offsets[base + i] : 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const u32 lo = clamp_rows(bound[i], 0);
        counts[i] = base + i < experts ? clamp_rows(bound[i + 1], lo) - lo : 0u;
      }
    } else {
      int count[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) count[i] = base + i < experts ? rows_of[base + i] : 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) counts[i] = clamp_rows(count[i], 0);
    }
  }

  __device__ __forceinline__ u32 tiles(u32 r) const { return (r + kBlockM - 1) / kBlockM * n_tiles; }

  // The expert, its rows and the tile's index among the expert's tiles of tile `tile`; false when
  // the experts hold fewer tiles. Uniform over the CTA (every warp reads the same counts).
  __device__ __forceinline__ bool find(u32 tile, u32& expert, u32& expert_rows, u32& local) const {
    const u32 limit = tile_limit();
    if (tile >= limit) return false;
    const u32 lane = threadIdx.x & 31;
    u32 before = 0;  // tiles of the experts before the window
    for (u32 first = 0; first < experts; first += kWindow) {
      const u32 base = first + lane * kPerLane;
      u32 counts[kPerLane];
      rows_from(base, counts);  // all loads in flight at once
      u32 sum = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) sum += tiles(counts[i]);
      u32 inclusive = sum;  // the warp's inclusive scan of the lanes' sums
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const u32 other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= static_cast<u32>(offset)) inclusive += other;
      }
      const u32 window_tiles = __shfl_sync(0xffffffffu, inclusive, 31);
      if (tile < before + window_tiles) {
        const u32 in_window = tile - before;
        // the lane whose experts hold the tile: the last lane that starts at or before it (a
        // lane of no tiles starts where the next lane does, past the tile if that one is)
        const u32 starts = __ballot_sync(0xffffffffu, inclusive - sum <= in_window);
        const int holder = 31 - __clz(starts);
        u32 at = __shfl_sync(0xffffffffu, inclusive - sum, holder);
        bool hit = false;  // always, unless the tile counts wrapped (offsets that do not rise)
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const u32 t = __shfl_sync(0xffffffffu, tiles(counts[i]), holder);
          const u32 r = __shfl_sync(0xffffffffu, counts[i], holder);
          // (an expert whose tiles would pass the limit is not found either: the split-K counters
          // of its tiles would)
          if (in_window >= at && in_window < at + t && before + at + t <= limit) {
            expert = first + static_cast<u32>(holder) * kPerLane + i;
            expert_rows = r;
            local = in_window - at;
            hit = true;
          }
          at += t;
        }
        return hit;  // a miss ends the CTA's walk rather than run a tile of no expert
      }
      before += window_tiles;
    }
    return false;
  }
};

// The schedule's view of its two Params structs: the MaskedGemmParams part, and the rows one tile
// of expert e runs on: tile_rows makes them (m = the expert's rows) and move_to_expert moves them to
// the expert's weights and to its rows from `first` on. 16-bit activations (GemmParams): a and out
// move by 2-byte elements. 8-bit codes (ScaledRows): a by bytes (lda in bytes), the scales by rows.
__device__ __forceinline__ const MaskedGemmParams& masked_part(const MaskedGemmParams& g) { return g; }
__device__ __forceinline__ const MaskedGemmParams& masked_part(const MaskedScaledGemmParams& g) { return g.masked; }

__device__ __forceinline__ GemmParams tile_rows(const MaskedGemmParams& g, u32 rows) {
  GemmParams p = g.gemm;
  p.m = static_cast<int>(rows);
  return p;
}

__device__ __forceinline__ ScaledRows tile_rows(const MaskedScaledGemmParams& s, u32 rows) {
  return ScaledRows{tile_rows(s.masked, rows), s.a_scale, s.a_k, s.a_scale_row_stride};
}

__device__ __forceinline__ void move_to_expert(GemmParams& p, const MaskedGemmParams& g, u32 expert, i64 first) {
  p.a = static_cast<const char*>(p.a) + expert * g.a_stride + first * p.lda * 2;
  p.out = static_cast<char*>(p.out) + expert * g.out_stride + first * p.ldo * 2;
  g.weights.move_to(p, static_cast<int>(expert));
}

__device__ __forceinline__ void move_to_expert(ScaledRows& r, const MaskedScaledGemmParams& s, u32 expert, i64 first) {
  const MaskedGemmParams& g = s.masked;
  r.gemm.a = static_cast<const char*>(r.gemm.a) + expert * g.a_stride + first * r.gemm.lda;
  r.gemm.out = static_cast<char*>(r.gemm.out) + expert * g.out_stride + first * r.gemm.ldo * 2;
  r.a_scale += expert * s.a_scale_stride + first * s.a_scale_row_stride;
  g.weights.move_to(r.gemm, static_cast<int>(expert));
}

template <class Dense,  // the dense body: run_tile(rows, tile, at_epilogue), prefetch_tile(rows, tile)
          int kBlockM,  // its tile's rows (tokens)
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedMasked {
  static constexpr int kThreads = Dense::kThreads;
  static constexpr int kSmemBytes = Dense::kSmemBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  // Whether a CTA prefetches its next tile's weights into L2. Not with CTAs of 4 warps: those run
  // four per SM (the 8-row decode tile of 128 of K per stage), 528 CTAs each streaming its tile
  // while its next one's first 32 KB wait in L2, and enough of those lines are evicted before their
  // tile runs that they are read twice: Qwen3-30B's down projection at 16 tokens moved 99 MB
  // through DRAM with the prefetch and 77 MB without (Humming: 72), and took 7 % longer; its
  // gate_up 4 %; DeepSeek-V3 TP8's gate_up (K 7168) on the same tile at 16 / 64 tokens moved
  // within 1 % either way. The 8-warp decode tiles (two per SM, half the bytes waiting) keep it.
  // docs/performance/log.md section 52.
  static constexpr bool kPrefetchNext = kThreads > 128;

  // Params: MaskedGemmParams, or MaskedScaledGemmParams for the 8-bit-activation body.
  template <class Params>
  static __device__ __forceinline__ void run(const Params& params) {
    schedule::wait_for_upstream_grid();  // the counts (and the activations) may come from the previous kernel
    const MaskedGemmParams& g = masked_part(params);
    const ExpertWalk<kBlockM> walk{g.expert_rows, g.row_offsets, static_cast<u32>(g.experts),
                                   static_cast<u32>(g.gemm.m), (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN};
    u32 expert, rows, local;
    if (!walk.find(blockIdx.x, expert, rows, local)) {
      schedule::release_dependent_grid();  // no tile for this CTA
      return;
    }
    for (u32 tile = blockIdx.x;; tile += gridDim.x) {
      // the CTA's next tile, found before this one runs: its weights are prefetched into L2 now,
      // and this tile's epilogue lets the next kernel in when there is none
      u32 next_expert, next_rows, next_local;
      const bool more = walk.find(tile + gridDim.x, next_expert, next_rows, next_local);
      if (kPrefetchNext && more) {  // (a prefetch reads the weights only)
        auto next = tile_rows(params, next_rows);
        g.weights.move_to(gemm_part(next), static_cast<int>(next_expert));
        Dense::prefetch_tile(next, next_local);
      }
      auto p = tile_rows(params, rows);
      const i64 first = walk.first_row(expert);  // the expert's rows in its slab, or among all rows
      move_to_expert(p, params, expert, first);
      GemmParams& gemm = gemm_part(p);
      if (gemm.k_splits > 1) {  // (the offsets form) the expert's own partials and counters
        gemm.workspace += first * gemm.k_splits * gemm.n;
        gemm.tile_counters += tile - local;
      }
      Dense::run_tile(p, local, [more] {
        if (!more) schedule::release_dependent_grid();
      });
      if (!more) return;
      expert = next_expert;
      rows = next_rows;
      local = next_local;
      __syncthreads();  // the last tile's warps are done with the shared memory the next one refills
    }
  }
};

}  // namespace humming_aot::kernel
