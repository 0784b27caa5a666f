#pragma once
// The thread-block cluster primitives of the in-cluster split-K reduction (sm_90+): the K slices of
// one output tile are the CTAs of one cluster (launched with cluster dims (1, k_splits, 1), so the
// slice index is the cluster rank). The slices push their fp32 partials into the owning CTA's
// shared memory with st.async, which counts the bytes on an mbarrier of that CTA; the owner waits
// on its own mbarrier - no global workspace, atomic, memory fence or second cluster barrier.
// PTX ISA: "Distributed Shared Memory", mapa, st.async, mbarrier (transaction counts),
// barrier.cluster.

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

// Wait until every thread of every CTA of the cluster has arrived (acquire: it then sees what
// they wrote, or set up, before a releasing arrival or fence).
__device__ __forceinline__ void wait() {
  if constexpr (kAvailable) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// An arrival that orders nothing: at a kernel's start, so that a later wait() proves that every
// CTA of the cluster has started (before any of them writes another's shared memory).
__device__ __forceinline__ void arrive_relaxed() {
  if constexpr (kAvailable) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// The shared::cluster address of `local` (a shared::cta address) in CTA `cta` of the cluster.
__device__ __forceinline__ u32 map_to(u32 local, u32 cta) {
  u32 remote = local;
  if constexpr (kAvailable)
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(cta));
  return remote;
}

// An mbarrier (8 bytes of shared memory at `bar`) that completes its phase 0 once `bytes` bytes of
// st.async have landed on it: init_byte_barrier sets up one expected arrival, and expect_bytes
// makes that arrival at once with the transaction count (a count may go below zero meanwhile:
// bytes can land before it runs). Both by the same thread, in that order; then, before any other
// CTA may signal it, fence_barrier_init() and a cluster barrier arrival (release) by that thread.
__device__ __forceinline__ void init_byte_barrier(u32 bar) {
  if constexpr (kAvailable) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void expect_bytes(u32 bar, u32 bytes) {
  if constexpr (kAvailable) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
  }
}
__device__ __forceinline__ void fence_barrier_init() {
  if constexpr (kAvailable) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Four floats to `remote` (a shared::cluster address), counted on the mbarrier at `remote_bar` (a
// shared::cluster address in the same CTA). Asynchronous: the issuing thread does not wait, and
// needs no fence; the receiver learns of the data from its mbarrier.
__device__ __forceinline__ void store4_async(u32 remote, u32 remote_bar, const float (&v)[4]) {
  if constexpr (kAvailable) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(remote),
        "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(remote_bar)
        : "memory");
  }
}

// Wait until phase 0 of this CTA's mbarrier at `bar` has completed (acquire at cluster scope: the
// st.async data of other CTAs counted on it is then visible).
__device__ __forceinline__ void wait_byte_barrier(u32 bar) {
  if constexpr (kAvailable) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(bar)
        : "memory");
  }
}

// Four floats at `local` (a shared::cta address) of this CTA.
__device__ __forceinline__ void load4_local(u32 local, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(local)
               : "memory");
}

}  // namespace humming_aot::epilogue::cluster
