#pragma once
// Warp-level m16n8k16 tensor-core MMA with fp32 accumulation, f16 or bf16 operands (SM80+).
// Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type".
// A: a[0] (row g, k 2t..2t+1), a[1] (row g+8), a[2] (row g, k 2t+8..), a[3] (row g+8, k 2t+8..);
// B: b[0] (k 2t..2t+1, col g), b[1] (k 2t+8..2t+9, col g); C: c[0..1] (row g, cols 2t, 2t+1),
// c[2..3] (row g+8), with g = lane / 4, t = lane % 4.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::mma {

// Not volatile: a pure register operation, so the compiler may schedule shared-memory loads of the
// next K step (volatile asm) around it. SM75 has m16n8k8 for f16 only: there the k16 product is
// two k8 products (a[0..1] with b[0], then a[2..3] with b[1]), and bf16 does not compile.
template <class Act>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  static_assert(!Act::kIsBFloat16, "bf16 mma needs SM80; SM75 kernels take float16 activations");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2 * half]), "r"(a[2 * half + 1]), "r"(b[half]));
  }
  return;
#endif
  if constexpr (Act::kIsBFloat16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Zero an array of m16n8 fp32 accumulator fragments (kMTiles x kNTiles x 4 per thread).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_accumulators(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
}

}  // namespace humming_aot::mma
