#pragma once
// The grouped masked MoE GEMM, and its offsets form, on the warp-specialized Hopper bodies with
// 8-bit activations (SM90a): W4A8 (kernel/dense_wgmma_w4a8.cuh: int4, uint4 with a zero point or
// MXFP4 experts x e4m3 codes) and W8A8 with channel scales (kernel/dense_wgmma_ss.cuh: e4m3 or s8
// experts x codes of the same kind) with an fp32 scale a row, or e4m3 experts with DeepSeek-V3's
// block scales (a scale per 128 x 128 weight block and per row and 128 of K). It computes what
// kernel/grouped_masked.cuh computes around the portable bodies (the same layouts, walk and
// contract on counts and offsets), with wgmma at the 8-bit rate. With schedule::RowBlockWalk for
// a walk, it computes the grouped contiguous GEMM's row-expert form instead (what
// kernel/grouped_contiguous.cuh computes around the portable bodies: DeepGEMM's contiguous layout,
// block-aligned rows with a per-row expert index, in MaskedGemmParams' expert_rows): the same
// roles, each tile one block's rows and its expert.
//
// The schedule of kernel/grouped_masked_ws.cuh (the 16-bit TMA body's), around the body's
// producer and consumers: a persistent grid walks the experts' tiles (schedule/expert_table.cuh,
// built once per CTA by warp 0), the producer warp fills the mbarrier ring tile after tile
// (Dense::produce_expert: the expert's weights, W4A8's by bulk copy from the moved pointers, W8A8's
// from the map of every expert's rows, and the activation box from the map row of the tile), and
// the consumers empty it (Dense::Consumer::consume, the dense K loop), scale the sums
// (Dense::scale_expert: the rows' scales, W8A8's channel scales) and store the tile through a
// staging tile of its own after the ring, so that the producer fills the next tile's slots
// meanwhile. Block scales: the K loop weighs each K tile by its scales (Dense::kLoopReadsRows: the
// consumers move to the tile's expert before it rather than beside it), and tiles of more than 16
// rows read the K block's row scales and weight-block scales from the slot, where two more warps
// of the producer warpgroup write them, taking turns fill by fill (Dense::gather_token_scales:
// the rows' (M, K / 128) scales are no 16-byte copy), the 32 lanes of the fill's warp arriving on
// the slot's full barrier beside the producer (Dense::kGatherArrivals). Per tile:
// - the producer copies the activation boxes from the map of all rows (the slabs end to end,
//   expert e's at row e x max_m; or the offsets form's rows, expert e's at its first row); rows of
//   a box past the expert's rows are other experts' or, past the map, zeros: computed and never
//   stored;
// - the consumers scale and store through ScaledRows moved to the expert (kernel/grouped_masked.cuh
//   move_to_expert: its output rows, M its rows, its rows' scales, its weights, scales, bias and
//   global scale).
// K slices (bodies with kKSlices, W8A8's: W4A8's consumers at 128 x 128 have no registers for the
// slice's bounds beside their K loop; the offsets form only: gemm.k_splits == 1 for slabs, the
// host's precondition, and the row-expert form's walk takes none, Walk::kKSlices): gridDim.y slices of ceil(K tiles / k_splits) K tiles, none empty; each
// slice's fp32 sums go to the workspace (epilogue/fragment_split_k.cuh: (tiles, k_splits,
// kBlockM x kBlockN) floats, indexed by the tile's walk index, below the walk's bound) and the
// last slice to arrive at the tile's counter sums them in slice order (the same bits every run),
// scales and stores. No cluster. The producer keeps the dense body's registers (40). Beside the accumulators of the largest tiles, ptxas keeps
// a few words of the consumers' next-tile walk (find, rows_of) in local memory: a few loads and
// stores per tile, none inside the K loop.

#include <humming_aot/kernel/grouped_masked.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/masked_ws_frame.cuh>

namespace humming_aot::kernel {

template <class Dense,  // DenseWgmmaW4A8 or DenseWgmmaSs: produce_expert, Consumer, scale_expert, Writer
          int kBlockM,  // its tile's rows (tokens)
          int kBlockN,  // its tile's columns (weight channels)
          // the walk: schedule::ExpertTable (masked and offsets forms) or schedule::RowBlockWalk
          // (the grouped contiguous row-expert form)
          template <int, int> class WalkOf = schedule::ExpertTable>
struct GroupedMaskedScaledWs {
  static constexpr int kThreads = Dense::kThreads;
  // Shared memory (bodies/wgmma_w4a8.py and wgmma_ss.py masked_smem_bytes):
  // schedule/masked_ws_frame.cuh's layout
  using Frame = schedule::MaskedWsFrameOf<Dense, kBlockM, kBlockN, WalkOf>;
  using Walk = typename Frame::Walk;
  using TileAt = typename Frame::TileAt;
  static constexpr int kStagingOffset = Frame::kStagingOffset;
  static constexpr int kSmemBytes = Frame::kSmemBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  static constexpr int kConsumerWarps = Dense::kConsumerWarps;
  static_assert(kBlockM == Dense::kTileM && kBlockN == Dense::kTileN, "the body's tile");
  using Body = Dense;  // (for the generated asserts on the body's constants)

  // The tile's rows moved to its expert (kernel/grouped_masked.cuh: weights, global scale, output
  // rows, M its rows, the rows' scales) and its place (Frame::place: m0, n0, the activation box's
  // map row).
  // `first`: walk.first_row(t.expert) (0 in a slab; the expert's first row with offsets).
  static __device__ __forceinline__ void rows_of(const MaskedScaledGemmParams& s, const Walk& walk, const TileAt& t,
                                                 i64 first, ScaledRows& r, int& m0, int& n0, int& box_row) {
    r = tile_rows(s, t.rows);
    move_to_expert(r, s, t.expert, first);
    Frame::place(s.masked, walk, t, first, m0, n0, box_row);
  }
  static __device__ __forceinline__ void rows_of(const MaskedScaledGemmParams& s, const Walk& walk, const TileAt& t,
                                                 ScaledRows& r, int& m0, int& n0, int& box_row) {
    r = tile_rows(s, t.rows);
    const i64 first = walk.first_row(t.expert);  // (read here, after tile_rows: the bodies' SASS as before)
    move_to_expert(r, s, t.expert, first);
    Frame::place(s.masked, walk, t, first, m0, n0, box_row);
  }

  // Warps of the producer warpgroup that stage the token and weight-block scales
  // (Dense::kGatherArrivals), taking turns fill by fill: one warp's chain per fill (its loads'
  // latency, the wait for the slot, the stores) bounded the K loop of the 128-row tile at K 7168
  // (H100: DeepSeek-V3 TP8's gate_up at 4,096 tokens took 12 % longer when the chain grew by a
  // load; docs/performance/log.md section 60). A warp waits for a slot's release at most one lap
  // ahead of the consumers while its turns are fewer than the ring's slots.
  static constexpr int kGatherWarps = 2;
  static_assert(Dense::kGatherArrivals == 0 || (kGatherWarps < Dense::kRingStages && 1 + kGatherWarps <= 4),
                "the gathering warps' turns stay within one lap of the ring, in the producer warpgroup");

  static __device__ __forceinline__ void run(const MaskedScaledTmaGemmParams& params) {
    const MaskedScaledGemmParams& s = params.scaled;
    const MaskedGemmParams& g = s.masked;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Walk walk;
    // the ring's barriers: the producer's arrive.expect_tx (+ the bytes) and the lanes of the
    // fill's gathering warp; the body's consumer arrivals
    const Frame frame = Frame::open(g, 1 + Dense::kGatherArrivals, Dense::kEmptyArrivals, warp, walk);
    const u32 smem_base = frame.smem_base, full0 = frame.full0, empty0 = frame.empty0;
    // K slices (Dense::kKSlices, the offsets form, gridDim.y = gemm.k_splits): CTA (x, y) walks
    // the tiles of column x over K tiles [k_tile0, k_tile0 + k_count) of its slice, ceil(K tiles /
    // slices) each (the host's slices leave none empty); the slices of a tile meet in Dense::SplitK.
    const int k_tiles = g.gemm.k / Dense::kBlockK;
    const int splits = Dense::kKSlices && Walk::kKSlices ? g.gemm.k_splits : 1;
    const int per_slice = splits > 1 ? (k_tiles + splits - 1) / splits : k_tiles;
    const int k_tile0 = splits > 1 ? static_cast<int>(blockIdx.y) * per_slice : 0;
    const int k_count = splits > 1 ? min(per_slice, k_tiles - k_tile0) : k_tiles;
    ScaledRows r;
    int m0, n0, box_row;
    TileAt at;

    if (warp >= kConsumerWarps) {
      ptx::warpgroup_release_registers<Dense::kProducerRegisters>();
      if (warp == kConsumerWarps) {
        if (lane == 0) ptx::prefetch_tensor_map(&params.a_map);
        u32 fills = 0;
        for (u32 tile = blockIdx.x; Frame::find(walk, tile, at); tile += gridDim.x) {
          if (lane == 0) {
            rows_of(s, walk, at, r, m0, n0, box_row);
            Dense::produce_expert(params, r, at.expert, box_row, n0, k_tile0, k_count, smem_base, full0, empty0, fills);
          }
          __syncwarp();
        }
      } else if (Dense::kGatherArrivals > 0 && warp <= kConsumerWarps + kGatherWarps) {
        if constexpr (Dense::kGatherArrivals > 0) {
          // the i-th gathering warp (warp kConsumerWarps + 1 + i) stages the fills f with f % kGatherWarps == i
          const u32 turn = static_cast<u32>(warp - kConsumerWarps - 1);
          u32 fills = 0;
          for (u32 tile = blockIdx.x; Frame::find(walk, tile, at); tile += gridDim.x) {
            rows_of(s, walk, at, r, m0, n0, box_row);
            Dense::template gather_token_scales<kGatherWarps>(r, m0, n0, k_tile0, k_count, smem_base, full0, empty0,
                                                              fills, turn);
          }
        }
      }
      return;
    }
    ptx::warpgroup_claim_registers<Dense::kConsumerRegistersHeld>();

    __shared__ int arrival_flag;  // (K slices: Dense::SplitK's arrival)
    float acc[Dense::kAccumulators];
    typename Dense::ConsumerState ring;
    u32 tile = blockIdx.x;
    TileAt next;
    bool more = Frame::find(walk, tile, at);
    if (!more) schedule::release_dependent_grid();  // no tile for this CTA
    // Where the K loop reads the tile's rows (block scales), each tile's expert's first row (with
    // offsets a global load, offsets[e]) is read a tile ahead, so that its latency passes beside
    // the tile before it rather than before the K loop. (The other bodies read it after their K
    // loop, where one more word held across it made ptxas spill more in W4A8's 128-row tile.)
    u32 first = 0u, next_first = 0u;
    if constexpr (Dense::kLoopReadsRows) first = more ? walk.first_row(at.expert) : 0u;
    while (more) {
      tile += gridDim.x;
      // (ExpertTable's shared-memory reads in flight beside the K loop; RowBlockWalk's global
      // load and ballot complete before it)
      more = Frame::find(walk, tile, next);
      if constexpr (Dense::kLoopReadsRows) {
        if (more) next_first = walk.first_row(next.expert);
        rows_of(s, walk, at, first, r, m0, n0, box_row);
        Dense::Consumer::consume(r, m0, n0, k_tile0, k_count, smem_base, full0, empty0, ring, acc);
      } else {
        Dense::Consumer::consume(s, 0, 0, k_tile0, k_count, smem_base, full0, empty0, ring, acc);
      }
      // The next kernel may now be scheduled into the slots this grid leaves as it finishes.
      if (!more) schedule::release_dependent_grid();
      if constexpr (!Dense::kLoopReadsRows) rows_of(s, walk, at, r, m0, n0, box_row);
      // K slices: this slice's partial sums into the workspace at the tile's walk index; the CTA
      // that arrives last holds the sum of every slice, in slice order, and goes on to store it
      if (splits > 1 && !Dense::SplitK::reduce(r.gemm, acc, static_cast<int>(tile - gridDim.x),
                                               static_cast<int>(blockIdx.y), splits, &arrival_flag)) {
        at = next;
        first = next_first;
        continue;
      }
      Dense::scale_expert(acc, r, m0, n0);
      // every consumer is done reading the previous tile's staging (store_tile's copy-out has no
      // barrier after it) before any writes this tile's
      Dense::ConsumerBarrier::sync();
      Dense::Writer::store_tile(r.gemm, acc, m0, n0, frame.smem + kStagingOffset);
      at = next;
      first = next_first;
    }
  }
};

}  // namespace humming_aot::kernel
