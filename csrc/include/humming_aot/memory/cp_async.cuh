#pragma once
// Global -> shared copies with cp.async (SM80+): 16-byte chunks that bypass L1, zero-filled when
// the source is out of bounds, grouped so a multistage pipeline can wait for the oldest stage.
// SM75 (Turing) has no cp.async: there each copy is a synchronous load and store, and commits
// and waits are no-ops, so the same pipeline code runs (without the overlap).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::memory {

__device__ __forceinline__ u32 shared_address(const void* ptr) {
  u64 addr;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(addr) : "l"(ptr));
  return static_cast<u32>(addr);
}

// Copy 16 bytes, or write 16 zero bytes when !valid (the source is then not read).
__device__ __forceinline__ void cp_async_16(u32 smem_addr, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  u32 x = 0, y = 0, z = 0, w = 0;
  if (valid)
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(gmem));
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(x), "r"(y), "r"(z), "r"(w));
#else
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
#endif
}

// cp_async_16 with the source's byte count in a register (16, or 0 to zero-fill), for a copy
// whose validity is worked out once and kept rather than recomputed as a predicate per copy.
__device__ __forceinline__ void cp_async_16_bytes(u32 smem_addr, const void* gmem, u32 src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  cp_async_16(smem_addr, gmem, src_bytes != 0);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
#endif
}

// Copy 8 bytes (through L1: cp.async.cg takes 16 only), or write 8 zero bytes when !valid.
__device__ __forceinline__ void cp_async_8(u32 smem_addr, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  u32 x = 0, y = 0;
  if (valid) asm volatile("ld.global.v2.u32 {%0, %1}, [%2];\n" : "=r"(x), "=r"(y) : "l"(gmem));
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(smem_addr), "r"(x), "r"(y));
#else
  const int src_bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace humming_aot::memory
