#pragma once
// The portable W4A8 body on mma.sync m16n8k32 (SM80+ with s8 activations, SM89+ with e4m3 ones):
// out[m, n] = sum_g (sum_{k in g} a[m, k] w[n, k]) w_scale[g, n] x a_scale[m] (+ bias), 4-bit
// weight codes in W4A8's packed layout (version 2, humming_aot.w4a8: the 8-bit A fragments of
// m16n8k32, which is how the sm90a wgmma-w4a8 body reads them too), 8-bit activation codes
// (Codes: mma/mma_sync_8bit.cuh) with fp32 token scales. The weights are symmetric int4 codes, or
// uint4 codes less an integer zero point (numerics/uint4_zero_point.cuh: the K tile entry holds
// the fp32 scale and the zero point's bytes), with fp32 group scales of a multiple of 128, or
// (e4m3 activations) MXFP4 codes whose K tile entry holds an fp32 scale and its four groups'
// bytes (numerics/e2m1_e4m3.cuh).
//
// The weights are the mma's A (16 channels per m16 fragment), the tokens its B (8 per n8), so the
// accumulators hold the output transposed (epilogue/swapped_output_writer.cuh writes them, and
// reduces the K slices of a split tile through the workspace in slice order). A CTA's threads copy
// per K tile of 128, with cp.async into a kStages ring: the activation codes (K-major rows,
// memory/k_major_code_tile.cuh), the packed codes of its 64-channel units (4096 bytes each, in
// the order a warp loads its fragments: one 16-byte load per 16 channels and two k32 steps), and
// the K tile's group scale of each channel. Each warp widens its codes in registers
// (Widen: numerics/int4_s8.cuh, int4_e4m3.cuh, uint4_zero_point.cuh or e2m1_e4m3.cuh: a handful of
// integer instructions
// per 8 codes), reads
// its token fragments with ldmatrix, multiplies, and weighs the K tile's sums by their group scale
// into fp32 accumulators (a K tile lies in one group). e4m3 codes carry the values x 2^-9, which
// the token scale puts back.
//
// Params: ScaledTmaGemmParams (kernel/params.cuh), of which this body reads tma.gemm (a: (m, K)
// codes, lda in bytes; w: (k / 128, n / 64, 4096) packed codes; w_scale: (groups, n) entries of
// Widen::kEntryBytes (fp32 scales; uint4: and zero points; MXFP4: one row per K tile); bias;
// out; workspace; tile_counters; m; n, a multiple of 64; k: the K tiles x 128; group_size, a
// multiple of 128 (MXFP4: its fold's span, unused here: this body promotes each K tile); k_splits =
// gridDim.y), a_scale ((m,) fp32) and tma.dp_ctas, which holds the activation codes' own K (their
// row length, a multiple of 16: codes past it are zero-filled; this body has no tail-split
// schedule to read there). The MoE schedule around it
// (kernel/grouped_masked.cuh, MaskedScaledGemmParams) runs its tiles through run_tile on
// ScaledRows: the same fields, moved to one expert's weights and rows.

#include <humming_aot/epilogue/swapped_output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/cp_async_ring.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/k_major_code_tile.cuh>
#include <humming_aot/memory/l2_prefetch.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/mma/mma_sync_8bit.cuh>
#include <humming_aot/numerics/e2m1_e4m3.cuh>
#include <humming_aot/numerics/int4_e4m3.cuh>
#include <humming_aot/numerics/int4_s8.cuh>
#include <humming_aot/numerics/uint4_zero_point.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Out,                 // Float16 or BFloat16: the output (and bias) dtype
          class Codes,               // mma::S8SyncCodes or mma::E4m3SyncCodes: the activations' codes
          class Widen,               // the weights' conversion: numerics::Int4ToS8 or Uint4ZeroPointToS8
                                     // (S8SyncCodes), Int4ToE4m3, Uint4ZeroPointToE4m3 or E2m1ToE4m3 (E4m3SyncCodes)
          int kBlockM,               // tokens per CTA: 16 x token pairs x kWarpsM
          int kBlockN,               // weight channels per CTA: 64 x units
          int kWarpsM, int kWarpsN,  // warps along tokens and along channels
          int kStages>               // cp.async ring depth (K tiles of 128)
struct DenseMmaW4a8 {
  static constexpr int kBlockK = 128;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpTokens = kBlockM / kWarpsM, kWarpChannels = kBlockN / kWarpsN;
  static constexpr int kMTiles = kWarpChannels / 16;  // m16 fragments (16 channels) per warp
  static constexpr int kNTiles = kWarpTokens / 8;     // n8 fragments (8 tokens) per warp
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kUnitBytes = 4096;  // a 64-channel unit's packed codes of one K tile
  static_assert(kBlockN % 64 == 0, "whole 64-channel units of the packed layout");
  static_assert(kWarpChannels % 16 == 0 && kWarpChannels > 0, "whole m16 fragments of channels per warp");
  static_assert(kWarpTokens % 16 == 0 && kWarpTokens > 0, "whole pairs of n8 token fragments (one ldmatrix.x4)");
  static_assert(kStages >= 2, "a ring of at least two K tiles");
  static_assert(Codes::kExactSums == Widen::kS8Bytes,
                "s8 activations take s8 weights (Int4ToS8), e4m3 ones e4m3 weights");
  static constexpr int kEntryBytes = Widen::kEntryBytes;  // a channel's scale entry per K tile

  using ATile = memory::KMajorCodeTile<kBlockM, kThreads>;
  static constexpr int kWOffset = ATile::kBytes;
  static constexpr int kSOffset = kWOffset + kUnits * kUnitBytes;
  static constexpr int kStageBytes = kSOffset + kBlockN * kEntryBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // = humming_aot.bodies.mma_w4a8 smem_bytes
  static constexpr bool kScalesInFp32 = true;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kWChunks = kUnits * kUnitBytes / 16, kSChunks = kBlockN * kEntryBytes / 16;
  using Sum = typename Codes::Sum;
  using Writer = epilogue::SwappedOutputWriter<Out, kMTiles * kNTiles, kNTiles>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Ring = mainloop::CpAsyncRing<kStages, kStageBytes>;

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    // Launched with programmatic dependent launch (sm_90+), as every GEMM may be: the activations,
    // scales and output may belong to the previous kernel in the stream until it has completed.
    schedule::wait_for_upstream_grid();
    const GemmParams& p = params.tma.gemm;
    run_scheduled(p, params.a_scale, params.tma.dp_ctas, Scheduler(p.m, p.n, p.k, p.k_splits), [] {});
  }

  // One output tile of `rows`, the one of linear index `linear_tile` in the scheduler's raster,
  // over the CTA's K slice; `at_epilogue` runs as the epilogue starts. For a persistent MoE
  // schedule (kernel/grouped_masked.cuh), which runs several tiles per CTA with a CTA barrier
  // between them (the ring drains its cp.async groups at the end of the K loop). K slices reduce
  // through rows.gemm's workspace and counters as the dense kernel's do.
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_tile(const ScaledRows& rows, u32 linear_tile, AtEpilogue at_epilogue) {
    const GemmParams& p = rows.gemm;
    run_scheduled(p, rows.a_scale, rows.a_k, Scheduler(p.m, p.n, p.k, p.k_splits, linear_tile), at_epilogue);
  }

  // L2 prefetches of tile `linear_tile`'s packed codes and scale entries over the first K tiles
  // of the CTA's K slice (the ring's depth, or up to kPrefetchBytes of codes), issued by every
  // thread: a persistent schedule calls it for the CTA's next tile before it runs the current one.
  static constexpr int kPrefetchBytes = 32768;
  static constexpr int kPrefetchTiles =
      kPrefetchBytes / (kUnits * kUnitBytes) > kStages ? kPrefetchBytes / (kUnits * kUnitBytes) : kStages;
  static __device__ __forceinline__ void prefetch_tile(const ScaledRows& rows, u32 linear_tile) {
    const GemmParams& p = rows.gemm;
    const Scheduler tile(p.m, p.n, p.k, p.k_splits, linear_tile);
    const int span = tile.k_tile_end - tile.k_tile_begin;
    const int k_tiles = span < kPrefetchTiles ? span : kPrefetchTiles;
    const int units_n = p.n / 64, unit0 = tile.n_tile * kBlockN / 64;
    const int units = units_n - unit0 < kUnits ? units_n - unit0 : kUnits;  // (the last tile may hang past N)
    const int w_lines = units * kUnitBytes / 128;  // a K tile's lines of the tile's codes: contiguous
    const int s_lines = (units * 64 * kEntryBytes + 127) / 128;
    const int group_tiles = Widen::kSpans ? 1 : p.group_size / kBlockK;  // (MXFP4: a row per K tile)
    for (int i = threadIdx.x; i < k_tiles * (w_lines + s_lines); i += kThreads) {
      const int k_tile = tile.k_tile_begin + i / (w_lines + s_lines), line = i % (w_lines + s_lines);
      if (line < w_lines) {
        memory::prefetch_l2(static_cast<const char*>(p.w) + (static_cast<i64>(k_tile) * units_n + unit0) * kUnitBytes +
                            128 * line);
      } else {
        const i64 row = static_cast<i64>(k_tile / group_tiles) * p.n + tile.n_tile * kBlockN;
        memory::prefetch_l2(static_cast<const char*>(p.w_scale) + row * kEntryBytes + 128 * (line - w_lines));
      }
    }
  }

 private:
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_scheduled(const GemmParams& p, const float* a_scale, int a_k,
                                                       const Scheduler& tile, AtEpilogue at_epilogue) {
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int count = tile.k_tile_end - tile.k_tile_begin;  // may be 0: a slice past K adds zeros
    const u32 smem_base = memory::shared_address(smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

    // Copies: the activations, the CTA's units of packed codes (units past N zero-filled), the
    // K tile's group-scale row of its channels.
    const ATile a_tile(static_cast<const char*>(p.a) + static_cast<i64>(m0) * p.lda, p.lda, p.m - m0, a_k);
    const int units_n = p.n / 64, unit0 = n0 / 64;
    const char* w_src = static_cast<const char*>(p.w) + static_cast<i64>(unit0) * kUnitBytes;
    const i64 w_tile_bytes = static_cast<i64>(units_n) * kUnitBytes;
    const char* s_src = static_cast<const char*>(p.w_scale) + kEntryBytes * static_cast<i64>(n0);
    const int group_tiles = Widen::kSpans ? 1 : p.group_size / kBlockK;  // (MXFP4: a row per K tile)
    auto load = [&](int slot, int index) {
      const int k_tile = tile.k_tile_begin + index;
      const u32 stage = smem_base + static_cast<u32>(slot * kStageBytes);
      a_tile.load(stage, k_tile * kBlockK);
      const char* w_tile = w_src + k_tile * w_tile_bytes;
#pragma unroll
      for (int i = threadIdx.x; i < kWChunks; i += kThreads)
        memory::cp_async_16(stage + kWOffset + 16 * i, w_tile + 16 * i, unit0 + i / (kUnitBytes / 16) < units_n);
      const char* s_row = s_src + static_cast<i64>(k_tile / group_tiles) * kEntryBytes * p.n;
      for (int i = threadIdx.x; i < kSChunks; i += kThreads)
        memory::cp_async_16(stage + kSOffset + 16 * i, s_row + 16 * i, n0 + 16 / kEntryBytes * i < p.n);
    };

    Sum sums[kMTiles][kNTiles][4];
    float acc[kNTiles * kMTiles][4];  // fragment j = ni * kMTiles + mi (the writer's order)
#pragma unroll
    for (int j = 0; j < kNTiles * kMTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    Ring::run(smem_base, count, load, [&](int it) {
      const u32 stage = Ring::stage(smem_base, it);
      multiply(stage, warp_m, warp_n, lane, sums);
      // weigh the K tile's sums by each channel's group scale (rows g and g + 8 of each m16)
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        const int row = warp_n * kWarpChannels + 16 * mi + (lane >> 2);
        float low, high;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(low) : "r"(stage + kSOffset + kEntryBytes * row));
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(high) : "r"(stage + kSOffset + kEntryBytes * (row + 8)));
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni) {
          float* a = acc[ni * kMTiles + mi];
          a[0] += static_cast<float>(sums[mi][ni][0]) * low;
          a[1] += static_cast<float>(sums[mi][ni][1]) * low;
          a[2] += static_cast<float>(sums[mi][ni][2]) * high;
          a[3] += static_cast<float>(sums[mi][ni][3]) * high;
        }
      }
    });

    at_epilogue();
    // the token scales (x 2^9 for e4m3 codes); tokens past M: 0, never stored
    const int token0 = m0 + warp_m * kWarpTokens, col0 = n0 + warp_n * kWarpChannels;
    Writer::for_each(token0, col0, [&](int j, int e, int token, int) {
      acc[j][e] *= token < p.m ? a_scale[token] * Widen::kValueScale : 0.f;
    });
    Writer::write(p, acc, token0, col0, tile.tile_index, &arrival_flag);
  }

  // The warp's products of one K tile at `stage` into its sums (overwritten: the first step's mma
  // start from zero). Per m16 fragment and pair of k32 steps one 16-byte load of packed codes at
  // ((w * 2 + h) * 32 + lane) * 16 of its unit (w: its 16 channels within the unit), two words a
  // step, each widened into two A registers; the tokens' B fragments per step
  // (memory/k_major_code_tile.cuh).
  static __device__ __forceinline__ void multiply(u32 stage, int warp_m, int warp_n, int lane,
                                                  Sum (&sums)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) sums[mi][ni][c] = Sum(0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      u32 words[kMTiles][4];
      u32 groups[kMTiles][2];  // with group tables: the K tile's group bytes of rows g and g + 8
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        const int channel = warp_n * kWarpChannels + 16 * mi;  // the fragment's first, within the CTA
        const int unit = channel / 64, slot16 = (channel % 64) / 16;
        memory::lds_128(words[mi], stage + kWOffset + unit * kUnitBytes + ((slot16 * 2 + h) * 32 + lane) * 16);
        if constexpr (Widen::kGroupTables) {
          const u32 entry = stage + kSOffset + kEntryBytes * (channel + (lane >> 2));
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(groups[mi][0]) : "r"(entry + 4));
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(groups[mi][1]) : "r"(entry + 4 + 8 * kEntryBytes));
        }
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int step = 2 * h + s;
        u32 a[kMTiles][4];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          if constexpr (Widen::kGroupTables) {  // K step `step` is group `step` of the K tile
            const typename Widen::Table low = Widen::table(groups[mi][0], step);
            const typename Widen::Table high = Widen::table(groups[mi][1], step);
            Widen::convert(words[mi][2 * s], low, high, a[mi][0], a[mi][1]);
            Widen::convert(words[mi][2 * s + 1], low, high, a[mi][2], a[mi][3]);
          } else {
            Widen::convert(words[mi][2 * s], a[mi][0], a[mi][1]);
            Widen::convert(words[mi][2 * s + 1], a[mi][2], a[mi][3]);
          }
        }
        u32 b[kNTiles][2];
        ATile::template b_fragments<kNTiles / 2>(stage, warp_m * kWarpTokens, step, lane, b);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNTiles; ++ni) Codes::mma(sums[mi][ni], a[mi], b[ni]);
      }
    }
  }
};

}  // namespace humming_aot::kernel
