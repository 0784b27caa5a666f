#pragma once
// The grouped masked MoE GEMM (DeepGEMM's masked layout, DeepEP low-latency decode):
// out[e, m, n] = a[e, m, k] @ dequant(w[e])[n, k]^T (+ bias) for every expert e and its first
// expert_rows[e] rows of a slab of max_m; the rows past the count are neither read for any stored
// output nor written. A schedule around a dense body, not a body of its own: gridDim.z is the
// expert, gridDim.x the dense body's tiles of a full slab (max_m rows). Each CTA waits on the
// upstream grid (the counts may be its output), reads its expert's count, leaves at once when its
// tile index passes that count's tiles (the dense raster of `rows` rows is a bijection onto the
// first ceil(rows / kBlockM) x n_tiles indices), and runs the dense body on a copy of GemmParams
// whose pointers are moved to the expert's slab, whose M is the count and whose global scale is
// the expert's. Preconditions (the host
// checks them): gemm.k_splits == 1 (one K slice: the dense body's split-K counters and workspace
// are per launch, not per expert); a body whose run takes GemmParams and takes its tile from
// blockIdx.x (the mma.sync bodies). SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::kernel {

template <class Dense,  // the dense body: run(const GemmParams&), tile from blockIdx.x
          int kBlockM,  // its tile's rows (tokens)
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedMasked {
  static constexpr int kThreads = Dense::kThreads;
  static constexpr int kSmemBytes = Dense::kSmemBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;

  static __device__ __forceinline__ void run(const MaskedGemmParams& g) {
    schedule::wait_for_upstream_grid();  // the counts (and the activations) may come from the previous kernel
    const u32 expert = blockIdx.z;
    const int rows = g.expert_rows[expert];
    const u32 n_tiles = (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN;
    const u32 m_tiles = (static_cast<u32>(rows) + kBlockM - 1) / kBlockM;
    if (rows <= 0 || blockIdx.x >= m_tiles * n_tiles) return;  // uniform over the CTA
    GemmParams p = g.gemm;
    p.m = rows;
    p.a = static_cast<const char*>(p.a) + expert * g.a_stride;
    p.out = static_cast<char*>(p.out) + expert * g.out_stride;
    g.weights.move_to(p, static_cast<int>(expert));
    Dense::run(p);
  }
};

}  // namespace humming_aot::kernel
