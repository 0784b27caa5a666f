// launch_bytes and PlannedLaunch::bind (planned_launch.h).

#include "planned_launch.h"

#include "device_context.h"

namespace humming_aot::launcher {

// Launches `function` with the `size` bytes at `params` as its one by-value struct argument.
void launch_bytes(cu::CUfunction function, const Dim3& grid, const Dim3& block, unsigned int smem, std::uint64_t stream,
                  const unsigned char* params, std::size_t size, int device, bool programmatic_dependent_launch,
                  const Dim3& cluster) {
  const cu::DriverApi& api = cu::driver();
  ensure_current_context(api, device);
  const auto cu_stream = reinterpret_cast<cu::CUstream>(static_cast<std::uintptr_t>(stream));
  // The kernel takes one struct by value: kernelParams holds a single pointer to its bytes, which
  // the driver copies before the launch call returns.
  void* kernel_params[] = {const_cast<unsigned char*>(params)};
  const char* call = "cuLaunchKernel";
  cu::CUresult result;
  const bool clustered = cluster[0] * cluster[1] * cluster[2] > 1;
  // A cluster shape changes what the kernel computes with (it may rely on its cluster), so it
  // cannot be dropped: without cuLaunchKernelEx that is an error, checked before anything runs.
  if (clustered && api.cuLaunchKernelEx == nullptr) {
    throw py::value_error("launch: cluster " + dim3_text(cluster) +
                          " needs cuLaunchKernelEx, which this driver lacks (supports_programmatic_launch() is "
                          "False); launch without clusters");
  }
  // Without cuLaunchKernelEx a PDL launch is merely serialized as usual: PDL only overlaps this
  // kernel's prologue with the previous kernel's tail, results do not depend on it.
  if ((programmatic_dependent_launch || clustered) && api.cuLaunchKernelEx != nullptr) {
    call = "cuLaunchKernelEx";
    cu::CUlaunchAttribute attributes[3]{};
    unsigned int count = 0;
    if (programmatic_dependent_launch) {
      attributes[count].id = cu::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attributes[count].value.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    if (clustered) {
      attributes[count].id = cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attributes[count].value.clusterDim = {cluster[0], cluster[1], cluster[2]};
      ++count;
      // The default (spread) placement measured 11.1 -> 16.5 us for an int1 GEMV of 4-CTA clusters on
      // an H200, load balancing 10.7 (docs/performance/log.md section 14).
      attributes[count].id = cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      attributes[count].value.clusterSchedulingPolicyPreference = cu::CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
      ++count;
    }
    const cu::CUlaunchConfig config{grid[0],  grid[1], grid[2],   block[0],   block[1],
                                    block[2], smem,    cu_stream, attributes, count};
    result = api.cuLaunchKernelEx(&config, function, kernel_params, nullptr);
  } else {
    result = api.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, cu_stream,
                                kernel_params, nullptr);
  }
  if (result != cu::CUDA_SUCCESS) {
    cu::throw_cuda_error(api, result, call,
                         "grid " + dim3_text(grid) + ", block " + dim3_text(block) +
                             (clustered ? ", cluster " + dim3_text(cluster) : std::string()) + ", smem " +
                             std::to_string(smem) + " bytes, params " + std::to_string(size) + " bytes, " +
                             device_text(device));
  }
}

BoundLaunch PlannedLaunch::bind(std::uint64_t stream, std::uint64_t w, std::uint64_t w_scale,
                                std::uint64_t w_zero_point, std::int64_t ldo, float global_scale) const {
  if (tensor_map_offset_ >= 0) {
    throw py::value_error(
        "PlannedLaunch.bind: this kernel's Params hold the activations' tensor map, which changes with every "
        "call; launch it through launch()");
  }
  alignas(16) Params filled;
  // a, bias and out 0 (written per call), no workspace, lda 0 (written per call)
  fill(filled, 0, w, w_scale, w_zero_point, 0, 0, 0, 0, ldo, global_scale, py::none());
  return BoundLaunch(function_, grid_, block_, smem_, device_, programmatic_dependent_launch_, cluster_, filled, size_,
                     stream, pointer_offsets_[0], pointer_offsets_[4], pointer_offsets_[5], lda_offset_);
}

}  // namespace humming_aot::launcher
