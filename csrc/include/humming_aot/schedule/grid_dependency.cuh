#pragma once
// Programmatic dependent launch (SM90+): a kernel launched with the programmatic-serialization
// attribute may start while the previous kernel of the stream is still running. Everything it
// does before wait_for_upstream_grid() must not read memory that an upstream kernel writes, nor
// write memory that one reads. The GEMM kernels only prefetch packed weights, scales and zero
// points there: no kernel of this library writes those (a kernel that does must not call
// release_dependent_grid() early). On older arches, and without the launch attribute, both calls
// are no-ops and the stream orders kernels as usual.

namespace humming_aot::schedule {

// Block until every upstream grid has completed and its memory is visible.
__device__ __forceinline__ void wait_for_upstream_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Let the next kernel of the stream be scheduled now (it still waits for this grid to complete
// before its own wait_for_upstream_grid() returns).
__device__ __forceinline__ void release_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The start of a kernel that touches no global memory before the upstream grid is done (the
// helper kernels, launched with PDL from sm_90 builds): the next kernel may launch now, and this
// one waits for the upstream grid before it reads or writes anything.
__device__ __forceinline__ void release_then_wait_for_upstream() {
  release_dependent_grid();
  wait_for_upstream_grid();
}

}  // namespace humming_aot::schedule
