#pragma once
// MaskedWsFrame: what the warp-specialized grouped masked MoE schedules (kernel/grouped_masked_ws.cuh
// around the 16-bit TMA body, kernel/grouped_masked_scaled_ws.cuh around the 8-bit ones) share
// around their roles. SM90a (mbarriers).
// - The dynamic shared memory's layout: the body's ring (kPipelineBytes), the output's staging
//   tile of the schedule's own after it (kStagingBytes; the ring's slots are 1024-byte multiples),
//   1024 bytes for aligning the base at run time, then the walk's table at a fixed offset from the
//   unaligned base (the alignment moves the ring and staging by at most 1023 bytes).
// - open: the CTA's setup before its roles split, by every thread, first: thread 0 initializes the
//   ring's full and empty barriers (static shared memory), the wait for the upstream grid (the
//   counts or offsets, the activations and their scales may be the previous kernel's: PDL), the
//   walk (schedule/expert_table.cuh; the row-expert form's schedule/row_block_walk.cuh, which has
//   no table) whose table warp 0 builds, then the CTA's only barrier (the barriers' initialization
//   and the table before any use), after which the producer warpgroup may exit early.
// - place: a found tile's first row among its expert's rows (m0), first column (n0) and the row of
//   its activation box in the map of every row (the slabs end to end, max_m rows each; or the
//   offsets form's rows, where the expert's rows start at its first row; the row-expert form's,
//   where a tile's rows are its block's).

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/schedule/expert_table.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/row_block_walk.cuh>

namespace humming_aot::schedule {

template <int kPipelineBytes,                              // the body's ring
          int kStagingBytes,                               // the output's staging tile
          int kStages,                                     // the ring's slots
          int kBlockM,                                     // the tile's rows (tokens)
          int kBlockN,                                     // the tile's columns (weight channels)
          template <int, int> class WalkOf = ExpertTable>  // the walk over the tiles (its table's offset)
struct MaskedWsFrame {
  static constexpr int kStagingOffset = kPipelineBytes;
  static constexpr int kTableOffset = kPipelineBytes + kStagingBytes + 1024;
  using Walk = WalkOf<kBlockM, kTableOffset>;
  static constexpr int kSmemBytes = kTableOffset + Walk::kTableBytes;
  static_assert(kTableOffset % 16 == 0, "the table starts on a 16-byte boundary");

  // Where tile `index` of the walk lies: its expert, that expert's rows, and the tile's index among
  // the expert's tiles (row tile after row tile). (The row-expert form's walk: its block's expert,
  // the rows from row 0 to its block's end, and its index among all blocks' tiles.)
  struct TileAt {
    u32 expert, rows, local;
  };

  u32 smem_base;      // the ring's first slot: the dynamic shared memory's base aligned to 1024
  char* smem;         // the same, as a generic pointer
  u32 full0, empty0;  // the ring's first full and empty barriers (8 bytes apart per slot)

  // The frame of a CTA over g's experts, its full barriers counting full_arrivals and its empty
  // ones empty_arrivals a phase (warp: the thread's warp); `walk` the walk over the experts'
  // tiles, its table built.
  static __device__ __forceinline__ MaskedWsFrame open(const kernel::MaskedGemmParams& g, u32 full_arrivals,
                                                       u32 empty_arrivals, int warp, Walk& walk) {
    extern __shared__ __align__(1024) char smem_raw[];
    __shared__ __align__(8) u64 full_barriers[kStages];
    __shared__ __align__(8) u64 empty_barriers[kStages];
    const u32 raw_base = memory::shared_address(smem_raw);
    const u32 smem_base = (raw_base + 1023u) & ~1023u;
    const u32 full0 = memory::shared_address(full_barriers), empty0 = memory::shared_address(empty_barriers);
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        ptx::mbarrier_init(full0 + 8 * s, full_arrivals);
        ptx::mbarrier_init(empty0 + 8 * s, empty_arrivals);
      }
      ptx::fence_barrier_init();
    }
    wait_for_upstream_grid();
    walk = Walk::over(g, (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN);
    if (warp == 0) walk.build();
    __syncthreads();
    return MaskedWsFrame{smem_base, smem_raw + (smem_base - raw_base), full0, empty0};
  }

  // (the row-expert form's walk moves `index` past the tiles of padding blocks)
  static __device__ __forceinline__ bool find(const Walk& walk, u32& index, TileAt& t) {
    return walk.find(index, t.expert, t.rows, t.local);
  }

  // Tile t's m0, n0 and activation box row, its expert's rows starting at `first` (walk.first_row:
  // 0 in a slab).
  static __device__ __forceinline__ void place(const kernel::MaskedGemmParams& g, const Walk& walk, const TileAt& t,
                                               i64 first, int& m0, int& n0, int& box_row) {
    const u32 m_tile = t.local / walk.n_tiles;
    m0 = static_cast<int>(m_tile) * kBlockM;
    n0 = static_cast<int>(t.local - m_tile * walk.n_tiles) * kBlockN;
    box_row = static_cast<int>(walk.box_first(g, t.expert, first)) + m0;
  }
};

// The frame of a warp-specialized body's masked schedule: its ring, output staging tile and stages.
template <class Dense, int kBlockM, int kBlockN, template <int, int> class WalkOf = ExpertTable>
using MaskedWsFrameOf =
    MaskedWsFrame<Dense::kPipelineBytes, Dense::Writer::kStagingBytes, Dense::kRingStages, kBlockM, kBlockN, WalkOf>;

}  // namespace humming_aot::schedule
