#pragma once
// The grouped contiguous MoE GEMM on block-aligned rows (DeepGEMM's contiguous layout with its
// per-row expert index): out[r, n] = a[r, k] @ dequant(w[e])[n, k]^T (+ bias[e]) for the rows
// grouped expert after expert, each expert's rows padded to a whole number of the tile's kBlockM
// rows, e the expert of the first row of r's block. Padding rows (expert -1) inside an expert's
// last block are computed with that expert's weights from whatever a holds there (zero rows give
// the bias, or zeros); blocks of padding only are skipped, their outputs left as they are. A
// schedule around a
// dense body, not a body of its own: the grid is the dense body's over all the rows; each CTA waits
// on the upstream grid (the row experts may be its output), finds its tile with the dense raster,
// reads the expert of the tile's first row, leaves at once when that is padding, and runs the dense
// body on GemmParams whose weight pointers (packed codes, scales, zero points, bias) and global
// scale are the expert's; the activation and output pointers stay, the tile's rows being the
// expert's. Preconditions (the host states them; the kernel cannot see a mixed block): every
// kBlockM-row block starting at a multiple of kBlockM holds one expert's rows (then padding), or
// padding only;
// gemm.k_splits == 1; a body whose run takes GemmParams and its tile from blockIdx.x with the
// raster of schedule/tile_scheduler.cuh (the mma.sync bodies). SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Dense,  // the dense body: run(const GemmParams&), tile from blockIdx.x
          int kBlockM,  // its tile's rows (tokens): the alignment of every expert's rows
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedContiguous {
  static constexpr int kThreads = Dense::kThreads;
  static constexpr int kSmemBytes = Dense::kSmemBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  // the dense body's raster
  static constexpr u32 kGroupM = Dense::Scheduler::kGroupM;

  static __device__ __forceinline__ void run(const GroupedGemmParams& g) {
    schedule::wait_for_upstream_grid();  // the row experts (and the activations) may come from the previous kernel
    const u32 m_tiles = (static_cast<u32>(g.gemm.m) + kBlockM - 1) / kBlockM;
    const u32 n_tiles = (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN;
    int m_tile, n_tile;
    schedule::raster_tile<kGroupM>(blockIdx.x, m_tiles, n_tiles, m_tile, n_tile);
    const int expert = g.row_expert[m_tile * kBlockM];
    if (expert < 0) return;  // a block of padding rows (uniform over the CTA)
    GemmParams p = g.gemm;
    g.weights.move_to(p, expert);
    Dense::run(p);
  }
};

}  // namespace humming_aot::kernel
