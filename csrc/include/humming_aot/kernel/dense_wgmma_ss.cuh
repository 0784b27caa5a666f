#pragma once
// The warp-specialized Hopper W8A8 body on wgmma (SM90a): 8-bit activation and weight codes (e4m3
// both, or s8 both: Codes), fp32 scales, a 16-bit output, in one of two scalings:
// - token x channel: out[m, n] = (sum_k a[m, k] w[n, k]) x a_scale[m] x w_scale[n] x global scale
//   (+ bias), the scales on the reduced fp32 sums;
// - blocks (kBlockScales, DeepSeek-V3, e4m3 only): a_scale[m, k / 128] per token and K block of
//   128, w_scale[n / 128, k / 128] per 128 x 128 weight block, both applied at each K tile's
//   promotion (a K tile is one K block), so out[m, n] = sum_b (sum_{k in b} a w) a_scale[m, b]
//   w_scale[n / 128, b].
//
// Both operands are in shared memory: nothing is dequantized, so wgmma reads each through a
// descriptor (mma/wgmma_e4m3.cuh, mma/wgmma_s8.cuh), the weights as its A (64-channel units, M)
// and the tokens as its B (N), which keeps a few tokens cheap. Roles as in
// kernel/dense_wgmma_ws.cuh: one producer warpgroup whose first thread issues, per K tile of 128,
// one TMA box of weight codes (kBlockN rows) and one of activation codes (kBlockM rows), both 128
// bytes a row with the 128-byte swizzle and zero-filled past N, M and K; one or two consumer
// warpgroups, whose K loop is a component of its own:
// - e4m3 (mainloop/fp8_promotion.cuh): each K tile's wgmma into a scratch set promoted into fp32
//   accumulators (serial, or overlapped with the next K tile's wgmma where a third set of
//   registers fits: up to 64 x 128 per warpgroup; with block scales above 16 tokens only);
// - s8 (mainloop/integer_sums.cuh): exact int32 sums over the unit's whole K (or K slice: split-K
//   and the MoE schedule's slices add each slice's sums made fp32), made fp32 once.
// The e4m3 promotion needs twice the accumulator registers: a consumer warpgroup holds at most
// 64 channels x 192 tokens, or 128 x 96 (block scales at 8 and 16 tokens hold the token scales
// too; above, the K loop reads them from the slot as it adds).
//
// Token-major (kTokenMajor: block scales, 128 tokens x 128 channels, two consumer warpgroups of one
// unit): the roles swap, the tokens wgmma's A (warpgroup wg: tokens 64 wg + [0, 64)) and the CTA's
// 128 channels, one weight block, its N, through the same slot (mainloop/fp8_token_major_blocks.cuh,
// epilogue/token_major_fragments.cuh): a thread's accumulators then hold two tokens rather than 32,
// so each K tile's promotion weighs them with two factors rather than 32 (H200: the transposed
// tile's promotion took ~1,080 cycles a K tile against ~670 without block scales, ncu).
//
// Schedules (tail split or stream-K, schedule/work_units.cuh) and the epilogue (fixup or split-K
// reduction in fp32, then the staging tile of epilogue/column_major_writer.cuh) are the 16-bit
// body's; the token and channel scales multiply the reduced fp32 sums just before the store. The
// roles around produce and Consumer are kernel/scaled_ws_driver.cuh's (shared with the W4A8 body).

#include <humming_aot/epilogue/column_major_writer.cuh>
#include <humming_aot/epilogue/fragment_split_k.cuh>
#include <humming_aot/epilogue/stream_k_fixup.cuh>
#include <humming_aot/epilogue/token_major_fragments.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/kernel/scaled_ws_driver.cuh>
#include <humming_aot/mainloop/fp8_promotion.cuh>
#include <humming_aot/mainloop/fp8_token_major_blocks.cuh>
#include <humming_aot/mainloop/integer_sums.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/mma/wgmma_e4m3.cuh>
#include <humming_aot/mma/wgmma_s8.cuh>
#include <humming_aot/ptx/bulk_copy.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/work_units.cuh>

namespace humming_aot::kernel {

template <class Out,               // Float16 or BFloat16: output (and bias) dtype
          class Codes,             // mma::E4m3Codes or mma::S8Codes: both operands' codes
          bool kBlockScales,       // scales per 128 x 128 weight block and 1 x 128 token group (e4m3)
          int kBlockM,             // tokens per CTA: the wgmma N (8, 16, 32, 64, 96, 128, 160 or 192)
          int kBlockN,             // weight channels per CTA: 64 x kUnitsPerWarpGroup x consumer warpgroups
          int kUnitsPerWarpGroup,  // 64-channel units each consumer warpgroup multiplies (1 or 2)
          int kStages>             // slots of the mbarrier ring
struct DenseWgmmaSs {
  static constexpr int kBlockK = 128;  // one 128-byte row of e4m3 codes per stage, one promotion
  static constexpr int kRingStages = kStages, kTileM = kBlockM, kTileN = kBlockN;  // (for the driver)
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kConsumerWarpGroups = kUnits / kUnitsPerWarpGroup;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpGroups;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup, last

  static_assert(kBlockN % 64 == 0 && (kUnitsPerWarpGroup == 1 || kUnitsPerWarpGroup == 2), "one or two units");
  static_assert(kUnits % kUnitsPerWarpGroup == 0 && (kConsumerWarpGroups == 1 || kConsumerWarpGroups == 2),
                "one or two consumer warpgroups (the register split below assumes it)");
  static_assert(kBlockN <= 256 && kBlockM <= 256, "a TMA box has at most 256 rows");
  static_assert(kStages >= 2, "a ring of at least two slots");
  static_assert(!kBlockScales || kBlockN % 128 == 0, "whole 128-channel weight blocks per CTA");
  static_assert(!(kBlockScales && Codes::kExactSums), "block scales apply at the promotion, which s8 sums skip");

  static constexpr bool kTokenMajor = kBlockScales && kBlockM == 128 && kBlockN == 128 && kUnitsPerWarpGroup == 1;
  using Mma = typename Codes::template Mma<kTokenMajor ? kBlockN : kBlockM>;  // (N: tokens, or token-major channels)
  using Units = schedule::WorkUnits<kBlockM, kBlockN, kBlockK, /*kPersistentTiles=*/true>;
  using StreamK = typename Units::StreamK;
  using Fragments = typename Select<kTokenMajor, epilogue::TokenMajorFragments<kBlockN>,
                                    epilogue::WarpgroupFragments<kBlockM, kUnitsPerWarpGroup>>::Type;
  using ConsumerBarrier = ptx::NamedBarrier<kConsumerThreads, 1>;
  using Writer = epilogue::ColumnMajorWriter<Out, kBlockM, kBlockN, kConsumerThreads, Fragments, ConsumerBarrier>;
  using SplitK = epilogue::FragmentSplitK<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;
  using Fixup = epilogue::StreamKFixup<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;

  // A slot: the weight box (kBlockN rows of 128 bytes: a multiple of 8 KB, so the activation box
  // after it keeps the 1024-byte alignment the swizzle repeats on), then the activation box.
  // Blocks, above 16 tokens: the K block's token scales too, staged after the activation box from
  // the (K / 128, a_scale_stride) transposed scales (a thread reads its tokens' pairs with 8-byte
  // loads); at 8 and 16 tokens each thread loads its two or four from the (M, K / 128) rows.
  static constexpr bool kStagedTokenScales = kBlockScales && kBlockM > 16;
  static constexpr int kWeightBytes = kBlockN * 128;
  static constexpr int kCodeBytes = (kBlockN + kBlockM) * 128;
  static constexpr int kStageBytes = (kCodeBytes + (kStagedTokenScales ? kBlockM * 4 : 0) + 1023) / 1024 * 1024;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // The output's staging tile: after the ring where both fit (kernel/scaled_ws_driver.cuh).
  using Staging = StagingPlacement<kPipelineBytes, Writer::kStagingBytes, kConsumerWarpGroups>;
  static constexpr bool kSeparateStaging = Staging::kSeparate;
  static constexpr int kStagingOffset = Staging::kOffset;
  static constexpr int kSmemBytes = Staging::kSmemBytes;
  static constexpr bool kScalesInFp32 = true;  // the scales multiply fp32 sums

  static constexpr int kUnitAccumulators = Mma::kAccumulators;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * kUnitAccumulators;
  static constexpr int kMinBlocksPerSm = kConsumerWarpGroups == 1 ? 2 : 1;
  using Registers = RegisterSplit<kThreads, kConsumerThreads, kMinBlocksPerSm>;
  static constexpr int kProducerRegisters = Registers::kProducer;
  static constexpr int kConsumerRegistersHeld = Registers::kHeld;
  static constexpr int kTokenScales = kBlockM / 4;  // the tokens of a thread's accumulators (blocks)
  // (e4m3: the accumulators and the promotion's scratch set; s8: the sums alone, made fp32 in place)
  // (block scales at 8 and 16 tokens: the thread's token scales held too; above, read from the slot
  // pair by pair as the K loop adds, a pair and its two products at a time: 8 registers)
  static constexpr int kTokenScaleRegisters = kBlockScales ? (kStagedTokenScales ? 8 : kTokenScales) : 0;
  static_assert(kConsumerRegistersHeld >= (Codes::kExactSums ? 1 : 2) * kAccumulators + kTokenScaleRegisters + 40,
                "the consumers' registers hold the accumulators (and the promotion's scratch set) and the loop");
  // Registers for a second scratch set: promotion overlapped with the next K tile's wgmma
  // (mainloop/fp8_promotion.cuh; with block scales where the token scales are staged in the slot).
  static constexpr bool kOverlappedPromotion =
      !Codes::kExactSums && (!kBlockScales || kStagedTokenScales) && 3 * kAccumulators + 40 <= kConsumerRegistersHeld;

  using Ring = mainloop::WgmmaSsRing<Mma, kUnitsPerWarpGroup, kStages, kStageBytes, kWeightBytes, kTokenMajor>;
  using Fp8Consumer =
      typename Select<kTokenMajor, mainloop::Fp8TokenMajorBlocks<Ring, kCodeBytes, kBlockM>,
                      mainloop::Fp8Promotion<Ring, kBlockScales, kBlockM, kCodeBytes, kOverlappedPromotion>>::Type;
  using Consumer = typename Select<Codes::kExactSums, mainloop::IntegerSums<Ring>, Fp8Consumer>::Type;

  // The producer: one thread issues the copies of `count` K tiles from k_tile0 on of the tile at (m0, n0).
  static __device__ __forceinline__ void produce(const ScaledTmaGemmParams& params, int m0, int n0, int k_tile0,
                                                 int count, u32 smem_base, u32 full0, u32 empty0, u32& fills) {
    produce_boxes(&params.w_map, n0, &params.tma.a_map, m0, params.a_scale + m0, params.a_scale_stride,
                  params.a_scale_stride - m0, k_tile0, count, smem_base, full0, empty0, fills);
  }

  // produce's copies: per K tile the weight box of w_map from row w_row, the activation box of
  // a_map from row box_row and, with staged token scales (unless kCopyScales is off: the MoE
  // schedule's gather_token_scales writes them), min(kBlockM, scale_rows) floats from token_scales
  // (the tile's first row of K tile 0 in the transposed scales) + k_tile x scale_stride.
  template <bool kCopyScales = kStagedTokenScales>
  static __device__ __forceinline__ void produce_boxes(const TensorMap* w_map, int w_row, const TensorMap* a_map,
                                                       int box_row, const float* token_scales, int scale_stride,
                                                       int scale_rows, int k_tile0, int count, u32 smem_base, u32 full0,
                                                       u32 empty0, u32& fills) {
    for (int it = 0; it < count; ++it, ++fills) {
      const u32 slot = fills % kStages, lap = fills / kStages;
      const u32 full = full0 + 8 * slot;
      // lap f of the slot waits for the consumers' release of lap f - 1: the empty barrier's phase f - 1
      if (lap > 0) ptx::mbarrier_wait(empty0 + 8 * slot, (lap + 1) & 1u);
      const u32 stage = smem_base + slot * kStageBytes;
      // the token scales of the tile's rows up to the stride (a multiple of 4: 16-byte copies; m0 is
      // a multiple of 8 below it); the rest of the slot keeps stale values, for rows never stored
      const u32 scale_bytes = kCopyScales ? 4u * static_cast<u32>(min(kBlockM, scale_rows)) : 0u;
      ptx::mbarrier_arrive_expect_tx(full, kCodeBytes + scale_bytes);
      const int pair0 = (k_tile0 + it) * (kBlockK / 2);  // the maps count 16-bit pairs of codes
      ptx::tensor_copy_2d_g2s(stage, w_map, pair0, w_row, full);
      ptx::tensor_copy_2d_g2s(stage + kWeightBytes, a_map, pair0, box_row, full);
      if constexpr (kCopyScales) {
        const float* row = token_scales + static_cast<i64>(k_tile0 + it) * scale_stride;
        ptx::bulk_copy_g2s(stage + kCodeBytes, row, scale_bytes, full);
      }
    }
  }

  // No L2 prefetch of the weights before the wait for the upstream grid (the driver's hook).
  // Measured on the H200 at 1 and 16 tokens (docs/performance/log.md section 49): load-store line
  // prefetches of each channel's first K tiles took 0.13-1.53 us off 14 of 16 layer points with
  // the activations' quantization in front, but made the GEMM behind another GEMM up to 0.66 us
  // slower (box prefetches through the tensor map: 0.7-1.6 us), for a cause not yet found; the
  // W4A8 body's bulk prefetches of contiguous K tiles showed no such cost.
  static __device__ __forceinline__ void prefetch_weights(const ScaledTmaGemmParams&, int, int, int) {}

  // The fp32 sums of the tile at (m0, n0) times its tokens' and channels' scales (rows and channels
  // past M and N get 0: never stored).
  static __device__ __forceinline__ void apply_scales(const ScaledTmaGemmParams& params, float (&acc)[kAccumulators],
                                                      int m0, int n0) {
    apply_row_scales(params.tma.gemm, params.a_scale, acc, m0, n0);
  }

  // apply_scales with the channel scales, M and N of p and the token scales of a_scale.
  static __device__ __forceinline__ void apply_row_scales(const GemmParams& p, const float* a_scale,
                                                          float (&acc)[kAccumulators], int m0, int n0) {
    const float* channel_scales = static_cast<const float*>(p.w_scale);
    // each token's and each column's scale read once (a thread holds two columns per unit)
    const int token0 = m0 + Fragments::first_token(), col0 = n0 + Fragments::first_column();
    float w[kUnitsPerWarpGroup][2];
#pragma unroll
    for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = col0 + 64 * u + 8 * h;
        w[u][h] = col < p.n ? channel_scales[col] : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < Fragments::kChunks; ++j) {
      const int token = token0 + 8 * j;
      const float a[2] = {token < p.m ? a_scale[token] : 0.f, token + 1 < p.m ? a_scale[token + 1] : 0.f};
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[Fragments::index(u, j, e)] *= a[e & 1] * w[u][e >> 1];
      }
    }
  }

  // The tile's fp32 sums times its tokens' and channels' scales, where they come after the sums.
  static __device__ __forceinline__ void scale_sums(const ScaledTmaGemmParams& params, float (&acc)[kAccumulators],
                                                    int m0, int n0) {
    if constexpr (!kBlockScales) apply_scales(params, acc, m0, n0);
  }

  static constexpr bool kWeightMap = true;               // the weights come through params.w_map
  static constexpr int kEmptyArrivals = kConsumerWarps;  // lane 0 of each consumer warp releases a slot
  using ConsumerState = typename Ring::State;

  // The MoE schedule's hooks (kernel/grouped_masked_scaled_ws.cuh): the copies of a tile of expert
  // `expert` (its weight box from row expert x N + n0 of the map of every expert's rows) from the
  // activation map's row box_row, and the scales of its sums (r: the expert's rows, channel
  // scales, N and M; block scales weigh each K tile in the K loop, which reads r: kLoopReadsRows).
  // Block scales above 16 tokens: the slot's token scales come from gather_token_scales, whose
  // lanes arrive on the full barrier beside the producer (kGatherArrivals).
  static constexpr bool kLoopReadsRows = kBlockScales;
  static constexpr bool kKSlices = true;  // (the schedule's K slices reduce through SplitK)
  static constexpr int kGatherArrivals = kStagedTokenScales ? 32 : 0;
  static __device__ __forceinline__ void produce_expert(const MaskedScaledTmaGemmParams& params, const ScaledRows&,
                                                        u32 expert, int box_row, int n0, int k_tile0, int count,
                                                        u32 smem_base, u32 full0, u32 empty0, u32& fills) {
    const int w_row = static_cast<int>(expert) * params.scaled.masked.gemm.n + n0;
    produce_boxes<false>(&params.w_map, w_row, &params.a_map, box_row, nullptr, 0, 0, k_tile0, count, smem_base, full0,
                         empty0, fills);
  }
  static __device__ __forceinline__ void scale_expert(float (&acc)[kAccumulators], const ScaledRows& r, int m0,
                                                      int n0) {
    if constexpr (!kBlockScales) apply_row_scales(r.gemm, r.a_scale, acc, m0, n0);
  }

  // Block scales above 16 tokens, in the MoE schedule (every lane of each of kTurns warps of the
  // producer warpgroup, which walk its tiles and K tiles in the producer's order and take turns
  // fill by fill): per K tile (count of them from k_tile0; fills counts them over the CTA's tiles)
  // of the tile at (m0, n0) of r's expert whose fill is this warp's turn, once the slot is free,
  // the K block's kBlockM token scales where the dense body's bulk copy puts them (token m0 + i at
  // float i; 0 past the expert's rows), read from r's (M, K / 128) rows, which no 16-byte copy can
  // gather, and its weight-block scales after them; then one arrival a lane. Each K tile's loads
  // are issued before the wait for its slot, so that the wait hides them.
  // The K block's weight-block scales follow the token scales in the slot (one float per 128 of
  // the CTA's channels, kernel::StagedWeightScales): the consumers then read no global memory in
  // the K loop (the H100 profile of section 60 of docs/performance/log.md: 4.7 % of the 128-row
  // tile's stall samples waited on the weight scale's global load at K 256).
  static constexpr int kWeightBlocks = kBlockN / 128;
  static_assert(!kStagedTokenScales || kStageBytes >= kCodeBytes + 4 * (kBlockM + kWeightBlocks),
                "a slot's rounding to 1024 bytes leaves room for the weight-block scales");
  // This warp stages the fills f with f % kTurns == turn.
  template <int kTurns>
  static __device__ __forceinline__ void gather_token_scales(const ScaledRows& r, int m0, int n0, int k_tile0,
                                                             int count, u32 smem_base, u32 full0, u32 empty0,
                                                             u32& fills, u32 turn) {
    static_assert(kStagedTokenScales && kBlockM % 32 == 0, "the tiles that stage token scales: lanes x rows");
    constexpr int kPerLane = kBlockM / 32;
    extern __shared__ __align__(1024) char smem_raw[];
    char* const smem = smem_raw + (smem_base - memory::shared_address(smem_raw));
    const int lane = threadIdx.x & 31;
    const float* rows = r.a_scale + static_cast<i64>(m0 + lane) * r.a_scale_stride + k_tile0;
    const int lane_step = 32 * r.a_scale_stride;  // (32 rows of K / 128 contiguous scales)
    // lane b < kWeightBlocks: weight block n0 / 128 + b's scales, a row of K / 128 (0 past N)
    const int block = (n0 >> 7) + lane, k_blocks = r.gemm.k / kBlockK;
    const bool weighs = lane < kWeightBlocks && block < ((r.gemm.n + 127) >> 7);
    const float* block_scales =
        static_cast<const float*>(r.gemm.w_scale) + static_cast<i64>(block) * k_blocks + k_tile0;
    for (int it = 0; it < count; ++it, ++fills) {
      if (fills % kTurns != turn) continue;
      float scales[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        scales[j] = m0 + lane + 32 * j < r.gemm.m ? __ldg(rows + j * lane_step + it) : 0.f;
      }
      const float weight_scale = weighs ? __ldg(block_scales + it) : 0.f;
      const u32 slot = fills % kStages, lap = fills / kStages;
      if (lap > 0) ptx::mbarrier_wait(empty0 + 8 * slot, (lap + 1) & 1u);
      float* const staged = reinterpret_cast<float*>(smem + slot * kStageBytes + kCodeBytes);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) staged[lane + 32 * j] = scales[j];
      if (lane < kWeightBlocks) staged[kBlockM + lane] = weight_scale;
      ptx::mbarrier_arrive(full0 + 8 * slot);  // (release: this lane's stores above before the phase)
    }
  }

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    ScaledWsDriver<DenseWgmmaSs>::run(params);
  }
};

}  // namespace humming_aot::kernel
