#pragma once
// A naive reference body (tile kind "simt", test-only: no catalog serves it): one warp per CTA
// computes kBlockM tokens x 64 weight channels with fp32 FMAs on the CUDA cores. It shares only
// the weight decoding with the production bodies (numerics/: the packed words unfolded and
// dequantized with their scale, and zero point, into the activation dtype, exactly the values the
// tensor-core bodies feed their mma) and reads everything else straight from global memory: no
// shared memory, pipeline, tensor cores, split-K or scheduler. The GPU suite compares the
// production kernels with it; it is also the worked example of docs/adding-a-body.md. Any arch
// the numerics compile for (sm_75+; bfloat16 from sm_80).
//
// Lane l (g = l / 4, t = l % 4) decodes, per 16-row K step, the B fragments of the unit's four
// 16-column tiles j (columns 16 j + 8 h + g, rows 2 t + p + 8 q; humming_aot/packed_layout.py)
// and multiplies them with those rows of every token's activations; the four lanes t of a column
// sum their partials with shuffles at the end. Scale groups of at least 16 (one scale row per K
// step), N % 64 == 0, K % 16 == 0.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/numerics/packed_codes.cuh>
#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/numerics/weight_codes.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::kernel {

template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM>  // tokens per CTA
struct DenseSimt {
  static constexpr int kBits = Weights::kBits;
  static constexpr int kThreads = 32;
  static constexpr int kSmemBytes = 0;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr bool kScalesInFp32 = false;  // the weights are rounded with their scales, as the mma bodies do
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;
  using Dequantizer = typename Weights::template Dequantizer<Act, kZeroPoint>;
  using Codes = numerics::PackedCodes<kBits>;
  using H2 = numerics::PackedHalf2<Act>;

  static_assert(kBlockM >= 1 && kBlockM <= 16, "a warp's registers hold kBlockM x 8 accumulators per lane");

  // The 8 scale (or zero-point) values of this lane's columns in row `row`: pair j holds tile j's
  // columns h = 0, 1 (the per-unit column order g * 8 + 2 j + h of humming_aot/packing.py).
  static __device__ __forceinline__ void load_pairs(const void* base, int n, int row, int column0, u32 (&pairs)[4]) {
    const uint4 v =
        *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(base) + static_cast<i64>(row) * n + column0);
    pairs[0] = v.x;
    pairs[1] = v.y;
    pairs[2] = v.z;
    pairs[3] = v.w;
  }

  static __device__ __forceinline__ void run(const GemmParams& p) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int units = p.n / 64;
    const int unit = static_cast<int>(blockIdx.x) % units;
    const int m0 = static_cast<int>(blockIdx.x) / units * kBlockM;
    // Activations, weights and the output may belong to the previous kernel in the stream (PDL).
    schedule::wait_for_upstream_grid();

    float acc[kBlockM][4][2];
#pragma unroll
    for (int m = 0; m < kBlockM; ++m) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[m][j][0] = acc[m][j][1] = 0.f;
    }
    const i64 step_words = static_cast<i64>(p.n) * kBits / 2;  // packed words per 16-row K step
    const u32* w = static_cast<const u32*>(p.w) + (static_cast<i64>(unit) * 32 + lane) * kBits;
    const char* a = static_cast<const char*>(p.a);
    for (int k0 = 0; k0 < p.k; k0 += 16, w += step_words) {
      u32 words[kBits];
#pragma unroll
      for (int i = 0; i < kBits; ++i) words[i] = w[i];
      u32 padded[Codes::kPaddedWords];
      Codes::unfold(words, padded);
      u32 scale[4], zero[4] = {0u, 0u, 0u, 0u};
      const int row = k0 / p.group_size;
      load_pairs(p.w_scale, p.n, row, unit * 64 + g * 8, scale);
      if constexpr (kHasZeroPoint) load_pairs(p.w_zero_point, p.n, row, unit * 64 + g * 8, zero);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 tile_words[Dequantizer::kWordsPerTile];
        numerics::copy_tile_words(padded, j, tile_words);
        u32 frag[2][2];
        Dequantizer::apply(tile_words, Dequantizer::prepare(scale[j], zero[j]), frag);
        float weight[2][4];  // [h][rows 2t, 2t + 1, 2t + 8, 2t + 9]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          H2::to_floats(frag[h][0], weight[h][0], weight[h][1]);
          H2::to_floats(frag[h][1], weight[h][2], weight[h][3]);
        }
#pragma unroll
        for (int m = 0; m < kBlockM; ++m) {
          if (m0 + m >= p.m) break;
          const char* row_a = a + 2 * (static_cast<i64>(m0 + m) * p.lda + k0 + 2 * t);
          float x[4];
          H2::to_floats(*reinterpret_cast<const u32*>(row_a), x[0], x[1]);
          H2::to_floats(*reinterpret_cast<const u32*>(row_a + 16), x[2], x[3]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[m][j][h] = fmaf(x[r], weight[h][r], acc[m][j][h]);
          }
        }
      }
    }
    // the four lanes t of each column hold partial sums over their rows of every K step
#pragma unroll
    for (int m = 0; m < kBlockM; ++m) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          acc[m][j][h] += __shfl_xor_sync(0xFFFFFFFFu, acc[m][j][h], 1);
          acc[m][j][h] += __shfl_xor_sync(0xFFFFFFFFu, acc[m][j][h], 2);
        }
      }
    }
    schedule::release_dependent_grid();
    if (t != 0) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int column = unit * 64 + 16 * j + 8 * h + g;
        float bias = 0.f;
        if (p.bias != nullptr) {
          float unused;
          H2::to_floats(static_cast<u32>(static_cast<const unsigned short*>(p.bias)[column]), bias, unused);
        }
#pragma unroll
        for (int m = 0; m < kBlockM; ++m) {
          if (m0 + m >= p.m) break;
          const u32 rounded = H2::from_floats(acc[m][j][h] * p.global_scale + bias, 0.f) & 0xFFFFu;
          static_cast<unsigned short*>(p.out)[static_cast<i64>(m0 + m) * p.ldo + column] =
              static_cast<unsigned short>(rounded);
        }
      }
    }
  }
};

}  // namespace humming_aot::kernel
