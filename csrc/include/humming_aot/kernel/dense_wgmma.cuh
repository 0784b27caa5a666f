#pragma once
// The Hopper dense mixed-input GEMM body: out[m, n] = a[m, k] @ dequant(w)[n, k]^T (+ bias) on
// wgmma (SM90a), same operands, packed weight layout, run-time shapes and alignment rules as the
// mma.sync body (kernel/dense_mma_sync.cuh).
//
// Operands are swapped: the dequantized weights are the wgmma A operand, from registers (64
// weight channels per warpgroup), the activations are the B operand, read from shared memory by
// descriptor (kBlockM tokens = the wgmma N). The packed 16 x 16 weight tile that gives a lane its
// two mma.sync B fragments gives it exactly its wgmma A fragment, so the weights are packed once
// for both bodies. One CTA computes kBlockM tokens x kBlockN channels over a slice of K with
// kBlockN / 64 warpgroups; every thread loads (cp.async, kStages deep) and computes.
//
// Per 16-wide K step a warp dequantizes one packed tile (its 16 channels) and issues one
// m64 x kBlockM x 16 wgmma; the dequant of step i + 1 overlaps the wgmma of step i.

#include <humming_aot/epilogue/column_major_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/memory/wgmma_weight_fragment.cuh>
#include <humming_aot/mma/wgmma.cuh>
#include <humming_aot/numerics/weight_codes.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,  // tokens per CTA: the wgmma N (64, 128 or 256)
          int kBlockN,  // weight channels per CTA: 64 per warpgroup
          int kStages>  // cp.async pipeline depth
struct DenseWgmma {
  static constexpr int kBits = Weights::kBits;  // weight code bits: 1 to 8
  static constexpr int kBlockK = 64;
  static constexpr int kWarpGroups = kBlockN / 64;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;

  static_assert(kBlockN % 64 == 0 && kWarpGroups >= 1 && kWarpGroups <= 4, "one to four warpgroups of 64 channels");
  static_assert(kBlockM == 64 || kBlockM == 128 || kBlockM == 256, "wgmma wrappers exist for N = 64, 128, 256");
  // The stage refilled at iteration i is the one read two iterations earlier (see run()).
  static_assert(kStages >= 3, "the wgmma pipeline keeps one stage between the loads and the reads");

  using Layout = memory::StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>;
  using StageLoader = memory::StageLoader<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint, kThreads>;
  using WeightFragment = memory::WgmmaWeightFragment<Act, Weights, kZeroPoint, Layout, kBlockN, kBlockK>;
  using Mma = mma::Wgmma<Act, kBlockM>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Writer = epilogue::ColumnMajorWriter<Act, kBlockM, kBlockN, kThreads, epilogue::WarpgroupFragments<kBlockM>>;

  // Stages start on 1024-byte boundaries (the 128-byte swizzle repeats every 8 rows of 128 bytes).
  static constexpr int kStageBytes = (Layout::kBytes + 1023) / 1024 * 1024;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // +1024: the dynamic shared memory base is aligned up to 1024 bytes at run time.
  static constexpr int kSmemBytes =
      (kPipelineBytes > Writer::kStagingBytes ? kPipelineBytes : Writer::kStagingBytes) + 1024;

  static constexpr int kAccumulators = Mma::kAccumulators;
  // Two CTAs per SM (at most 128 registers per thread) when the accumulators leave room.
  static constexpr int kMinBlocksPerSm = kThreads <= 256 && kAccumulators <= 64 ? 2 : 1;
  // the weights are rounded to the activation dtype with their scales (KernelKey.scales_in_fp32)
  static constexpr bool kScalesInFp32 = false;

  // Dequantize this warp's 16 x 16 weight tile of K step kk into wgmma A fragment registers.
  static __device__ __forceinline__ void dequantize_step(u32 stage_smem, int kk, const memory::GroupWalk<kBlockK>& walk,
                                                         u32 (&a)[4]) {
    const int warp = threadIdx.x >> 5;
    WeightFragment::load(stage_smem, kk, warp >> 2, warp & 3, walk, a);
  }

  static __device__ __forceinline__ void run(const GemmParams& p) {
    extern __shared__ __align__(1024) char smem_raw[];
    __shared__ int arrival_flag;
    const u32 raw_base = memory::shared_address(smem_raw);
    const u32 smem_base = (raw_base + 1023u) & ~1023u;
    char* smem = smem_raw + (smem_base - raw_base);

    const Scheduler tile(p.m, p.n, p.k, p.k_splits);
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const memory::GroupWalk<kBlockK> walk(p.group_size);

    float acc[kAccumulators];
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;

    // Pipeline: K tile i lives in slot i % kStages. Loads run kStages - 2 tiles ahead, so the
    // slot refilled at iteration i was read at iteration i - 2, whose wgmma every warpgroup has
    // waited for (wait_group<1> after each step) before the barrier of iteration i.
    constexpr int kAhead = kStages - 2;
    const int count = tile.k_tile_end - tile.k_tile_begin;
    StageLoader loader(p, m0, n0, tile.k_tile_begin);
    loader.template load_prologue<kAhead, kStageBytes>(p, smem_base, count, [] {});

    int compute_slot = 0, load_slot = kAhead;
    u32 a[2][4];
    for (int it = 0; it < count; ++it) {
      memory::cp_async_wait<kAhead - 1>();
      mma::fence_shared_for_async_proxy();  // cp.async wrote the tile; wgmma reads it as the async proxy
      __syncthreads();                      // tile `it` landed for every thread; slot of tile `it - 2` is free
      if (it + kAhead < count) {
        loader.load(load_slot * kStageBytes);  // the loader's addresses hold smem_base
        loader.advance();
      }
      memory::cp_async_commit();
      const u32 stage_smem = smem_base + compute_slot * kStageBytes;
#pragma unroll
      for (int kk = 0; kk < kK16Steps; ++kk) {
        // a[kk & 1] was last read by the wgmma two steps back, complete after the previous wait
        dequantize_step(stage_smem, kk, walk, a[kk & 1]);
        mma::wgmma_fence();
        Mma::mma(acc, a[kk & 1], mma::k_major_sw128_descriptor(stage_smem + 32 * kk));
        mma::wgmma_commit_group();
        mma::wgmma_wait_group<1>();
      }
      compute_slot = compute_slot + 1 == kStages ? 0 : compute_slot + 1;
      load_slot = load_slot + 1 == kStages ? 0 : load_slot + 1;
    }
    // The next kernel may now be scheduled into the slots this grid leaves as it finishes, and
    // prefetch its weights during this epilogue. Not earlier: its CTAs would then be placed while
    // this grid still runs, wherever slots happen to be free, and pile up on some SMs.
    schedule::release_dependent_grid();
    mma::wgmma_wait_group<0>();
    mma::wgmma_fence_operands(acc);
    memory::cp_async_wait<0>();
    __syncthreads();  // every warpgroup is done with the pipeline's shared memory

    Writer::write(p, acc, m0, n0, tile.tile_index, &arrival_flag, smem);
  }
};

}  // namespace humming_aot::kernel
