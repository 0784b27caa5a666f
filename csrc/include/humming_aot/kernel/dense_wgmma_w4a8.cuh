#pragma once
// The warp-specialized Hopper W4A8 body on wgmma (SM90a): 4-bit weight codes, int4 (-8 .. 7,
// symmetric) or uint4 less an integer zero point (AWQ) with an fp32 scale per channel per group of
// K (a multiple of 128, or all of K), or MXFP4 (e2m1 with an e8m0 scale per 32 of K), x e4m3
// activation codes with an fp32 scale per token, a 16-bit output:
//   out[m, n] = sum_g (sum_{k in g} a[m, k] w[n, k]) w_scale[g, n] x a_scale[m] x global scale (+ bias).
//
// The weights are wgmma's A from registers: each consumer thread turns its codes into e4m3 bytes of
// the values times 2^-9 with integer adds (numerics/int4_e4m3.cuh; MXFP4 codes: e4m3 bytes of the
// values times their group's scale relative to the K tile's, numerics/e2m1_e4m3.cuh; uint4 codes:
// e4m3 bytes of the code less its zero point times 2^-9, numerics/uint4_zero_point.cuh), so the tensor
// cores run at the 8-bit rate, and the tokens are its B from shared memory (N = the tile's tokens: a few tokens
// stay cheap). The group scales weigh each K tile's fp32 sums (mainloop/int4_e4m3_groups.cuh), the
// token scales the reduced sums before the store. Roles, schedules and epilogue:
// kernel/scaled_ws_driver.cuh, as for the W8A8 body (kernel/dense_wgmma_ss.cuh).
//
// A ring slot, per K tile of 128: the activation box (kBlockM rows x 128 codes, TMA, 128-byte
// swizzle, zeros past M and K), then the CTA's packed codes (one bulk copy: 64 bytes a channel,
// laid out as humming_aot.w4a8.pack writes them: per K tile, per 64-channel unit, 4096 bytes in
// the consumers' fragment order), then the K tile's entry of each channel (one bulk copy of its
// group's row: the fp32 scale, and for MXFP4 its four groups' bytes, for uint4 its zero point in
// every byte of a word). Params (ScaledTmaGemmParams): w the packed codes ((K / 128) x (N / 64) x
// 4096 bytes), w_scale the (groups, N) entries (MXFP4: one row per K tile), group_size the K of a
// group (MXFP4: of the span its scales are folded over, mainloop/int4_e4m3_groups.cuh), a_scale the
// (M,) token scales; the weight map is unused.

#include <humming_aot/epilogue/column_major_writer.cuh>
#include <humming_aot/epilogue/fragment_split_k.cuh>
#include <humming_aot/epilogue/stream_k_fixup.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/kernel/scaled_ws_driver.cuh>
#include <humming_aot/mainloop/int4_e4m3_groups.cuh>
#include <humming_aot/numerics/e2m1_e4m3.cuh>
#include <humming_aot/numerics/int4_e4m3.cuh>
#include <humming_aot/numerics/uint4_zero_point.cuh>
#include <humming_aot/ptx/bulk_copy.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/schedule/work_units.cuh>

namespace humming_aot::kernel {

template <class Out,               // Float16 or BFloat16: output (and bias) dtype
          class Widen,             // numerics::Int4ToE4m3 (int4 codes), E2m1ToE4m3 (MXFP4) or
                                   // Uint4ZeroPointToE4m3 (uint4 with a zero point)
          int kBlockM,             // tokens per CTA: the wgmma N (8, 16, 32, 64, 96, 128 or 192)
          int kBlockN,             // weight channels per CTA: 64 x kUnitsPerWarpGroup x consumer warpgroups
          int kUnitsPerWarpGroup,  // 64-channel units each consumer warpgroup multiplies (1 or 2)
          int kStages>             // slots of the mbarrier ring
struct DenseWgmmaW4A8 {
  static constexpr int kBlockK = 128;  // one 128-byte row of e4m3 activation codes per stage
  static constexpr int kRingStages = kStages, kTileM = kBlockM, kTileN = kBlockN;  // (for the driver)
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kConsumerWarpGroups = kUnits / kUnitsPerWarpGroup;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpGroups;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup, last

  static_assert(kBlockN % 64 == 0 && (kUnitsPerWarpGroup == 1 || kUnitsPerWarpGroup == 2), "one or two units");
  static_assert(kUnits % kUnitsPerWarpGroup == 0 && (kConsumerWarpGroups == 1 || kConsumerWarpGroups == 2),
                "one or two consumer warpgroups (the register split below assumes it)");
  static_assert(kBlockM <= 256, "a TMA box has at most 256 rows");
  static_assert(kStages >= 2, "a ring of at least two slots");

  using Units = schedule::WorkUnits<kBlockM, kBlockN, kBlockK, /*kPersistentTiles=*/true>;
  using StreamK = typename Units::StreamK;
  using Fragments = epilogue::WarpgroupFragments<kBlockM, kUnitsPerWarpGroup>;
  using ConsumerBarrier = ptx::NamedBarrier<kConsumerThreads, 1>;
  using Writer = epilogue::ColumnMajorWriter<Out, kBlockM, kBlockN, kConsumerThreads, Fragments, ConsumerBarrier>;
  using SplitK = epilogue::FragmentSplitK<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;
  using Fixup = epilogue::StreamKFixup<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;

  // A slot: the activation box first (1024-byte aligned, as its swizzle needs), the codes, the scales.
  static constexpr int kActivationBytes = kBlockM * 128;
  static constexpr int kWeightOffset = kActivationBytes;
  static constexpr int kScaleOffset = kWeightOffset + kBlockN * 64;
  static constexpr int kEntryBytes = Widen::kEntryBytes;  // a channel's scale entry per K tile
  static constexpr int kStageBytes = (kScaleOffset + kBlockN * kEntryBytes + 1023) / 1024 * 1024;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // The output's staging tile: after the ring where both fit (kernel/scaled_ws_driver.cuh).
  using Staging = StagingPlacement<kPipelineBytes, Writer::kStagingBytes, kConsumerWarpGroups>;
  static constexpr bool kSeparateStaging = Staging::kSeparate;
  static constexpr int kStagingOffset = Staging::kOffset;
  static constexpr int kSmemBytes = Staging::kSmemBytes;
  static constexpr bool kScalesInFp32 = true;  // the scales multiply fp32 sums
  static constexpr bool kWeightMap = false;    // the codes come by bulk copy
  // every consumer thread releases a slot after its own reads of it (mainloop/int4_e4m3_groups.cuh)
  static constexpr int kEmptyArrivals = kConsumerThreads;

  // CTAs per SM: one consumer warpgroup of one unit at decode sizes (at most 16 tokens) runs four,
  // whose conversions of the codes (the same work per weight at any M) then have four warps per
  // SM sub-partition to hide their latencies; other one-warpgroup tiles two, two-warpgroup ones one.
  static constexpr int kMinBlocksPerSm = kConsumerWarpGroups == 2 ? 1 : (kUnits == 1 && kBlockM <= 16 ? 4 : 2);
  using Registers = RegisterSplit<kThreads, kConsumerThreads, kMinBlocksPerSm>;
  static constexpr int kProducerRegisters = Registers::kProducer;
  static constexpr int kConsumerRegistersHeld = Registers::kHeld;

  // Wgmma steps in flight after each issue: three from 128 tokens (the next steps' conversion and
  // the previous K tile's promotion run beside up to three queued steps: 2-4 % faster than one
  // at 256-8192 tokens), one below (3-4 % faster at 64 and 128 tokens on the 64-token tile)
  // (docs/performance/log.md section 36).
  static constexpr int kWaitDepth = kBlockM >= 128 ? 3 : 1;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * (kBlockM / 2);  // (m64nN: N / 2 per unit)
  // registers for the fragments of kWaitDepth + 1 steps, half a K tile's codes, and the loop (and
  // the per-row state of MXFP4's group bytes and tables, or of uint4's zero points)
  static constexpr int kLoopRegisters = (4 * kWaitDepth + 8 + (Widen::kGroupTables ? 4 : 0)) * kUnitsPerWarpGroup + 16;
  // two scratch sets where they fit beside the accumulators, else one (bodies/wgmma_w4a8.py)
  // (strictly below: at equality ptxas spilled, 64 x 256 with two scratch sets)
  static constexpr bool kOverlapped = 3 * kAccumulators + kLoopRegisters < kConsumerRegistersHeld;
  static_assert(2 * kAccumulators + kLoopRegisters <= kConsumerRegistersHeld,
                "the consumers' registers hold the accumulators, a scratch set and the fragments");
  using Consumer = mainloop::Int4E4m3Groups<Widen, kBlockM, kUnitsPerWarpGroup, kStages, kStageBytes, kWeightOffset,
                                            kScaleOffset, kWaitDepth, kOverlapped>;
  using ConsumerState = typename Consumer::State;
  static_assert(Consumer::kAccumulators == kAccumulators, "one accumulator per N / 2 of each unit");

  // L2 prefetches of the codes and scale entries of the first K tiles of `count` from k_tile0 at
  // n0, as produce copies them (bulk prefetches by the producer's thread): decode-sized tiles (at
  // most 64 tokens, where the weights' stream sets the time), up to kPrefetchBytes of codes per SM
  // (what the memory streams in ~4 us), at least one K tile.
  // H200, 1 and 16 tokens with the quantization in front: 0.2-2.0 us less on 8 of 10 layer points,
  // and the GEMM alone 0-0.6 us faster (docs/performance/log.md section 49).
  static constexpr int kPrefetchBytes = 131072;
  static constexpr int kPrefetchTilesPerCta = kPrefetchBytes / kMinBlocksPerSm / (kBlockN * 64);
  static constexpr int kPrefetchTiles = kBlockM > 64 ? 0 : (kPrefetchTilesPerCta > 0 ? kPrefetchTilesPerCta : 1);
  static __device__ __forceinline__ void prefetch_weights(const ScaledTmaGemmParams& params, int n0, int k_tile0,
                                                          int count) {
    if constexpr (kPrefetchTiles > 0) {
      const GemmParams& p = params.tma.gemm;
      const int columns = p.n - n0 < kBlockN ? p.n - n0 : kBlockN;
      const i64 tile_stride = static_cast<i64>(p.n) * 64;
      const char* codes =
          static_cast<const char*>(p.w) + static_cast<i64>(k_tile0) * tile_stride + 64 * static_cast<i64>(n0);
      const char* scales = static_cast<const char*>(p.w_scale) + kEntryBytes * static_cast<i64>(n0);
      for (int it = 0; it < count && it < kPrefetchTiles; ++it, codes += tile_stride) {
        ptx::bulk_prefetch_l2(codes, static_cast<u32>(columns) * 64);
        const u32 row = entry_row(k_tile0 + it, static_cast<u32>(p.group_size));
        ptx::bulk_prefetch_l2(scales + static_cast<i64>(row) * kEntryBytes * p.n,
                              static_cast<u32>(columns) * kEntryBytes);
      }
    }
  }

  // The row of w_scale that holds K tile k_tile's entries: its group's, or with spans (MXFP4) its own.
  static __device__ __forceinline__ u32 entry_row(int k_tile, u32 group_size) {
    if constexpr (Widen::kSpans) return static_cast<u32>(k_tile);
    return static_cast<u32>(k_tile * kBlockK) / group_size;
  }

  // The producer: one thread issues the copies of `count` K tiles from k_tile0 on of the tile at (m0, n0).
  static __device__ __forceinline__ void produce(const ScaledTmaGemmParams& params, int m0, int n0, int k_tile0,
                                                 int count, u32 smem_base, u32 full0, u32 empty0, u32& fills) {
    produce_rows(params.tma.gemm, &params.tma.a_map, m0, n0, k_tile0, count, smem_base, full0, empty0, fills);
  }

  // produce's copies from the weights, scales and N of p and the activation boxes of a_map from its
  // row box_row on (for the schedules that drive produce and consume themselves: the MoE one,
  // kernel/grouped_masked_scaled_ws.cuh, passes p moved to the tile's expert and the map row of the
  // expert's tile).
  static __device__ __forceinline__ void produce_rows(const GemmParams& p, const TensorMap* a_map, int box_row, int n0,
                                                      int k_tile0, int count, u32 smem_base, u32 full0, u32 empty0,
                                                      u32& fills) {
    // Columns past N (a last tile of a CTA wider than the rest of N) are not copied: their stale
    // shared memory only reaches outputs that are never stored. N is a multiple of 64.
    const int columns = p.n - n0 < kBlockN ? p.n - n0 : kBlockN;
    const u32 code_bytes = static_cast<u32>(columns) * 64, scale_bytes = static_cast<u32>(columns) * kEntryBytes;
    const i64 tile_stride = static_cast<i64>(p.n) * 64;  // one K tile's codes of every channel
    const char* codes =
        static_cast<const char*>(p.w) + static_cast<i64>(k_tile0) * tile_stride + 64 * static_cast<i64>(n0);
    const char* scales = static_cast<const char*>(p.w_scale) + kEntryBytes * static_cast<i64>(n0);
    const u32 group = static_cast<u32>(p.group_size);
    for (int it = 0; it < count; ++it, ++fills) {
      const u32 slot = fills % kStages, lap = fills / kStages;
      const u32 full = full0 + 8 * slot;
      // lap f of the slot waits for the consumers' release of lap f - 1: the empty barrier's phase f - 1
      if (lap > 0) ptx::mbarrier_wait(empty0 + 8 * slot, (lap + 1) & 1u);
      const u32 stage = smem_base + slot * kStageBytes;
      ptx::mbarrier_arrive_expect_tx(full, kActivationBytes + code_bytes + scale_bytes);
      const int k_tile = k_tile0 + it;
      ptx::tensor_copy_2d_g2s(stage, a_map, k_tile * (kBlockK / 2), box_row, full);  // 16-bit pairs
      ptx::bulk_copy_g2s(stage + kWeightOffset, codes, code_bytes, full);
      codes += tile_stride;
      const u32 row = entry_row(k_tile, group);
      ptx::bulk_copy_g2s(stage + kScaleOffset, scales + static_cast<i64>(row) * kEntryBytes * p.n, scale_bytes, full);
    }
  }

  // The reduced fp32 sums (group scales applied) times the integer codes' 2^9 (numerics/int4_e4m3.cuh:
  // exact, and first, so that no token scale near the float limit overflows with it) and their
  // tokens' scales (0 past M: never stored).
  static __device__ __forceinline__ void scale_sums(const ScaledTmaGemmParams& params, float (&acc)[kAccumulators],
                                                    int m0, int) {
    scale_rows(acc, m0, params.tma.gemm.m, params.a_scale);
  }

  // scale_sums of the tile from row m0 of m rows whose scales a_scale holds, one float a row.
  static __device__ __forceinline__ void scale_rows(float (&acc)[kAccumulators], int m0, int m, const float* a_scale) {
    if constexpr (Widen::kValueScale != 1.f) {
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] *= Widen::kValueScale;
    }
    Fragments::scale_tokens(acc, [&](int token) { return m0 + token < m ? a_scale[m0 + token] : 0.f; });
  }

  // The MoE schedule's hooks (kernel/grouped_masked_scaled_ws.cuh): the copies of a tile of the
  // expert's rows r (weights moved to the expert) from the activation map's row box_row, and the
  // scales of its sums (the K loop reads no rows; the producer copies everything a slot holds).
  static constexpr bool kLoopReadsRows = false;
  static constexpr bool kKSlices = false;  // (the slice bounds spill the 128 x 128 consumers' K loop)
  static constexpr int kGatherArrivals = 0;
  static __device__ __forceinline__ void produce_expert(const MaskedScaledTmaGemmParams& params, const ScaledRows& r,
                                                        u32 /*expert*/, int box_row, int n0, int k_tile0, int count,
                                                        u32 smem_base, u32 full0, u32 empty0, u32& fills) {
    produce_rows(r.gemm, &params.a_map, box_row, n0, k_tile0, count, smem_base, full0, empty0, fills);
  }
  static __device__ __forceinline__ void scale_expert(float (&acc)[kAccumulators], const ScaledRows& r, int m0, int) {
    scale_rows(acc, m0, r.gemm.m, r.a_scale);
  }

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    ScaledWsDriver<DenseWgmmaW4A8>::run(params);
  }
};

}  // namespace humming_aot::kernel
