#pragma once
// The portable W8A8 body on mma.sync (SM80+ for s8, SM89+ for e4m3): 8-bit activation and weight
// codes of one element (Codes: mma/mma_sync_8bit.cuh), fp32 scales, a 16-bit output, in one of
// two scalings (as kernel/dense_wgmma_ss.cuh's):
// - token x channel: out[m, n] = (sum_k a[m, k] w[n, k]) x a_scale[m] x w_scale[n] (+ bias);
// - blocks (kBlockScales, DeepSeek-V3, e4m3 only): each K tile of 128 is one K block, whose sums
//   are weighed at their promotion by a_scale[m, k / 128] x w_scale[n / 128, k / 128].
// The arches
// without wgmma (Ampere, Ada, Blackwell's portable path) run W8A8 here; sm90a has the
// warp-specialized wgmma-ss body (kernel/dense_wgmma_ss.cuh), which takes the same operands.
// W4A4 (Codes = mma::S4SyncCodes, every arch): s4 codes two to a byte run the same staging and
// fragments in bytes (m16n8k64), so every K below is counted in bytes: a K tile of 128 bytes is
// 256 codes.
//
// Both operands stay codes: K-major rows (the checkpoint's (N, K) weight codes as they are, and
// the (M, K) activation codes), copied by cp.async into a kStages-deep ring of 128-code K tiles
// (memory/k_major_code_tile.cuh), read by ldmatrix straight into mma.sync m16n8k32 fragments
// (a row of 8-bit codes is a row of b16 pairs). Nothing is dequantized. e4m3 sums are promoted
// into fp32 accumulators once per K tile (the fp8 tensor cores' running sums keep fewer bits);
// s8 sums are exact int32 over the CTA's K, made fp32 once. Channel scales multiply the fp32 sums
// at the end (block scales at each promotion), then the mma.sync body's writer (epilogue/output_writer.cuh) adds the bias and stores,
// or reduces the K slices of a split tile through the workspace in slice order (deterministic).
//
// Params: ScaledTmaGemmParams (kernel/params.cuh), of which this body reads tma.gemm (a, w,
// w_scale: (n,) fp32, or with block scales (ceil(n / 128), k / 128) fp32, bias, out, workspace,
// tile_counters, lda in bytes, ldo, m, n, k: K rounded up to 128, group_size: the codes' own K
// (in bytes: s4 codes are two a byte), a multiple of 16 and the weights' row length, k_splits =
// gridDim.y), a_scale ((m,) fp32, or
// with block scales (m, k / 128) rows a_scale_stride apart); no tensor map. gridDim.x: the tiles.
// The MoE schedule around it (kernel/grouped_masked.cuh, MaskedScaledGemmParams) runs its tiles
// through run_tile on ScaledRows: the same fields, moved to one expert's weights and rows.

#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/cp_async_ring.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/k_major_code_tile.cuh>
#include <humming_aot/memory/l2_prefetch.cuh>
#include <humming_aot/mma/mma_sync_8bit.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Out,                 // Float16 or BFloat16: the output (and bias) dtype
          class Codes,               // mma::S8SyncCodes or mma::E4m3SyncCodes: both operands' codes
          bool kBlockScales,         // scales per 128 x 128 weight block and 1 x 128 token group
          int kBlockM,               // tokens per CTA: 16 x m16 fragments x kWarpsM
          int kBlockN,               // weight channels per CTA: 16 x n16 pairs x kWarpsN
          int kWarpsM, int kWarpsN,  // the warp grid over the output tile
          int kStages>               // cp.async ring depth (K tiles of 128 codes)
struct DenseMmaSs {
  static constexpr int kBlockK = 128;  // codes per K tile: one 128-byte row per operand row
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpRows = kBlockM / kWarpsM, kWarpCols = kBlockN / kWarpsN;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 fragments per warp
  static constexpr int kNTiles = kWarpCols / 8;   // n8 fragments per warp
  static constexpr bool kPromote = !Codes::kExactSums;
  static_assert(kWarpRows % 16 == 0 && kWarpRows > 0, "whole m16 fragments per warp");
  static_assert(kWarpCols % 16 == 0 && kWarpCols > 0, "whole pairs of n8 fragments per warp (one ldmatrix.x4)");
  static_assert(kStages >= 2, "a ring of at least two K tiles");
  static_assert(kThreads <= 512, "at most 16 warps");
  static_assert(!kBlockScales || (kPromote && 128 % kWarpCols == 0),
                "block scales: e4m3 codes (promoted per K tile), a warp's columns inside one 128-channel block");

  using ATile = memory::KMajorCodeTile<kBlockM, kThreads>;
  using WTile = memory::KMajorCodeTile<kBlockN, kThreads>;
  static constexpr int kStageBytes = ATile::kBytes + WTile::kBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // = humming_aot.bodies.mma_ss smem_bytes
  static constexpr bool kScalesInFp32 = true;               // the scales weigh fp32 sums
  static constexpr int kMinBlocksPerSm = 1;
  using Sum = typename Codes::Sum;
  using Writer = epilogue::OutputWriter<Out, kMTiles, kNTiles>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Ring = mainloop::CpAsyncRing<kStages, kStageBytes>;

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    // Launched with programmatic dependent launch (sm_90+), as every GEMM may be: the activations,
    // scales and output may belong to the previous kernel in the stream until it has completed.
    schedule::wait_for_upstream_grid();
    const GemmParams& p = params.tma.gemm;
    run_scheduled(p, params.a_scale, params.a_scale_stride, Scheduler(p.m, p.n, p.k, p.k_splits), [] {});
  }

  // The MoE schedule's entry (kernel/grouped_masked.cuh), with DenseMmaW4a8::run_tile's contract;
  // rows.a_scale_stride: the floats between rows' block scales (unused for scales per token).
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_tile(const ScaledRows& rows, u32 linear_tile, AtEpilogue at_epilogue) {
    const GemmParams& p = rows.gemm;
    run_scheduled(p, rows.a_scale, rows.a_scale_stride, Scheduler(p.m, p.n, p.k, p.k_splits, linear_tile), at_epilogue);
  }

  // L2 prefetches of tile `linear_tile`'s weight codes (a 128-byte line per channel row and K
  // tile) over the first K tiles of the CTA's K slice (the ring's depth, or up to kPrefetchBytes),
  // issued by every thread: a persistent schedule calls it for the CTA's next tile before it runs
  // the current one. (The scales are a few lines, read at the first promotion or the end.)
  static constexpr int kPrefetchBytes = 32768;
  static constexpr int kPrefetchTiles =
      kPrefetchBytes / (kBlockN * kBlockK) > kStages ? kPrefetchBytes / (kBlockN * kBlockK) : kStages;
  static __device__ __forceinline__ void prefetch_tile(const ScaledRows& rows, u32 linear_tile) {
    const GemmParams& p = rows.gemm;
    const Scheduler tile(p.m, p.n, p.k, p.k_splits, linear_tile);
    const int k_codes = p.group_size, n0 = tile.n_tile * kBlockN;
    const int k_begin = tile.k_tile_begin * kBlockK;
    const int k_end = tile.k_tile_end * kBlockK < k_codes ? tile.k_tile_end * kBlockK : k_codes;
    const int span = k_end - k_begin < kPrefetchTiles * kBlockK ? k_end - k_begin : kPrefetchTiles * kBlockK;
    const int channels = p.n - n0 < kBlockN ? p.n - n0 : kBlockN;
    if (span <= 0 || channels <= 0) return;
    const int lines = (span + 127) / 128;  // a channel's lines of the span (its codes are one row)
    for (int i = threadIdx.x; i < channels * lines; i += kThreads) {
      const int channel = i / lines, line = i % lines;
      memory::prefetch_l2(static_cast<const char*>(p.w) + static_cast<i64>(n0 + channel) * k_codes + k_begin +
                          128 * line);
    }
  }

 private:
  template <class AtEpilogue>
  static __device__ __forceinline__ void run_scheduled(const GemmParams& p, const float* a_scale_rows,
                                                       int a_scale_stride, const Scheduler& tile,
                                                       AtEpilogue at_epilogue) {
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int count = tile.k_tile_end - tile.k_tile_begin;  // may be 0: a slice past K adds zeros
    const int k_codes = p.group_size;
    const int k_first = tile.k_tile_begin * kBlockK;
    const u32 smem_base = memory::shared_address(smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

    const ATile a_tile(static_cast<const char*>(p.a) + static_cast<i64>(m0) * p.lda, p.lda, p.m - m0, k_codes);
    const WTile w_tile(static_cast<const char*>(p.w) + static_cast<i64>(n0) * k_codes, k_codes, p.n - n0, k_codes);
    auto load = [&](int slot, int k_tile) {
      const u32 stage = smem_base + static_cast<u32>(slot * kStageBytes);
      const int k0 = k_first + k_tile * kBlockK;
      a_tile.load(stage, k0);
      w_tile.load(stage + ATile::kBytes, k0);
    };

    Sum sums[kMTiles][kNTiles][4];
    float acc[kMTiles][kNTiles][4];  // kPromote: the fp32 accumulators the K tiles' sums go into
    zero(sums);
    if constexpr (kPromote) zero(acc);

    Ring::run(smem_base, count, load, [&](int it) {
      float token[kMTiles][2];  // kBlockScales: each of the thread's rows' block scale, x the warp's weight block
      if constexpr (kBlockScales) {
        // (loaded before the K tile's mma, which hide their latency)
        const int k_block = tile.k_tile_begin + it, k_blocks = p.k / kBlockK;
        // the warp's 128-channel block, or the last one for a warp wholly past N (a tile wider than
        // the rest of N: its sums are never stored, and no read leaves the scales)
        const int warp_block = (n0 + warp_n * kWarpCols) / 128, last_block = (p.n - 1) / 128;
        const int block_row = warp_block < last_block ? warp_block : last_block;
        const float w_block = static_cast<const float*>(p.w_scale)[block_row * k_blocks + k_block];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = m0 + warp_m * kWarpRows + 16 * mi + (lane >> 2) + 8 * half;
            token[mi][half] =
                row < p.m ? a_scale_rows[static_cast<i64>(row) * a_scale_stride + k_block] * w_block : 0.f;
          }
      }
      multiply(Ring::stage(smem_base, it), warp_m, warp_n, lane, sums);
      if constexpr (kPromote) {  // the K tile's sums into the fp32 accumulators (weighed by block scales)
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              if constexpr (kBlockScales)
                acc[mi][ni][c] += sums[mi][ni][c] * token[mi][c >> 1];
              else
                acc[mi][ni][c] += sums[mi][ni][c];
              sums[mi][ni][c] = 0.f;
            }
      }
    });

    at_epilogue();
    // Channel scaling: the scales on the fp32 sums, the token's (rows past M: 0, never stored) and
    // the channel's (N is padded to the weight's own 16, so every column of the tile below p.n has
    // one). Block scales weighed the sums at each promotion.
    const int row0 = m0 + warp_m * kWarpRows, col0 = n0 + warp_n * kWarpCols;
    const float* w_scale = static_cast<const float*>(p.w_scale);
    if constexpr (!kBlockScales)
      Writer::for_each_pair(row0, col0, [&](int mi, int ni, int half, int row, int col) {
        const float a_scale = row < p.m ? a_scale_rows[row] : 0.f;
        const float s0 = col < p.n ? a_scale * w_scale[col] : 0.f, s1 = col < p.n ? a_scale * w_scale[col + 1] : 0.f;
        float* v = acc[mi][ni] + 2 * half;
        if constexpr (kPromote) {
          v[0] *= s0;
          v[1] *= s1;
        } else {
          v[0] = static_cast<float>(sums[mi][ni][2 * half]) * s0;
          v[1] = static_cast<float>(sums[mi][ni][2 * half + 1]) * s1;
        }
      });
    Writer::write(p, acc, row0, col0, tile.tile_index, &arrival_flag);
  }

  template <class T>
  static __device__ __forceinline__ void zero(T (&v)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) v[mi][ni][c] = T(0);
  }

  // The warp's products of one K tile (four k32 steps) at `stage` into its sums: per step its
  // activation rows' A fragments and its channels' B fragments (memory/k_major_code_tile.cuh).
  static __device__ __forceinline__ void multiply(u32 stage, int warp_m, int warp_n, int lane,
                                                  Sum (&sums)[kMTiles][kNTiles][4]) {
    const u32 w_stage = stage + ATile::kBytes;
#pragma unroll
    for (int step = 0; step < kBlockK / 32; ++step) {
      u32 a[kMTiles][4];
      u32 b[kNTiles][2];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) ATile::a_fragment(stage, warp_m * kWarpRows + 16 * mi, step, lane, a[mi]);
      WTile::template b_fragments<kNTiles / 2>(w_stage, warp_n * kWarpCols, step, lane, b);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni) Codes::mma(sums[mi][ni], a[mi], b[ni]);
    }
  }
};

}  // namespace humming_aot::kernel
