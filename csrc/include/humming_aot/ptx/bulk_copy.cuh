#pragma once
// Bulk asynchronous copies global -> shared (SM90, the TMA unit), each completing its bytes on an
// mbarrier (ptx/mbarrier.cuh): a contiguous run of bytes (cp.async.bulk, no tensor map), and a
// 2-D box through a tensor map (cp.async.bulk.tensor), which also swizzles and zero-fills rows
// past the tensor's end; and the first one's L2 prefetch form. One thread issues; no register or
// thread cost per byte. Destinations are this CTA's shared memory (the ::cluster forms address it
// when no cluster is launched).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::ptx {

// `bytes` (a multiple of 16) from `src` (16-byte aligned) to `dst` (16-byte aligned), completing
// on the mbarrier at `bar`.
__device__ __forceinline__ void bulk_copy_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The box at element coordinates (x, y) (x innermost) of the 2-D tensor map at generic address
// `map` (a __grid_constant__ kernel parameter) to `dst` (aligned as the map's swizzle needs:
// 1024 bytes for the 128-byte swizzle), completing the box's full byte count on `bar`.
__device__ __forceinline__ void tensor_copy_2d_g2s(u32 dst, const void* map, int x, int y, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// An L2 prefetch of `bytes` (a multiple of 16) from `src` (16-byte aligned), as bulk_copy_g2s
// would read them: a hint with no destination and no completion to wait for.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Fetch a tensor map into the descriptor cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

}  // namespace humming_aot::ptx
