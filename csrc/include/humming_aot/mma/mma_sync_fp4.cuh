#pragma once
// Block-scaled warp mma on e2m1 codes: mma.sync m16n8k64 .kind::mxf4nvf4 .block_scale (SM120a /
// SM121a, SASS OMMA.SF.16864), the operand traits of the block-scaled FP4 body
// (kernel/dense_mma_fp4.cuh). Two recipes, one trait each:
// - NVFP4: a ue4m3 scale per 16 of K on both operands, .scale_vec::4X (four scales a k64 step);
// - MXFP4: a ue8m0 scale per 32 of K, .scale_vec::2X (two a step).
// The code fragments are those of the s4 m16n8k64 (mma/mma_sync_8bit.cuh S4SyncCodes): in bytes,
// m16n8k32 s8's, eight codes a register with the lower K in the lower nibble.
//
// Scale fragments (PTX ISA, "Block Scaling for mma.sync"; CUTLASS's SM120 block-scaled traits
// give the same map), g = lane / 4, t = lane % 4: a 32-bit scale word holds a row's (or
// column's) scales of one step in consecutive bytes from byte_id on (4X: bytes 0-3, 2X: byte_id
// 0 or 2, so one word serves two steps). SF_A of row g comes from lane 4 g + 2 thread_id_a, of row
// g + 8 from lane 4 g + 2 thread_id_a + 1 (thread_id_a 0 or 1: two m16 fragments share the
// quad's words); SF_B of column g from lane 4 g + thread_id_b (0..3: four n8 fragments share them).
//
// Below SM120 (no such instruction) `mma` is emulated with warp shuffles and fp32 FMAs in the same
// register contract: the sm90 build of the body runs on an H200 in the GPU tests, which checks
// everything around the instruction (staging, fragments, scale words, selectors, epilogue). Slow;
// support.toml serves the body on sm120a and sm121a only.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::mma {

template <int kScaleVec>  // scales per k64 step: 4 (NVFP4, ue4m3 per 16 of K) or 2 (MXFP4, ue8m0 per 32)
struct Fp4BlockScaledSync {
  static_assert(kScaleVec == 4 || kScaleVec == 2, "NVFP4 (4X) or MXFP4 (2X)");
  static constexpr int kGroup = 64 / kScaleVec;  // K per scale: 16 or 32
  // scale bytes of a row per K tile of 128 code bytes (256 codes): 16 or 8
  static constexpr int kTileScaleBytes = 256 / kGroup;
  using Sum = float;
  static constexpr bool kExactSums = false;

  // The byte (0..3) of a row's staged scales of K tile step `step` (0..3, 64 codes each) where
  // its 32-bit scale word starts, and the byte_id that selects the step's scales in that word.
  static __device__ __forceinline__ int word_byte(int step) { return kScaleVec == 4 ? 4 * step : 4 * (step >> 1); }
  static __device__ __forceinline__ int byte_id(int step) { return kScaleVec == 4 ? 0 : 2 * (step & 1); }

  // c += (A x SF_A) (B x SF_B): a, b the e2m1 fragments, sfa / sfb this lane's scale words.
  static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2], u32 sfa, u32 sfb,
                                             int byte_a, int thread_a, int byte_b, int thread_b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
    using u16 = unsigned short;
    const u16 ba = static_cast<u16>(byte_a), ta = static_cast<u16>(thread_a);
    const u16 bb = static_cast<u16>(byte_b), tb = static_cast<u16>(thread_b);
    if constexpr (kScaleVec == 4) {
      asm("mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue4m3 "
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, {%10}, {%11, %12}, {%13}, {%14, %15};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "h"(ba), "h"(ta), "r"(sfb),
            "h"(bb), "h"(tb));
    } else {
      asm("mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::2X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue8m0 "
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, {%10}, {%11, %12}, {%13}, {%14, %15};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "h"(ba), "h"(ta), "r"(sfb),
            "h"(bb), "h"(tb));
    }
#else
    emulate(c, a, b, sfa, sfb, byte_a, thread_a, byte_b, thread_b);
#endif
  }

  // The value of an e2m1 code (the low nibble of `code`).
  static __device__ __forceinline__ float e2m1(u32 code) {
    const u32 m = code & 7u;
    const float magnitude =
        m < 4u ? 0.5f * static_cast<float>(m) : static_cast<float>(2u + (m & 1u)) * (m < 6u ? 1.f : 2.f);
    return (code & 8u) ? -magnitude : magnitude;
  }

  // The value of a scale byte: ue4m3 (NVFP4) or ue8m0 (MXFP4).
  static __device__ __forceinline__ float scale(u32 byte) {
    if constexpr (kScaleVec == 4) {
      const u32 e = (byte >> 3) & 15u, m = byte & 7u;
      return e == 0 ? static_cast<float>(m) * 0x1p-9f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    } else {
      return byte == 0 ? 0x1p-127f : __uint_as_float(byte << 23);
    }
  }

 private:
  // The instruction's arithmetic from its operands' fragments (test builds below SM120): each lane
  // gathers its two rows and two columns of codes and their scale words from the lanes that hold
  // them, then adds the products in K order in fp32.
  static __device__ __noinline__ void emulate(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2], u32 sfa, u32 sfb,
                                              int byte_a, int thread_a, int byte_b, int thread_b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    u32 row_scales[2], col_scales[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) row_scales[half] = __shfl_sync(~0u, sfa, 4 * g + 2 * thread_a + half);
#pragma unroll
    for (int j = 0; j < 2; ++j) col_scales[j] = __shfl_sync(~0u, sfb, 4 * (2 * t + j) + thread_b);
    float sums[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {  // K 0-31, 32-63
      for (int q = 0; q < 4; ++q) {   // the quad lane holding K 8q..8q+7 of the half
        u32 rows[2], cols[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) rows[half] = __shfl_sync(~0u, a[half + 2 * kh], 4 * g + q);
#pragma unroll
        for (int j = 0; j < 2; ++j) cols[j] = __shfl_sync(~0u, b[kh], 4 * (2 * t + j) + q);
        for (int e = 0; e < 8; ++e) {
          const int k = 32 * kh + 8 * q + e, chunk = k / kGroup;
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float sa = scale((row_scales[half] >> (8 * (byte_a + chunk))) & 0xFFu);
              const float sb = scale((col_scales[j] >> (8 * (byte_b + chunk))) & 0xFFu);
              sums[2 * half + j] += e2m1(rows[half] >> (4 * e)) * sa * (e2m1(cols[j] >> (4 * e)) * sb);
            }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += sums[i];
  }
};

}  // namespace humming_aot::mma
