#pragma once
// The block-scaled FP4 body (W4A4 NVFP4 x NVFP4, MXFP4 x MXFP4) on mma.sync m16n8k64
// .kind::mxf4nvf4 .block_scale (SM120a / SM121a: mma/mma_sync_fp4.cuh): e2m1 activation and
// weight codes, two to a byte, each with its own ue4m3 scale per 16 of K (NVFP4) or ue8m0 per 32
// (MXFP4), which the tensor cores apply; fp32 sums, a 16-bit output:
//   out[m, n] = (sum_k a[m, k] sa[m, k / G] w[n, k] sw[n, k / G]) x a_global x w_global (+ bias).
//
// The staging is the portable W8A8 body's (kernel/dense_mma_ss.cuh) in bytes: K-major rows of
// codes by cp.async into a kStages-deep ring of K tiles of 128 bytes (256 codes), ldmatrix into
// the m16n8k64 fragments (those of s4), plus each row's scale bytes of the K tile
// (memory/k_major_scale_tile.cuh) in the same stage. Per k64 step a lane reads one scale word per
// two m16 fragments (its rows) and one per four n8 fragments (its columns); the mma's thread_id
// selectors pick the fragment's lanes within the quad. Each K tile's sums are added into fp32
// accumulators apart from the mma's running sums (as the e4m3 body does), then the activations'
// global scale (NVFP4's second level, read on the device) multiplies them, and the mma.sync
// writer (epilogue/output_writer.cuh) applies the weight's global scale and the bias and stores, or
// reduces the K slices of a split tile through the workspace in slice order (deterministic).
//
// Params: ScaledTmaGemmParams (kernel/params.cuh), of which this body reads tma.gemm (a: (m, K / 2)
// code bytes rows lda bytes apart, w: (n, K / 2) code bytes, w_scale: (n, k / 128 x S) scale
// bytes (S = Codes::kTileScaleBytes), w_zero_point: the activations' global scale (one fp32) or
// nullptr, bias, out, workspace, tile_counters, ldo, m, n, k: the code bytes' K rounded up to 128,
// group_size: the code bytes' own K (the weights' row length), k_splits = gridDim.y,
// global_scale: the weight's), a_scale: (m, k / 128 x S) scale bytes, no tensor map. gridDim.x:
// the tiles. Every K past the codes' own is zero in codes and scales alike (the scales by pack and
// the launch).

#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/cp_async_ring.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/k_major_code_tile.cuh>
#include <humming_aot/memory/k_major_scale_tile.cuh>
#include <humming_aot/mma/mma_sync_fp4.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Out,                 // Float16 or BFloat16: the output (and bias) dtype
          class Codes,               // mma::Fp4BlockScaledSync<4> (NVFP4) or <2> (MXFP4)
          int kBlockM,               // tokens per CTA: 16 x m16 fragments x kWarpsM
          int kBlockN,               // weight channels per CTA: 16 x n16 pairs x kWarpsN
          int kWarpsM, int kWarpsN,  // the warp grid over the output tile
          int kStages>               // cp.async ring depth (K tiles of 128 code bytes)
struct DenseMmaFp4 {
  static constexpr int kBlockK = 128;          // code bytes per K tile: one 128-byte row per operand row
  static constexpr int kSteps = kBlockK / 32;  // k64 steps (32 code bytes each) per K tile
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpRows = kBlockM / kWarpsM, kWarpCols = kBlockN / kWarpsN;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 fragments per warp
  static constexpr int kNTiles = kWarpCols / 8;   // n8 fragments per warp
  static constexpr int kScaleBytes = Codes::kTileScaleBytes;
  static_assert(kWarpRows % 16 == 0 && kWarpRows > 0, "whole m16 fragments per warp");
  static_assert(kWarpCols % 16 == 0 && kWarpCols > 0, "whole pairs of n8 fragments per warp (one ldmatrix.x4)");
  static_assert(kStages >= 2, "a ring of at least two K tiles");
  static_assert(kThreads <= 512, "at most 16 warps");

  using ATile = memory::KMajorCodeTile<kBlockM, kThreads>;
  using WTile = memory::KMajorCodeTile<kBlockN, kThreads>;
  using AScales = memory::KMajorScaleTile<kBlockM, kThreads, kScaleBytes>;
  using WScales = memory::KMajorScaleTile<kBlockN, kThreads, kScaleBytes>;
  static constexpr int kAScalesAt = ATile::kBytes + WTile::kBytes;  // byte offsets in a stage
  static constexpr int kWScalesAt = kAScalesAt + AScales::kBytes;
  static constexpr int kStageBytes = kWScalesAt + WScales::kBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // = humming_aot.bodies.mma_fp4 key_smem_bytes
  static constexpr bool kScalesInFp32 = true;               // the scales weigh fp32 sums
  static constexpr int kMinBlocksPerSm = 1;
  using Writer = epilogue::OutputWriter<Out, kMTiles, kNTiles>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Ring = mainloop::CpAsyncRing<kStages, kStageBytes>;

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    // Launched with programmatic dependent launch (sm_90+), as every GEMM may be: the activations,
    // scales and output may belong to the previous kernel in the stream until it has completed.
    schedule::wait_for_upstream_grid();
    const GemmParams& p = params.tma.gemm;
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const Scheduler tile(p.m, p.n, p.k, p.k_splits);
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int count = tile.k_tile_end - tile.k_tile_begin;  // may be 0: a slice past K adds zeros
    const int k_bytes = p.group_size;
    const int k_first = tile.k_tile_begin * kBlockK;
    const i64 scale_row_bytes = static_cast<i64>(p.k / kBlockK) * kScaleBytes;
    const u32 smem_base = memory::shared_address(smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

    const ATile a_tile(static_cast<const char*>(p.a) + static_cast<i64>(m0) * p.lda, p.lda, p.m - m0, k_bytes);
    const WTile w_tile(static_cast<const char*>(p.w) + static_cast<i64>(n0) * k_bytes, k_bytes, p.n - n0, k_bytes);
    const AScales a_scales(reinterpret_cast<const char*>(params.a_scale) + m0 * scale_row_bytes, scale_row_bytes,
                           p.m - m0);
    const WScales w_scales(static_cast<const char*>(p.w_scale) + n0 * scale_row_bytes, scale_row_bytes, p.n - n0);
    auto load = [&](int slot, int k_tile) {
      const u32 stage = smem_base + static_cast<u32>(slot * kStageBytes);
      a_tile.load(stage, k_first + k_tile * kBlockK);
      w_tile.load(stage + ATile::kBytes, k_first + k_tile * kBlockK);
      a_scales.load(stage + kAScalesAt, tile.k_tile_begin + k_tile);
      w_scales.load(stage + kWScalesAt, tile.k_tile_begin + k_tile);
    };

    float sums[kMTiles][kNTiles][4];
    float acc[kMTiles][kNTiles][4];  // the fp32 accumulators the K tiles' sums go into
    zero(sums);
    zero(acc);

    Ring::run(smem_base, count, load, [&](int it) {
      multiply(Ring::stage(smem_base, it), warp_m, warp_n, lane, sums);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[mi][ni][c] += sums[mi][ni][c];
            sums[mi][ni][c] = 0.f;
          }
    });

    const int row0 = m0 + warp_m * kWarpRows, col0 = n0 + warp_n * kWarpCols;
    if (p.w_zero_point != nullptr) {  // the activations' global scale (the writer applies the weight's)
      const float a_global = *static_cast<const float*>(p.w_zero_point);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mi][ni][c] *= a_global;
    }
    Writer::write(p, acc, row0, col0, tile.tile_index, &arrival_flag);
  }

 private:
  static __device__ __forceinline__ void zero(float (&v)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) v[mi][ni][c] = 0.f;
  }

  // The warp's products of one K tile (four k64 steps) at `stage` into its sums. A lane's scale
  // words: for m16 fragments 2p and 2p + 1, the row its quad place names (t / 2 the fragment,
  // t % 2 the row half: rows g and g + 8); for n8 fragments 4q .. 4q + 3, column g of fragment
  // 4q + t. A fragment past the warp's (an odd count) reads its pair's first, which no selector
  // picks.
  static __device__ __forceinline__ void multiply(u32 stage, int warp_m, int warp_n, int lane,
                                                  float (&sums)[kMTiles][kNTiles][4]) {
    constexpr int kAWords = (kMTiles + 1) / 2, kWWords = (kNTiles + 3) / 4;
    const u32 w_stage = stage + ATile::kBytes;
    const int g = lane >> 2, t = lane & 3;
    int a_rows[kAWords], w_rows[kWWords];
#pragma unroll
    for (int pair = 0; pair < kAWords; ++pair) {
      const int fragment = 2 * pair + (t >> 1) < kMTiles ? 2 * pair + (t >> 1) : 2 * pair;
      a_rows[pair] = warp_m * kWarpRows + 16 * fragment + g + 8 * (t & 1);
    }
#pragma unroll
    for (int quad = 0; quad < kWWords; ++quad) {
      const int fragment = 4 * quad + t < kNTiles ? 4 * quad + t : 4 * quad;
      w_rows[quad] = warp_n * kWarpCols + 8 * fragment + g;
    }
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      u32 a[kMTiles][4];
      u32 b[kNTiles][2];
      u32 sfa[kAWords], sfw[kWWords];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) ATile::a_fragment(stage, warp_m * kWarpRows + 16 * mi, step, lane, a[mi]);
      WTile::template b_fragments<kNTiles / 2>(w_stage, warp_n * kWarpCols, step, lane, b);
#pragma unroll
      for (int pair = 0; pair < kAWords; ++pair)
        sfa[pair] = AScales::word(stage + kAScalesAt, a_rows[pair], Codes::word_byte(step));
#pragma unroll
      for (int quad = 0; quad < kWWords; ++quad)
        sfw[quad] = WScales::word(stage + kWScalesAt, w_rows[quad], Codes::word_byte(step));
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
          Codes::mma(sums[mi][ni], a[mi], b[ni], sfa[mi >> 1], sfw[ni >> 2], Codes::byte_id(step), mi & 1,
                     Codes::byte_id(step), ni & 3);
    }
  }
};

}  // namespace humming_aot::kernel
