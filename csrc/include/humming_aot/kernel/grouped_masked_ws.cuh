#pragma once
// The grouped masked MoE GEMM, and its offsets form, on the warp-specialized Hopper body
// (kernel/dense_wgmma_ws.cuh, SM90a): what kernel/grouped_masked.cuh computes (the same layouts,
// the same walk over the experts' tiles, the same contract on counts and offsets), for experts of
// many rows, where the mma.sync bodies that schedule wraps fall behind (prefill-sized batches).
//
// A persistent schedule of the body's own producer and consumers, not of a run_tile: the grid is
// at most the resident CTAs, CTA c takes the tiles c, c + gridDim.x, ... of the experts' tiles
// (schedule/expert_table.cuh: expert after expert, an expert of r rows holding ceil(r / kBlockM) x n_tiles tiles,
// row tile after row tile), and the mbarrier ring runs on from one tile into the next without a
// pause: the output is staged in shared memory of its own after the ring (kSmemBytes), so the
// producer fills the next tile's stages while the consumers store this one. (The body's stream-K
// schedule stages through the ring and waits for the store instead: it runs a unit or two per CTA,
// where a tile here may have 4 K tiles and a CTA dozens of tiles, the load latency and the store
// of each paid in turn: session 26, docs/performance/log.md section 30.) Warp 0 writes the walk's
// table once (ExpertTable::build, in shared memory after the staging tile), then the producer's
// warp (find takes a whole warp; its lane 0 issues the copies) and every consumer warp look up the
// same tiles in it.
//
// Per tile:
// - the producer copies the activation boxes from the tensor map of all rows (MaskedTmaGemmParams:
//   the slabs end to end, expert e's at row e x max_m; or the offsets form's rows, expert e's at its
//   first row), plus the tile's first row; rows of the box past the expert's rows are other
//   experts' or, past the tensor, zeros: computed and never stored. The weights, scales and zero
//   points are the expert's (ExpertWeights::move_to);
// - the consumers store through GemmParams moved to the expert: its output rows (out, with M the
//   expert's rows, so that no row past them is written), its bias and its global scale.
// One K slice per tile (gemm.k_splits == 1, the host's precondition); no cluster.

#include <humming_aot/kernel/dense_wgmma_ws.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/masked_ws_frame.cuh>

namespace humming_aot::kernel {

template <class Dense,  // kernel/dense_wgmma_ws.cuh's DenseWgmmaWs: produce, consume and its Writer
          int kBlockM,  // its tile's rows (tokens)
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedMaskedWs {
  static constexpr int kThreads = Dense::kThreads;
  // Shared memory (bodies/wgmma_ws.py masked_smem_bytes): schedule/masked_ws_frame.cuh's layout
  using Frame = schedule::MaskedWsFrameOf<Dense, kBlockM, kBlockN>;
  using Walk = typename Frame::Walk;
  using TileAt = typename Frame::TileAt;
  static constexpr int kStagingOffset = Frame::kStagingOffset;
  static constexpr int kSmemBytes = Frame::kSmemBytes;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static constexpr int kSmemPerSm = 233472;  // 228 KB per SM on sm_90 (1 KB of it per CTA reserved)
#else
  static constexpr int kSmemPerSm = 0;  // (the host pass)
#endif
  // One consumer warpgroup of 8 tokens runs three CTAs per SM where three fit the shared memory
  // (with 1 KB of static shared memory each and the driver's 1 KB): 12 consumer warps per SM
  // instead of 8. Such a tile's K loop is a latency chain per warp (shared load, unpack, scale,
  // wgmma) and, on short K, a tile's store and first fills come every few K tiles, so more warps
  // hide more of both: DeepSeek-V3 TP8's down projection (K 256) 9-11 % faster at 4-64 tokens,
  // Qwen3's (K 768) level (docs/performance/log.md section 51). Its 16 accumulators fit the 104
  // registers a consumer thread then gets; 16-token tiles measured no faster, so they keep two.
  static constexpr bool kThreePerSm =
      Dense::kConsumerWarpGroups == 1 && kBlockM == 8 && 3 * (kSmemBytes + 1024 + 1024) <= kSmemPerSm;
  // Two consumer warpgroups of 8 tokens (an 8 x 512 tile: Humming's shape for DeepSeek-V3 TP8's
  // down projection, two CTAs per SM) run two CTAs per SM where two fit, 16 consumer warps per SM
  // as for three one-warpgroup CTAs, with half the tiles: their 16 accumulators fit the 104
  // registers a consumer thread gets once the producer keeps setmaxnreg's least (log section 68).
  // So does any two-warpgroup tile whose consumers then keep the wgmma's slack (16 and 32 x 256;
  // 48 x 256 would serialize its wgmma): Humming's 16 math warps an SM at 16-48 rows an expert
  // (log section 83).
  static constexpr bool kTwoOfTwoGroupsPerSm =
      Dense::kConsumerWarpGroups == 2 && 2 * (kSmemBytes + 1024 + 1024) <= kSmemPerSm &&
      Dense::consumer_registers((65536 / 2 / kThreads) / 8 * 8, Dense::kLeastProducerRegisters) >=
          Dense::kAccumulators + Dense::kSpareRegisters + Dense::kWgmmaSlack;
  static constexpr int kMinBlocksPerSm = kThreePerSm ? 3 : kTwoOfTwoGroupsPerSm ? 2 : Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  static constexpr int kConsumerWarps = Dense::kConsumerWarps;
  // The producer warp walks the experts too (the table's lookups, the expert's pointers): more
  // registers than the dense producer's 40, taken from the consumers, except where the consumers
  // then keep too few for their wgmma (Dense::producer_registers: setmaxnreg's least for the
  // 176-row tile, whose walk then keeps a few words in local memory outside the K loop; 6-10 %
  // faster at 5,120-16,384 tokens on DeepSeek-V3 TP8 and Qwen3-30B, log section 52).
  static constexpr int kLaunchRegisters = (65536 / kMinBlocksPerSm / kThreads) / 8 * 8;
  static constexpr int kWalkProducerRegisters = 56;
  static constexpr int kProducerRegisters = Dense::producer_registers(kLaunchRegisters, kWalkProducerRegisters);
  static constexpr int kConsumerRegisters = Dense::consumer_registers(kLaunchRegisters, kProducerRegisters);
  static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= Dense::kAccumulators + Dense::kSpareRegisters,
                "the consumers' registers hold the accumulators and the dequantization");
  static_assert(kBlockM == Dense::kTileM && kBlockN == Dense::kTileN, "the body's tile");

  // The tile's GemmParams, moved to its expert (weights, bias, global scale; out at the expert's
  // first row and M its rows), and its place (Frame::place: m0, n0, the activation box's map row).
  static __device__ __forceinline__ void params_of(const MaskedGemmParams& g, const Walk& walk, const TileAt& t,
                                                   GemmParams& p, int& m0, int& n0, int& box_row) {
    p = g.gemm;
    p.m = static_cast<int>(t.rows);
    const i64 first = walk.first_row(t.expert);  // 0 in a slab; the expert's first row with offsets
    p.out = static_cast<char*>(p.out) + t.expert * g.out_stride + first * p.ldo * 2;
    g.weights.move_to(p, static_cast<int>(t.expert));
    Frame::place(g, walk, t, first, m0, n0, box_row);
  }

  static __device__ __forceinline__ void run(const MaskedTmaGemmParams& params) {
    const MaskedGemmParams& g = params.masked;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Walk walk;
    // the ring's barriers: the producer's arrive.expect_tx (+ the bytes); lane 0 of every consumer warp
    const Frame frame = Frame::open(g, 1, kConsumerWarps, warp, walk);
    const u32 smem_base = frame.smem_base, full0 = frame.full0, empty0 = frame.empty0;
    const int k_tiles = g.gemm.k / Dense::kBlockK;
    GemmParams p;
    int m0, n0, box_row;

    if (warp >= kConsumerWarps) {
      ptx::warpgroup_release_registers<kProducerRegisters>();
      if (warp == kConsumerWarps) {
        if (lane == 0) ptx::prefetch_tensor_map(&params.a_map);
        u32 fills = 0;
        TileAt at;
        for (u32 tile = blockIdx.x; Frame::find(walk, tile, at); tile += gridDim.x) {
          if (lane == 0) {
            params_of(g, walk, at, p, m0, n0, box_row);
            Dense::produce(p, params.a_map, box_row, n0, 0, k_tiles, smem_base, full0, empty0, fills);
          }
          __syncwarp();
        }
      }
      return;
    }
    ptx::warpgroup_claim_registers<kConsumerRegisters>();

    const memory::GroupWalk<Dense::kBlockK> groups(g.gemm.group_size);
    float acc[Dense::kAccumulators];
    typename Dense::ConsumerRing ring;
    u32 tile = blockIdx.x;
    TileAt current, next;
    bool more = Frame::find(walk, tile, current);
    if (!more) schedule::release_dependent_grid();  // no tile for this CTA
    while (more) {
      // the tile's global scale, and the next tile's walk, in flight before this tile's K loop
      const float global_scale = g.weights.global_scales[current.expert];
      tile += gridDim.x;
      more = Frame::find(walk, tile, next);
      Dense::consume(k_tiles, smem_base, full0, empty0, groups, ring, acc);
      // The next kernel may now be scheduled into the slots this grid leaves as it finishes.
      if (!more) schedule::release_dependent_grid();
      params_of(g, walk, current, p, m0, n0, box_row);
      p.global_scale = global_scale;  // (the same value move_to read)
      // every consumer is done reading the previous tile's staging (store_tile's copy-out has no
      // barrier after it) before any writes this tile's
      Dense::ConsumerBarrier::sync();
      Dense::Writer::store_tile(p, acc, m0, n0, frame.smem + kStagingOffset);
      current = next;
    }
  }
};

}  // namespace humming_aot::kernel
