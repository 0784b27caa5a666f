#pragma once
// RowBlockWalk: the walk over the tiles of the grouped contiguous MoE GEMM's row-expert form
// (DeepGEMM's contiguous layout with its per-row expert index) for the warp-specialized masked
// schedules (schedule/masked_ws_frame.cuh), in place of ExpertTable (schedule/expert_table.cuh).
// SM80+ (warp shuffles and ballots only).
//
// The rows are R rows of one activation and one output, grouped expert after expert, each
// expert's rows padded to whole blocks of kBlockM rows from row 0; row_expert[r] is row r's expert,
// -1 for a padding row. The expert of a block is its first row's: a block holds one expert's rows
// then padding, or padding only (the host's precondition; the kernel cannot see a mixed block).
// The tiles are the blocks' row tiles by the N tiles, row-major (tile t: block t / n_tiles, column
// tile t % n_tiles), as the offsets form walks one expert's rows. A block whose first row is
// padding, or whose id lies outside [0, E), has no tile: find skips it, its output rows left as
// they are. The tiles of a real block cover all of its rows up to R, padding rows included (they
// are computed with its expert's weights from whatever the activation holds there).
//
// In the frame's terms a found tile's expert is its block's, its first row (first_row) 0 and its
// "rows" the rows up to its block's end (at most R): its rows [m0, m0 + kBlockM) of ScaledRows
// that start at row 0 are the block's, M bounding the last block at R. find is uniform over the
// warp that calls it (every lane of it must call it), every warp of the CTA finds the same tiles,
// and it moves the tile index past the tiles it skips (the schedule walks index, index +
// gridDim.x, ...): the index is no walk index for K slices, which this form does not take
// (gemm.k_splits == 1, the host's precondition). Params (kernel/params.cuh MaskedGemmParams):
// expert_rows holds the (R,) row experts, row_offsets is nullptr, gemm.m is R, both slab strides 0.

#include <humming_aot/kernel/params.cuh>

namespace humming_aot::schedule {

template <int kBlockM,  // the tile's rows: the blocks the experts' rows are padded to
          int kTableOffset>
struct RowBlockWalk {
  static constexpr int kTableBytes = 0;    // (no table: a lane looks up a block's first row)
  static constexpr bool kKSlices = false;  // (find's index skips: it is no walk index)

  const int* row_expert;  // (R,) each row's expert, -1 for padding
  u32 experts, max_rows, n_tiles;

  static __device__ __forceinline__ RowBlockWalk over(const kernel::MaskedGemmParams& g, u32 n_tiles) {
    return RowBlockWalk{g.expert_rows, static_cast<u32>(g.experts), static_cast<u32>(g.gemm.m), n_tiles};
  }

  __device__ __forceinline__ void build() const {}

  // Every tile's first row is at row 0's place: the tile's m0 is its block's first row.
  __device__ __forceinline__ u32 first_row(u32) const { return 0u; }

  // The activation box's first row before the tile's m0 (the frame's place): 0, the rows are one
  // activation.
  __device__ __forceinline__ i64 box_first(const kernel::MaskedGemmParams&, u32, i64 first) const { return first; }

  // The first tile at or after `tile` in the CTA's sequence (tile, tile + gridDim.x, ...) of a
  // real block, moved to; its expert, the rows to its block's end (at most R) and its index in the
  // row-major raster (local: the frame's place reads m0 and n0 from it). false when none is left.
  // Lane l looks at the CTA's l-th tile from there: one memory latency per 32 tiles skipped.
  __device__ __forceinline__ bool find(u32& tile, u32& expert, u32& expert_rows, u32& local) const {
    const u32 m_tiles = (max_rows + kBlockM - 1) / kBlockM, tiles = m_tiles * n_tiles;  // (< 2^31: the host)
    const u32 lane = threadIdx.x & 31;
    for (; tile < tiles; tile += 32 * gridDim.x) {
      const u32 ahead = tile + lane * gridDim.x;
      int found = -1;
      if (ahead < tiles) found = row_expert[ahead / n_tiles * kBlockM];
      const u32 real = __ballot_sync(0xffffffffu, found >= 0 && static_cast<u32>(found) < experts);
      if (real != 0) {
        const int at = __ffs(real) - 1;
        tile += static_cast<u32>(at) * gridDim.x;
        expert = static_cast<u32>(__shfl_sync(0xffffffffu, found, at));
        const u32 end = (tile / n_tiles + 1) * kBlockM;
        expert_rows = end < max_rows ? end : max_rows;
        local = tile;
        return true;
      }
    }
    return false;
  }
};

}  // namespace humming_aot::schedule
