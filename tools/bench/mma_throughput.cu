// Tensor-pipe throughput at the swapped tile's shape (M <= 8 tokens): mma.sync m16n8k16 against the
// Hopper wgmma m64n8k16 with A from registers, alone and with the 1-bit decode's lop3 feeding A.
// docs/performance/log.md section 17 found the M <= 8 kernels bound by their mma.sync; this says
// whether wgmma would do the same work in fewer cycles. The library's wgmma helpers (descriptor,
// fences, group waits) and one N = 8 instruction of its own; on the GPU, from the repository root:
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I csrc/include -o /tmp/mma_throughput tools/bench/mma_throughput.cu && /tmp/mma_throughput
//
// Every mode runs 2 CTAs of 8 warps per SM (the swapped tile's occupancy), one wave, and reports
// dense FMA per SM per cycle (clock64 of each CTA, median over CTAs) and cycles per 8192 weights
// (one warp-stage of the int1 tile: 32 m16n8k16 or 8 m64n8k16 per warp's share).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <humming_aot/mma/wgmma.cuh>

namespace {

constexpr int kThreads = 256;
constexpr int kCtasPerSm = 2;
constexpr int kIters = 4096;

// kMmaSyncStep / kWgmmaStep: a K step as the 1-bit kernel would run it - decode, the 4 weight
// mma plus the offset mma of the constant fragment; wgmma pipelined one step deep (the A
// registers of step i + 1 are decoded while step i's group runs, then wait_group 1).
// kDecodeOnly: the step's decode without any mma (the ALU pipe's rate); kMmaSyncStepMulHi: the
// mma.sync step with its three right shifts done as mul.hi by an opaque power of two (FMA pipe).
enum Mode : int {
  kMmaSync = 0, kMmaSyncDecode = 1, kWgmma = 2, kWgmmaDecode = 3, kMmaSyncStep = 4, kWgmmaStep = 5,
  kDecodeOnly = 6, kMmaSyncStepMulHi = 7
};

__device__ __forceinline__ unsigned lop3_decode(unsigned word, unsigned mask, unsigned magic) {
  unsigned x;
  asm volatile("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(x) : "r"(word), "r"(mask), "r"(magic));
  return x;
}

__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], const unsigned (&a)[4], uint64_t desc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

using humming_aot::mma::k_major_sw128_descriptor;  // K-major, 128-byte swizzle: one 8-row group is N = 8
using humming_aot::mma::wgmma_commit_group;
using humming_aot::mma::wgmma_fence;
using humming_aot::mma::wgmma_wait_group;

// Each warp does, per iteration, what one 16-wide K step of the int1 swapped tile does for 64
// weight channels: 4 weight tiles of 16 x 16 (16 registers of A), times 8 tokens. With kDecode,
// the 16 A registers come from one lop3 each on a loop-carried word (as the 1-bit decode does).
template <int kMode>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) run(float* out, long long* cycles, unsigned seed) {
  __shared__ __align__(1024) unsigned short act[8 * 64 * 8];  // 8 K steps of 8 tokens x 64 bf16 rows
  for (int i = threadIdx.x; i < 8 * 64 * 8; i += kThreads) act[i] = static_cast<unsigned short>(0x3F80 ^ (i & 7));
  __syncthreads();
  humming_aot::mma::fence_shared_for_async_proxy();
  __syncthreads();
  const unsigned lane = threadIdx.x & 31;
  unsigned word = seed ^ (lane * 0x9E3779B9u);
  const unsigned b[2] = {0x3F803F80u ^ lane, 0x3F803F80u ^ (lane << 1)};
  float d[4][4] = {};
  const unsigned act_base = static_cast<unsigned>(__cvta_generic_to_shared(act));
  const long long start = clock64();
  if constexpr (kMode == kMmaSyncStep || kMode == kMmaSyncStepMulHi || kMode == kDecodeOnly) {
    const unsigned offset_frag[4] = {0x43014301u, 0x42814281u, 0x42014201u, 0x41814181u};
    float offset[4] = {};
    unsigned scale[4];  // 2^28, 2^24, 2^20 where ptxas cannot see them (mul.hi stays a multiply)
#pragma unroll
    for (int j = 1; j < 4; ++j) asm volatile("mov.b32 %0, %1;" : "=r"(scale[j]) : "r"(1u << (32 - 4 * j)));
    for (int it = 0; it < kIters; ++it) {
      unsigned a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned shifted = word >> (4 * j);
        if constexpr (kMode == kMmaSyncStepMulHi) {
          if (j > 0) shifted = __umulhi(word, scale[j]);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) a[j][r] = lop3_decode(shifted, 0x00010001u << r, 0x43004300u);
      }
      word = word * 1664525u + 1013904223u;
      if constexpr (kMode == kDecodeOnly) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) offset[r] += __uint_as_float(a[j][r]);  // FMA pipe: only the decode is on the ALU
      } else {
        mma_m16n8k16(offset, offset_frag, b);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_m16n8k16(d[j], a[j], b);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) d[0][e] += offset[e];
  } else if constexpr (kMode == kWgmmaStep) {
    const unsigned offset_frag[4] = {0x43014301u, 0x42814281u, 0x42014201u, 0x41814181u};
    float offset[4] = {};
    unsigned a[2][4][4];
    for (int it = 0; it < kIters; ++it) {
      unsigned (&cur)[4][4] = a[it & 1];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) cur[j][r] = lop3_decode(word >> (4 * j), 0x00010001u << r, 0x43004300u);
      word = word * 1664525u + 1013904223u;
      wgmma_fence();
      const unsigned step = act_base + 1024 * (it & 7);
      wgmma_m64n8k16(offset, offset_frag, k_major_sw128_descriptor(step));
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64n8k16(d[j], cur[j], k_major_sw128_descriptor(step + 32 * (j & 1)));
      wgmma_commit_group();
      wgmma_wait_group<1>();  // the group before this one is done: its A registers may be rewritten
    }
    wgmma_wait_group<0>();
#pragma unroll
    for (int e = 0; e < 4; ++e) d[0][e] += offset[e];
  } else if constexpr (kMode == kMmaSync || kMode == kMmaSyncDecode) {
    unsigned a[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[j][r] = 0x3F803F80u ^ (j * 4 + r);
    for (int it = 0; it < kIters; ++it) {
      if constexpr (kMode == kMmaSyncDecode) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) a[j][r] = lop3_decode(word >> (4 * j), 0x00010001u << r, 0x43004300u);
        word = word * 1664525u + 1013904223u;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_m16n8k16(d[j], a[j], b);
    }
  } else {
    // wgmma reads its A registers asynchronously: a group of kGroupSteps K steps gets registers of
    // its own (decoded before the group is issued), and the group is waited for before they are
    // rewritten. The warpgroup's 4 warps hold 4 x 16 rows of each m64 tile, so the 4 wgmma of a K
    // step cover the same 64 channels x 16 K x 8 tokens per warp as the 4 mma.sync above.
    constexpr int kGroupSteps = 4;
    unsigned a[kGroupSteps][4][4];
#pragma unroll
    for (int s = 0; s < kGroupSteps; ++s)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[s][j][r] = 0x3F803F80u ^ (s * 16 + j * 4 + r);
    for (int it = 0; it < kIters / kGroupSteps; ++it) {
      if constexpr (kMode == kWgmmaDecode) {
#pragma unroll
        for (int s = 0; s < kGroupSteps; ++s) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) a[s][j][r] = lop3_decode(word >> (4 * j), 0x00010001u << r, 0x43004300u);
          word = word * 1664525u + 1013904223u;
        }
      }
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kGroupSteps; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_m64n8k16(d[j], a[s][j], k_major_sw128_descriptor(act_base + 1024 * ((it * kGroupSteps + s) & 7) + 32 * (j & 1)));
      wgmma_commit_group();
      wgmma_wait_group<0>();
    }
  }
  const long long stop = clock64();
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += d[j][e];
  out[blockIdx.x * kThreads + threadIdx.x] = sum;
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <int kMode>
void measure(const char* name, int sms) {
  const int ctas = sms * kCtasPerSm;
  float* out = nullptr;
  long long* cycles = nullptr;
  cudaMalloc(&out, sizeof(float) * ctas * kThreads);
  cudaMalloc(&cycles, sizeof(long long) * ctas);
  run<kMode><<<ctas, kThreads>>>(out, cycles, 1u);  // warm-up
  run<kMode><<<ctas, kThreads>>>(out, cycles, 2u);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("%-34s failed: %s\n", name, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  std::vector<long long> c(ctas);
  cudaMemcpy(c.data(), cycles, sizeof(long long) * ctas, cudaMemcpyDeviceToHost);
  std::sort(c.begin(), c.end());
  const double median = static_cast<double>(c[ctas / 2]);
  // per SM: kCtasPerSm CTAs x 8 warps x kIters x (64 channels x 16 K x 8 tokens) FMA
  const double fma_per_sm = static_cast<double>(kCtasPerSm) * (kThreads / 32) * kIters * 64.0 * 16 * 8;
  const double per_cycle = fma_per_sm / median;
  // one warp-stage of the int1 tile: 8192 weights x 8 tokens = 65536 FMA (the kernel measured ~150
  // SM cycles per warp-stage, docs/performance/log.md section 17)
  std::printf("%-34s %8.0f FMA / SM / cycle   %6.1f SM cycles per int1 warp-stage\n", name, per_cycle,
              65536.0 / per_cycle);
  cudaFree(out);
  cudaFree(cycles);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, %d SMs; m16n8k16 / m64n8k16, bf16 in, fp32 accumulate, 8 tokens\n", prop.name,
              prop.multiProcessorCount);
  measure<kMmaSync>("mma.sync m16n8k16", prop.multiProcessorCount);
  measure<kMmaSyncDecode>("mma.sync m16n8k16 + lop3 decode", prop.multiProcessorCount);
  if (prop.major >= 9) {
    measure<kWgmma>("wgmma m64n8k16 (A in registers)", prop.multiProcessorCount);
    measure<kWgmmaDecode>("wgmma m64n8k16 + lop3 decode", prop.multiProcessorCount);
  }
  // a K step as the int1 kernel runs it: the FMA counted are the 4 weight mma's (not the offset)
  measure<kMmaSyncStep>("int1 K step on mma.sync (4 + offset)", prop.multiProcessorCount);
  if (prop.major >= 9) measure<kWgmmaStep>("int1 K step on wgmma (4 + offset)", prop.multiProcessorCount);
  measure<kMmaSyncStepMulHi>("int1 K step, shifts by mul.hi", prop.multiProcessorCount);
  measure<kDecodeOnly>("int1 K step's decode alone (no mma)", prop.multiProcessorCount);
  return 0;
}
