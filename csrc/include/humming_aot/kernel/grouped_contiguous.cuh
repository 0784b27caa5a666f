#pragma once
// The grouped contiguous MoE GEMM on block-aligned rows (DeepGEMM's contiguous layout with its
// per-row expert index): out[r, n] = a[r, k] @ dequant(w[e])[n, k]^T (+ bias[e]) for the rows
// grouped expert after expert, each expert's rows padded to a whole number of the tile's kBlockM
// rows, e the expert of the first row of r's block. Padding rows (expert -1) inside an expert's
// last block are computed with that expert's weights from whatever a holds there (zero rows give
// the bias, or zeros); blocks of padding only are skipped, their outputs left as they are, and so
// are blocks whose first row's id lies outside [0, E) (no weights are read for them).
//
// A persistent schedule around a dense body, not a body of its own: the grid is at most the
// resident CTAs, and CTA c takes the dense tiles c, c + gridDim.x, ... of all the rows (the dense
// raster), skipping those of padding blocks. A layout padded for 256 experts holds mostly padding
// blocks at small token counts (8 of 240 blocks at one token, top-8): the CTA looks ahead 32 of its
// tiles at once (a lane each reads the expert of one tile's first row: one memory latency per 32
// tiles skipped), then runs the dense body on the first real one (with no L2 prefetch of the next
// tile, unlike the masked schedule: measured 5-10 % slower with it on the H200, log section 27),
// with GemmParams whose weight
// pointers (packed codes, scales, zero points, bias) and global scale are the expert's; the
// activation and output pointers stay, the tile's rows being the expert's. Each CTA waits on the
// upstream grid first (the row experts may be its output). Preconditions (the host states them;
// the kernel cannot see a mixed block): every kBlockM-row block starting at a multiple of kBlockM
// holds one expert's rows (then padding), or padding only; gemm.k_splits == 1; a body with
// run_tile(rows, tile, at_epilogue) taking its tile in the raster of schedule/tile_scheduler.cuh
// (the mma.sync bodies: GemmParams rows; the 8-bit-activation ones, mma-w4a8 and mma-ss, ScaledRows
// with every row's scales, GroupedScaledGemmParams). SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

// The schedule's view of its two Params structs: the GroupedGemmParams part, and the rows every
// tile runs on before its expert's weights are moved in (GemmParams for the 16-bit bodies;
// ScaledRows, with every row's scales, for the 8-bit-activation ones).
__device__ __forceinline__ const GroupedGemmParams& grouped_part(const GroupedGemmParams& g) { return g; }
__device__ __forceinline__ const GroupedGemmParams& grouped_part(const GroupedScaledGemmParams& g) { return g.grouped; }
__device__ __forceinline__ GemmParams all_rows(const GroupedGemmParams& g) { return g.gemm; }
__device__ __forceinline__ ScaledRows all_rows(const GroupedScaledGemmParams& s) {
  return ScaledRows{s.grouped.gemm, s.a_scale, s.a_k, s.a_scale_row_stride};
}

template <class Dense,  // the dense body: run_tile(rows, tile, at_epilogue), the dense raster
          int kBlockM,  // its tile's rows (tokens): the alignment of every expert's rows
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedContiguous {
  static constexpr int kThreads = Dense::kThreads;
  static constexpr int kSmemBytes = Dense::kSmemBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  // the dense body's raster
  static constexpr u32 kGroupM = Dense::Scheduler::kGroupM;

  // The first tile at or after `tile` in this CTA's sequence (tile, tile + gridDim.x, ...) whose
  // block holds an expert's rows, and that expert; `tiles` when there is none. Lane l looks at the
  // CTA's l-th tile from there (every warp the same, so the answer is uniform over the CTA).
  static __device__ __forceinline__ u32 next_real(const GroupedGemmParams& g, u32 tile, u32 m_tiles, u32 n_tiles,
                                                  int& expert) {
    const u32 tiles = m_tiles * n_tiles;
    const u32 lane = threadIdx.x & 31;
    for (; tile < tiles; tile += 32 * gridDim.x) {
      const u32 ahead = tile + lane * gridDim.x;
      int found = -1;
      if (ahead < tiles) {
        int m_tile, n_tile;
        schedule::raster_tile<kGroupM>(ahead, m_tiles, n_tiles, m_tile, n_tile);
        found = g.row_expert[m_tile * kBlockM];
      }
      const u32 real = __ballot_sync(0xffffffffu, found >= 0 && found < g.experts);
      if (real != 0) {
        const int at = __ffs(real) - 1;
        expert = __shfl_sync(0xffffffffu, found, at);
        return tile + static_cast<u32>(at) * gridDim.x;
      }
    }
    return tiles;
  }

  // Params: GroupedGemmParams, or GroupedScaledGemmParams for the 8-bit-activation bodies.
  template <class Params>
  static __device__ __forceinline__ void run(const Params& params) {
    schedule::wait_for_upstream_grid();  // the row experts (and the activations) may come from the previous kernel
    const GroupedGemmParams& g = grouped_part(params);
    const u32 m_tiles = (static_cast<u32>(g.gemm.m) + kBlockM - 1) / kBlockM;
    const u32 n_tiles = (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN;
    const u32 tiles = m_tiles * n_tiles;
    int expert = -1;
    u32 tile = next_real(g, blockIdx.x, m_tiles, n_tiles, expert);
    if (tile >= tiles) schedule::release_dependent_grid();  // no tile for this CTA
    for (bool first = true; tile < tiles; first = false) {
      if (!first) __syncthreads();  // the last tile's warps are done with the shared memory this one refills
      // the CTA's next tile, found before this one runs, so that its last tile's epilogue lets the
      // next kernel in
      int next_expert = -1;
      const u32 next = next_real(g, tile + gridDim.x, m_tiles, n_tiles, next_expert);
      auto p = all_rows(params);
      g.weights.move_to(gemm_part(p), expert);
      const bool last = next >= tiles;
      Dense::run_tile(p, tile, [last] {
        if (last) schedule::release_dependent_grid();
      });
      tile = next;
      expert = next_expert;
    }
  }
};

}  // namespace humming_aot::kernel
