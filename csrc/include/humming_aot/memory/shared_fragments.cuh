#pragma once
// Shared -> register loads for the mma.sync body: ldmatrix for activation fragments and 16-byte
// vector loads for packed weights and scales (and single floats for the wgmma bodies' staged
// scales). SM75+ (ldmatrix).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::memory {

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(u32 (&frag)[4], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(smem_addr));
}

// Two 8x8 b16 matrices; lanes 0-15 supply the row addresses (lane l: matrix l / 8).
__device__ __forceinline__ void ldmatrix_x2(u32 (&frag)[2], u32 smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(frag[0]), "=r"(frag[1])
               : "r"(smem_addr));
}

// `kWords` consecutive 32-bit words at `smem_addr` (4-byte aligned; 16 bytes at a time where
// kWords and the address allow, which the packed-weight layout guarantees for kWords % 4 == 0).
template <int kWords>
__device__ __forceinline__ void lds_words(u32 (&v)[kWords], u32 smem_addr) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v[i]), "=r"(v[i + 1]), "=r"(v[i + 2]), "=r"(v[i + 3])
                   : "r"(smem_addr + 4 * i));
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 2) {
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v[i]), "=r"(v[i + 1]) : "r"(smem_addr + 4 * i));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v[i]) : "r"(smem_addr + 4 * i));
  }
}

__device__ __forceinline__ void lds_128(u32 (&v)[4], u32 smem_addr) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(smem_addr));
}

// One float at `smem_addr` (a 32-bit shared address: a generic pointer into shared memory costs
// the kernel two S2UR to form wherever ptxas cannot keep it).
__device__ __forceinline__ float lds_float(u32 smem_addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_addr));
  return v;
}

// Two consecutive floats at `smem_addr` (8-byte aligned), as lds_float.
__device__ __forceinline__ float2 lds_float2(u32 smem_addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_addr));
  return v;
}

}  // namespace humming_aot::memory
