#pragma once
// The portable dense mixed-input GEMM body: out[m, n] = a[m, k] @ dequant(w)[n, k]^T (+ bias),
// 16-bit activations, integer weight codes with per-group scales (and zero points), fp32
// accumulation on mma.sync m16n8k16. SM80+. M, N, K and the group size are run-time values:
// N % 64 == 0, K % 64 == 0, group a multiple of 16 that divides 64 or is a multiple of 64.
//
// One CTA computes a kBlockM x kBlockN output tile over a slice of K. kWarpsM x kWarpsN warps;
// each warp owns kBlockM / kWarpsM rows and one packed 64-column unit. A kStages-deep cp.async
// pipeline stages 64-wide K tiles of activations (swizzled rows), packed weights, scales and zero
// points; each warp dequantizes its weights in registers right before the mma.

#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/mma/mma_sync.cuh>
#include <humming_aot/numerics/int_dequantizer.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

template <class Act,                       // Float16 or BFloat16: activation, scale and output dtype
          int kBits,                       // weight code bits: 4 or 8
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,                     // output rows per CTA
          int kBlockN,                     // output columns per CTA (64 per warp along N)
          int kWarpsM, int kWarpsN,        // warp grid of the CTA
          int kStages>                     // cp.async pipeline depth
struct DenseMmaSync {
  static constexpr int kBlockK = 64;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kWarpRows = kBlockM / kWarpsM;
  static constexpr int kMTiles = kWarpRows / 16;      // m16 fragments per warp
  static constexpr int kNTiles = 8;                   // n8 fragments per warp (one 64-column unit)
  static constexpr int kUnits = kBlockN / 64;         // packed 64-column units per CTA
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr int kScaleRows = 4;                // scale rows staged per K tile (group >= 16)
  static constexpr bool kHasZeroPoint = kZeroPoint == numerics::ZeroPointKind::kInteger;
  static constexpr int kWordsPerLane = kBits;         // per (16-row K step, unit): 4 tiles x kBits / 4

  static_assert(kBlockM % (16 * kWarpsM) == 0, "each warp needs whole m16 fragments");
  static_assert(kBlockN == 64 * kWarpsN, "one packed 64-column unit per warp along N");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kThreads <= 1024, "too many warps");

  // Shared memory of one pipeline stage, in bytes; every part is a multiple of 16.
  static constexpr int kABytes = kBlockM * kBlockK * 2;               // (kBlockM, 64) swizzled rows
  static constexpr int kWBytes = kBlockN * kBlockK * kBits / 8;       // (4, kUnits, 32 lanes, kBits words)
  static constexpr int kSBytes = kScaleRows * kBlockN * 2;            // (4, kBlockN) permuted scales
  static constexpr int kZBytes = kHasZeroPoint ? kSBytes : 0;         // zero points, like scales
  static constexpr int kStageBytes = kABytes + kWBytes + kSBytes + kZBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;

  using H2 = numerics::PackedHalf2<Act>;
  using Dequantizer = numerics::IntDequantizer<Act, kBits, kZeroPoint>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Writer = epilogue::OutputWriter<Act, kMTiles, kNTiles>;

  // Where the scale rows of one K tile start, and how the 16-row K steps map onto them.
  struct GroupWalk {
    int group_size;
    int step_shift;  // scale row of step kk = kk >> step_shift (group >= 64: always row 0)
    __device__ __forceinline__ explicit GroupWalk(int group) : group_size(group) {
      step_shift = group >= 64 ? 2 : (group == 32 ? 1 : 0);
    }
    __device__ __forceinline__ int first_row(int k_tile) const { return k_tile * kBlockK / group_size; }
    __device__ __forceinline__ int rows() const { return group_size >= 64 ? 1 : kBlockK / group_size; }
  };

  // Issue the cp.async copies of K tile `k_tile` into stage buffer `stage`.
  static __device__ __forceinline__ void load_stage(const GemmParams& p, char* stage, int k_tile, int m0, int n0,
                                                    const GroupWalk& walk) {
    const int tid = threadIdx.x;
    const u32 a_smem = memory::shared_address(stage);
    const u32 w_smem = a_smem + kABytes;
    const u32 s_smem = w_smem + kWBytes;
    const u32 z_smem = s_smem + kSBytes;
    // activations: 8 chunks of 16 bytes per row; chunk c of row r lives at r * 8 + (c ^ (r & 7))
    const char* a = static_cast<const char*>(p.a);
#pragma unroll
    for (int i = tid; i < kBlockM * 8; i += kThreads) {
      const int row = i >> 3, chunk = i & 7;
      const int grow = m0 + row;
      const bool valid = grow < p.m;
      const char* src = valid ? a + 2 * (grow * p.lda + k_tile * kBlockK + chunk * 8) : a;
      memory::cp_async_16(a_smem + 16 * (row * 8 + (chunk ^ (row & 7))), src, valid);
    }
    // packed weights: per 16-row K step, kUnits consecutive units of 32 lanes x kBits words
    constexpr int kChunksPerStep = kUnits * 8 * kBits;
    const int units_total = p.n / 64;
    const i64 row_words = static_cast<i64>(units_total) * 32 * kBits;
    const u32* w = static_cast<const u32*>(p.w) + (n0 / 64) * 32 * kBits;
#pragma unroll
    for (int i = tid; i < kK16Steps * kChunksPerStep; i += kThreads) {
      const int kk = i / kChunksPerStep, rem = i % kChunksPerStep;
      const bool valid = n0 / 64 + rem / (8 * kBits) < units_total;
      const u32* src = valid ? w + (k_tile * kK16Steps + kk) * row_words + rem * 4 : w;
      memory::cp_async_16(w_smem + 16 * i, src, valid);
    }
    // scale (and zero-point) rows covering this K tile
    const int row0 = walk.first_row(k_tile);
    const int rows = walk.rows();
    constexpr int kChunksPerRow = kBlockN / 8;
    for (int i = tid; i < rows * kChunksPerRow; i += kThreads) {
      const int r = i / kChunksPerRow, c = i % kChunksPerRow;
      const int col = n0 + c * 8;
      const bool valid = col < p.n;
      const i64 offset = valid ? (static_cast<i64>(row0 + r) * p.n + col) * 2 : 0;
      memory::cp_async_16(s_smem + 2 * (r * kBlockN + c * 8), static_cast<const char*>(p.w_scale) + offset, valid);
      if constexpr (kHasZeroPoint) {
        memory::cp_async_16(z_smem + 2 * (r * kBlockN + c * 8), static_cast<const char*>(p.w_zero_point) + offset,
                            valid);
      }
    }
  }

  // Multiply one staged K tile into the warp's accumulators.
  static __device__ __forceinline__ void compute_stage(const char* stage, int warp_m, int warp_n,
                                                       const GroupWalk& walk, float (&acc)[kMTiles][kNTiles][4]) {
    const int lane = threadIdx.x & 31;
    const u32 a_smem = memory::shared_address(stage);
    const u32 w_smem = a_smem + kABytes;
    const u32 s_smem = w_smem + kWBytes;
    const u32 z_smem = s_smem + kSBytes;
#pragma unroll
    for (int kk = 0; kk < kK16Steps; ++kk) {
      u32 a_frag[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        const int row = warp_m * kWarpRows + mi * 16 + (lane & 15);
        const int chunk = 2 * kk + (lane >> 4);
        memory::ldmatrix_x4(a_frag[mi], a_smem + 16 * (row * 8 + (chunk ^ (row & 7))));
      }
      u32 words[kWordsPerLane];
#pragma unroll
      for (int v = 0; v < kWordsPerLane / 4; ++v) {
        u32 vec[4];
        memory::lds_128(vec, w_smem + 16 * (((kk * kUnits + warp_n) * 32 + lane) * (kWordsPerLane / 4) + v));
#pragma unroll
        for (int e = 0; e < 4; ++e) words[4 * v + e] = vec[e];
      }
      // this lane's 8 columns of the unit: pair j = (n = 16 j + g, n = 16 j + 8 + g)
      const int scale_row = kk >> walk.step_shift;
      const u32 scale_offset = 2 * (scale_row * kBlockN + warp_n * 64 + (lane >> 2) * 8);
      u32 scales[4], zeros[4] = {0, 0, 0, 0};
      memory::lds_128(scales, s_smem + scale_offset);
      if constexpr (kHasZeroPoint) memory::lds_128(zeros, z_smem + scale_offset);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 tile_words[Dequantizer::kWordsPerTile];
#pragma unroll
        for (int e = 0; e < Dequantizer::kWordsPerTile; ++e) tile_words[e] = words[j * Dequantizer::kWordsPerTile + e];
        u32 b_frag[2][2];
        Dequantizer::dequantize(tile_words, scales[j], zeros[j], b_frag);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) mma::mma_m16n8k16<Act>(acc[mi][2 * j + h], a_frag[mi], b_frag[h]);
        }
      }
    }
  }

  static __device__ __forceinline__ void run(const GemmParams& p) {
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const Scheduler tile(p.m, p.n, p.k, p.k_splits);
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int warp = threadIdx.x >> 5;
    const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
    const GroupWalk walk(p.group_size);

    float acc[kMTiles][kNTiles][4];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    const int count = tile.k_tile_end - tile.k_tile_begin;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) load_stage(p, smem + s * kStageBytes, tile.k_tile_begin + s, m0, n0, walk);
      memory::cp_async_commit();
    }
    int compute_slot = 0, load_slot = kStages - 1;
    for (int it = 0; it < count; ++it) {
      memory::cp_async_wait<kStages - 2>();
      __syncthreads();  // stage `it` landed for every thread; stage `it - 1` is free to refill
      if (it + kStages - 1 < count) {
        load_stage(p, smem + load_slot * kStageBytes, tile.k_tile_begin + it + kStages - 1, m0, n0, walk);
      }
      memory::cp_async_commit();
      compute_stage(smem + compute_slot * kStageBytes, warp_m, warp_n, walk, acc);
      compute_slot = compute_slot + 1 == kStages ? 0 : compute_slot + 1;
      load_slot = load_slot + 1 == kStages ? 0 : load_slot + 1;
    }
    memory::cp_async_wait<0>();

    Writer::write(p, acc, m0 + warp_m * kWarpRows, n0 + warp_n * 64, tile.tile_index, &arrival_flag);
  }
};

}  // namespace humming_aot::kernel
