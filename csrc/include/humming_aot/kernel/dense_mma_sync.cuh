#pragma once
// The portable dense mixed-input GEMM body: out[m, n] = a[m, k] @ dequant(w)[n, k]^T (+ bias),
// 16-bit activations, integer or small-float weight codes with per-group scales (and integer
// zero points), a global fp32 scale, fp32 accumulation on mma.sync m16n8k16. SM75+. M, N, K
// and the group size are run-time values: N % 64 == 0, K % kBlockK == 0, group a multiple of 16
// that divides kBlockK or is a multiple of it (humming_aot.heuristics.tile_fits; a tile wider
// than 64 in K has a 64-wide twin for the rest).
//
// One CTA computes a kBlockM x kBlockN output tile over a slice of K (the tile scheduler's
// split-K), with a kStages-deep cp.async pipeline of kBlockK-wide K tiles of activations, packed
// weights, scales and zero points; each warp dequantizes its weights in registers right before
// the mma. Wider stages (128 to 512) cut the per-stage cost (barrier, copies, address updates)
// per weight, which is what small M, with 4 K warps, is bound by. This file only composes: the
// mainloop is the swapped tiles' per-warp pipeline (mainloop/swapped_warp_pipeline.cuh: 8 tokens,
// or 16 under the body "mma-sw") or the CTA-shared pipeline of the larger tiles
// (mainloop/cta_pipeline.cuh); both write their output.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/cta_pipeline.cuh>
#include <humming_aot/mainloop/swapped_warp_pipeline.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/l2_prefetch.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,  // output rows per CTA; 8: swapped operands, a pipeline per warp (16 too with kSwapped)
          int kBlockN,  // output columns per CTA (64 per warp along N)
          int kBlockK,  // K per pipeline stage: 64, 128, 256 or 512
          int kWarpsM, int kWarpsN,     // warp grid of the CTA over the output tile
          int kWarpsK,                  // warps sharing each stage's K steps (1, 2 or 4)
          int kStages,                  // cp.async pipeline depth
          int kSwapped = kBlockM == 8>  // 1: the swapped per-warp pipeline (8, 16 or 32 tokens)
struct DenseMmaSync {
  // M <= 8 runs the swapped operands (one mma per weight tile instead of two) in a pipeline per
  // warp, with no CTA barrier per stage; larger tiles share their stages, since their warps'
  // operands overlap much more. The body "mma-sw" (humming_aot/bodies/mma_swapped.py) runs 16 or
  // 32 tokens in the per-warp pipeline too: 2 or 4 times the mma of the 8-token tile per
  // dequantized weight.
  static_assert(kSwapped == (kBlockM == 8) || (kSwapped == 1 && (kBlockM == 16 || kBlockM == 32)),
                "8 tokens run swapped; 16 and 32 either way (mma or mma-sw); more only in the CTA pipeline");
  using Mainloop = typename Select<kSwapped != 0,
                                   mainloop::SwappedWarpPipeline<Act, Weights, kZeroPoint, kBlockM, kBlockN, kBlockK,
                                                                 kWarpsM, kWarpsN, kWarpsK, kStages>,
                                   mainloop::CtaPipeline<Act, Weights, kZeroPoint, kBlockM, kBlockN, kBlockK, kWarpsM,
                                                         kWarpsN, kWarpsK, kStages>>::Type;
  static constexpr int kThreads = Mainloop::kThreads;
  // humming_aot.spec.KernelKey.scales_in_fp32 says so to the host (the generated source
  // static_asserts that they agree)
  static constexpr bool kScalesInFp32 = Mainloop::kScalesInFp32;
  static constexpr int kSmemBytes = Mainloop::kSmemBytes;  // = humming_aot.heuristics.smem_bytes
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static constexpr int kSmemPerSm = 233472;  // 228 KB per SM on sm_90 and sm_100 (1 KB of it per CTA reserved)
#else
  static constexpr int kSmemPerSm = 0;  // (the host pass, and arches where three such CTAs never fit)
#endif
  // A swapped 32-token tile of 4 warps whose scales multiply the 16-bit weights (one accumulator
  // set: 153 registers for mxfp4 under a 168 cap, no spills) runs three CTAs per SM where three fit
  // the shared memory (2 stages of 256): 12 warps per SM to hide its per-warp pipeline's
  // latencies, which bind it (ncu, docs/performance/log.md section 42). With fp32 scales on the
  // sums (a second accumulator set, 233 registers) it would spill, so those keep two.
  static constexpr bool kThreeSwapped32 = kSwapped == 1 && kBlockM == 32 && kThreads == 128 && !kScalesInFp32 &&
                                          3 * (kSmemBytes + 128 + 1024) <= kSmemPerSm;
  // Small-M tiles of 8 warps run two CTAs per SM (split-K sizes its slices for that): hold
  // ptxas to the 128 registers that allows (8-bit codes with 256-wide stages would take ~135).
  static constexpr int kMinBlocksPerSm = kThreads == 256 && kBlockM <= 16 ? 2 : (kThreeSwapped32 ? 3 : 1);
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;

  static __device__ __forceinline__ void run(const GemmParams& p) {
    run_scheduled(p, Scheduler(p.m, p.n, p.k, p.k_splits), [] {
      // The next kernel may now be scheduled into the slots this grid leaves as it finishes, and
      // prefetch its weights during this epilogue. Not earlier: its CTAs would then be placed
      // while this grid still runs, wherever slots happen to be free, and pile up on some SMs.
      schedule::release_dependent_grid();
    });
  }

  // One output tile, the one of linear index `linear_tile` in the scheduler's raster (run: the
  // CTA's own), over the CTA's K slice; `at_epilogue` runs as the epilogue starts. A persistent
  // schedule (kernel/grouped_masked.cuh) may run several tiles per CTA one after another, with a
  // CTA barrier between them (each tile reuses the same shared memory; both mainloops drain their
  // cp.async groups at the end of the K loop), and with no cluster (the cluster exchange's barriers
  // serve one tile per CTA). K slices (gridDim.y = p.k_splits) reduce through the workspace: per
  // tile, each slice stores its partials at p.workspace + slice * p.m * p.n and arrives at
  // p.tile_counters[m_tile * n_tiles + n_tile]; the last one sums them and resets the counter
  // (the arrival flag is reused only after the schedule's barrier), so each tile run this way
  // needs a workspace and counters of its own, which the schedule's pointers provide.
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_tile(const GemmParams& p, u32 linear_tile, AtEpilogue at_epilogue) {
    run_scheduled(p, Scheduler(p.m, p.n, p.k, p.k_splits, linear_tile), at_epilogue);
  }

  // The K that prefetch_tile covers: what the pipeline's first stages load, or more, up to
  // kPrefetchBytes of packed codes (a tile of short K is then prefetched whole).
  static constexpr int kPrefetchBytes = 32768;
  static constexpr int kPrefetchK =
      (kPrefetchBytes * 8 / (kBlockN * Weights::kBits)) / kBlockK * kBlockK > kStages* kBlockK
          ? (kPrefetchBytes * 8 / (kBlockN * Weights::kBits)) / kBlockK * kBlockK
          : kStages * kBlockK;

  // L2 prefetches of tile `linear_tile`'s weights over the first kPrefetchK of the CTA's K slice,
  // issued by every thread of the CTA: a persistent schedule calls it for the CTA's next tile
  // before it runs the current one, so that the next tile's first stages come from L2.
  static __device__ __forceinline__ void prefetch_tile(const GemmParams& p, u32 linear_tile) {
    const Scheduler tile(p.m, p.n, p.k, p.k_splits, linear_tile);
    const int k_begin = tile.k_tile_begin * kBlockK, k_span = (tile.k_tile_end - tile.k_tile_begin) * kBlockK;
    if (k_span <= 0) return;  // a slice past the last K tile (more slices than K tiles need) has none
    memory::TileL2Prefetch<kBlockN, Weights::kBits, kThreads>::issue(p, tile.n_tile * kBlockN, k_begin,
                                                                     kPrefetchK < k_span ? kPrefetchK : k_span);
  }

 private:
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_scheduled(const GemmParams& p, const Scheduler& tile,
                                                       AtEpilogue at_epilogue) {
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int count = tile.k_tile_end - tile.k_tile_begin;
    const u32 smem_base = memory::shared_address(smem);
    const int warp = threadIdx.x >> 5;
    const int warp_k = warp / (kWarpsM * kWarpsN), warp_mn = warp % (kWarpsM * kWarpsN);
    const int warp_m = warp_mn / kWarpsN, warp_n = warp_mn % kWarpsN;
    Mainloop mainloop(p, smem_base, warp);
    mainloop.run(p, smem, smem_base, m0, n0, tile.k_tile_begin, count, tile.tile_index, &arrival_flag, warp, warp_mn,
                 warp_m, warp_n, warp_k, at_epilogue);
  }
};

}  // namespace humming_aot::kernel
