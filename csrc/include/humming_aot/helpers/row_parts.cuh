#pragma once
// A row split over the CTAs of a grid's y dimension, for the quantization kernels of few rows:
// with fewer rows than SMs, one CTA a row leaves most SMs idle and the row's per-element work on
// one SM sets the time; gridDim.y CTAs a row each take a contiguous part of it.
// - RowPart::of(vectors, granule): this CTA's vectors [begin, end) of a row of `vectors`, parts of
//   ceil(vectors / gridDim.y) rounded up to a multiple of `granule` (a power of two: a scale
//   group's vectors, so that no group straddles two CTAs); the last parts may be short or empty.
//   gridDim.y == 1 gives the whole row.
// - cluster_max(value): the largest of value over the CTAs of this thread-block cluster (sm_90+),
//   every CTA's value read from its shared memory through the cluster's (DSMEM). A per-row amax
//   over a row split in gridDim.y parts needs the launch to group those parts in one cluster of
//   (1, gridDim.y, 1): where the cluster's CTA count is not the row's parts, it traps rather than
//   scale by a part's amax (the host launches no other shape). Every thread of every CTA of the
//   cluster calls it once, with its CTA's value, and calls cluster_exit() before the kernel
//   returns (a CTA's shared memory must outlive the other CTAs' reads of it).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::helpers {

struct RowPart {
  i64 begin;
  i64 end;

  static __device__ __forceinline__ RowPart of(i64 vectors, int granule) {
    if (gridDim.y == 1) return {0, vectors};
    i64 chunk = (vectors + gridDim.y - 1) / gridDim.y;
    chunk = (chunk + granule - 1) & ~static_cast<i64>(granule - 1);
    const i64 begin = min(vectors, static_cast<i64>(blockIdx.y) * chunk);
    return {begin, min(vectors, begin + chunk)};
  }
};

__device__ __forceinline__ float cluster_max(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float mine;
  u32 ctas = 0;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  if (ctas != gridDim.y) __trap();  // (a launch without the row's parts as its cluster)
  if (threadIdx.x == 0) mine = value;
  // every CTA's `mine` written (release) before any is read (acquire)
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  const u32 local = static_cast<u32>(__cvta_generic_to_shared(&mine));
  float m = value;
  for (u32 rank = 0; rank < ctas; ++rank) {
    u32 remote = 0;
    float other = 0.0f;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(other) : "r"(remote) : "memory");
    m = fmaxf(m, other);
  }
  // this thread's reads done (release); cluster_exit() waits for every thread's
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  return m;
#else
  __trap();  // (no clusters before sm_90: the host never splits a token row there)
  return value;
#endif
}

__device__ __forceinline__ void cluster_exit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

}  // namespace humming_aot::helpers
