#pragma once
// The thread-block cluster primitives of the in-cluster split-K reduction (sm_90+): the K slices of
// one output tile are the CTAs of one cluster (launched with cluster dims (1, k_splits, 1), so the
// slice index is the cluster rank). The slices exchange their fp32 partials through distributed
// shared memory, with cluster barriers - no global workspace, fence or atomic.
// PTX ISA: "Distributed Shared Memory", mapa, st.shared::cluster, barrier.cluster.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::epilogue::cluster {

// Whether this arch has clusters (false on the host pass and below sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kAvailable = true;
#else
inline constexpr bool kAvailable = false;
#endif

// CTAs in this CTA's cluster (1 for a launch without cluster dims) and this CTA's rank in it.
__device__ __forceinline__ u32 size() {
  u32 n = 1;
  if constexpr (kAvailable) asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ u32 rank() {
  u32 r = 0;
  if constexpr (kAvailable) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives (release: its shared-memory writes become
// visible cluster-wide) ...
__device__ __forceinline__ void arrive() {
  if constexpr (kAvailable) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
// ... and waits until all have arrived (acquire: it then sees what they wrote before arriving).
__device__ __forceinline__ void wait() {
  if constexpr (kAvailable) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// An arrival that orders nothing: at a kernel's start, so that a later wait() proves that every
// CTA of the cluster has started (before any of them writes another's shared memory).
__device__ __forceinline__ void arrive_relaxed() {
  if constexpr (kAvailable) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// Four floats to `local` (a shared::cta address) of CTA `cta` of the cluster.
__device__ __forceinline__ void store4_to(u32 local, u32 cta, const float (&v)[4]) {
  if constexpr (kAvailable) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(cta));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(remote), "f"(v[0]), "f"(v[1]), "f"(v[2]),
                 "f"(v[3])
                 : "memory");
  }
}

// Four floats at `local` (a shared::cta address) of this CTA.
__device__ __forceinline__ void load4_local(u32 local, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(local)
               : "memory");
}

}  // namespace humming_aot::epilogue::cluster
