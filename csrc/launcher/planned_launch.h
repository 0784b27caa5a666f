#pragma once
// A kernel launch with one struct of Params passed by value (launch_bytes), and the eager path's
// launches with everything but the per-call fields decided ahead (PlannedLaunch, BoundLaunch).

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_driver.h"
#include "py_values.h"

namespace humming_aot::launcher {

// Launches `function` with the `size` bytes at `params` as its one by-value struct argument.
void launch_bytes(cu::CUfunction function, const Dim3& grid, const Dim3& block, unsigned int smem, std::uint64_t stream,
                  const unsigned char* params, std::size_t size, int device, bool programmatic_dependent_launch,
                  const Dim3& cluster);

class BoundLaunch;

// One kernel's launch with everything but the per-call fields fixed (humming_aot.dispatch's
// LaunchPlan holds one): the kernel, grid, block, shared memory, cluster, PDL, and a template of
// its Params bytes. Per call only the 7 pointers, the two row strides, the global scale and (TMA
// bodies) the activations' tensor map are written into a copy of the template. Python passes
// the byte offsets of those fields (humming_aot/params_abi.py owns the layout), so no Params
// layout is written down here; the constructor checks that every field lies inside the bytes.
class PlannedLaunch {
 public:
  static constexpr std::size_t kMaxParamsBytes = 1024;
  static constexpr std::size_t kTensorMapBytes = 128;

  PlannedLaunch(std::uint64_t kernel, const Dim3& grid, const Dim3& block, unsigned int smem, int device,
                bool programmatic_dependent_launch, const Dim3& cluster, const py::buffer& params_template,
                const std::array<std::size_t, 7>& pointer_offsets, std::size_t lda_offset, std::size_t ldo_offset,
                std::size_t global_scale_offset, std::int64_t tensor_map_offset)
      : function_(to_handle<cu::CUfunction>(kernel, "kernel")),
        grid_(grid),
        block_(block),
        smem_(smem),
        device_(device),
        programmatic_dependent_launch_(programmatic_dependent_launch),
        cluster_(cluster),
        pointer_offsets_(pointer_offsets),
        lda_offset_(lda_offset),
        ldo_offset_(ldo_offset),
        global_scale_offset_(global_scale_offset),
        tensor_map_offset_(tensor_map_offset) {
    const ByteView bytes(params_template);
    size_ = bytes.size();
    if (size_ == 0 || size_ > kMaxParamsBytes) {
      throw py::value_error("PlannedLaunch: the params template is " + std::to_string(size_) +
                            " bytes; a Params struct is 1 to " + std::to_string(kMaxParamsBytes) + " bytes");
    }
    std::memcpy(template_.data(), bytes.data(), size_);
    for (const std::size_t offset : pointer_offsets_) {
      check_field(offset, sizeof(std::uint64_t), "a pointer");
    }
    check_field(lda_offset_, sizeof(std::int64_t), "lda");
    check_field(ldo_offset_, sizeof(std::int64_t), "ldo");
    check_field(global_scale_offset_, sizeof(float), "the global scale");
    if (tensor_map_offset_ >= 0) {
      check_field(static_cast<std::size_t>(tensor_map_offset_), kTensorMapBytes, "the tensor map");
    }
  }

  using Params = std::array<unsigned char, kMaxParamsBytes>;

  // Pointers in the order of GemmParams: a, w, w_scale, w_zero_point, bias, out, workspace.
  void launch(std::uint64_t stream, std::uint64_t a, std::uint64_t w, std::uint64_t w_scale, std::uint64_t w_zero_point,
              std::uint64_t bias, std::uint64_t out, std::uint64_t workspace, std::int64_t lda, std::int64_t ldo,
              float global_scale, const py::object& tensor_map) const {
    alignas(16) Params params;
    fill(params, a, w, w_scale, w_zero_point, bias, out, workspace, lda, ldo, global_scale, tensor_map);
    launch_bytes(function_, grid_, block_, smem_, stream, params.data(), size_, device_, programmatic_dependent_launch_,
                 cluster_);
  }

  // The bytes launch() would pass (for tests: needs no driver).
  py::bytes params(std::uint64_t a, std::uint64_t w, std::uint64_t w_scale, std::uint64_t w_zero_point,
                   std::uint64_t bias, std::uint64_t out, std::uint64_t workspace, std::int64_t lda, std::int64_t ldo,
                   float global_scale, const py::object& tensor_map) const {
    alignas(16) Params params;
    fill(params, a, w, w_scale, w_zero_point, bias, out, workspace, lda, ldo, global_scale, tensor_map);
    return py::bytes(reinterpret_cast<const char*>(params.data()), size_);
  }

  std::size_t params_bytes() const { return size_; }

  // This plan with one weight's fields and its stream fixed (see BoundLaunch).
  BoundLaunch bind(std::uint64_t stream, std::uint64_t w, std::uint64_t w_scale, std::uint64_t w_zero_point,
                   std::int64_t ldo, float global_scale) const;

 private:
  void fill(Params& params, std::uint64_t a, std::uint64_t w, std::uint64_t w_scale, std::uint64_t w_zero_point,
            std::uint64_t bias, std::uint64_t out, std::uint64_t workspace, std::int64_t lda, std::int64_t ldo,
            float global_scale, const py::object& tensor_map) const {
    std::memcpy(params.data(), template_.data(), size_);
    const std::uint64_t pointers[7] = {a, w, w_scale, w_zero_point, bias, out, workspace};
    for (std::size_t i = 0; i < 7; ++i) {
      std::memcpy(params.data() + pointer_offsets_[i], &pointers[i], sizeof(std::uint64_t));
    }
    std::memcpy(params.data() + lda_offset_, &lda, sizeof(lda));
    std::memcpy(params.data() + ldo_offset_, &ldo, sizeof(ldo));
    std::memcpy(params.data() + global_scale_offset_, &global_scale, sizeof(global_scale));
    if (tensor_map_offset_ >= 0) {
      if (tensor_map.is_none()) {
        throw py::value_error("PlannedLaunch: this kernel's Params hold a tensor map; pass its 128 bytes");
      }
      const ByteView map(tensor_map);
      if (map.size() != kTensorMapBytes) {
        throw py::value_error("PlannedLaunch: the tensor map is " + std::to_string(map.size()) + " bytes, not 128");
      }
      std::memcpy(params.data() + tensor_map_offset_, map.data(), kTensorMapBytes);
    }
  }

  void check_field(std::size_t offset, std::size_t bytes, const char* what) const {
    if (offset + bytes > size_) {
      throw py::value_error(std::string("PlannedLaunch: ") + what + " at byte " + std::to_string(offset) +
                            " does not fit in the " + std::to_string(size_) + "-byte params template");
    }
  }

  cu::CUfunction function_;
  Dim3 grid_, block_;
  unsigned int smem_;
  int device_;
  bool programmatic_dependent_launch_;
  Dim3 cluster_;
  std::array<std::size_t, 7> pointer_offsets_;
  std::size_t lda_offset_, ldo_offset_, global_scale_offset_;
  std::int64_t tensor_map_offset_;
  std::array<unsigned char, kMaxParamsBytes> template_{};
  std::size_t size_ = 0;
};

// A PlannedLaunch of a plan without a workspace or tensor map, bound to one weight (its three
// pointers, the global scale, the output's row stride) and one stream: per call only the
// activations', bias's and output's pointers and the activations' row stride change, so the eager
// path (humming_aot.ops) passes four ints. Whoever binds keeps the weight's tensors alive as long
// as the BoundLaunch may run.
class BoundLaunch {
 public:
  using Params = PlannedLaunch::Params;

  BoundLaunch(cu::CUfunction function, const Dim3& grid, const Dim3& block, unsigned int smem, int device,
              bool programmatic_dependent_launch, const Dim3& cluster, const Params& filled, std::size_t size,
              std::uint64_t stream, std::size_t a_offset, std::size_t bias_offset, std::size_t out_offset,
              std::size_t lda_offset)
      : function_(function),
        grid_(grid),
        block_(block),
        smem_(smem),
        device_(device),
        programmatic_dependent_launch_(programmatic_dependent_launch),
        cluster_(cluster),
        filled_(filled),
        size_(size),
        stream_(stream),
        a_offset_(a_offset),
        bias_offset_(bias_offset),
        out_offset_(out_offset),
        lda_offset_(lda_offset) {}

  void launch(std::uint64_t a, std::uint64_t bias, std::uint64_t out, std::int64_t lda) const {
    alignas(16) Params params;
    fill(params, a, bias, out, lda);
    launch_bytes(function_, grid_, block_, smem_, stream_, params.data(), size_, device_,
                 programmatic_dependent_launch_, cluster_);
  }

  // The bytes launch() would pass (for tests: needs no driver).
  py::bytes params(std::uint64_t a, std::uint64_t bias, std::uint64_t out, std::int64_t lda) const {
    alignas(16) Params params;
    fill(params, a, bias, out, lda);
    return py::bytes(reinterpret_cast<const char*>(params.data()), size_);
  }

  std::uint64_t stream() const { return stream_; }

 private:
  void fill(Params& params, std::uint64_t a, std::uint64_t bias, std::uint64_t out, std::int64_t lda) const {
    std::memcpy(params.data(), filled_.data(), size_);
    std::memcpy(params.data() + a_offset_, &a, sizeof(a));
    std::memcpy(params.data() + bias_offset_, &bias, sizeof(bias));
    std::memcpy(params.data() + out_offset_, &out, sizeof(out));
    std::memcpy(params.data() + lda_offset_, &lda, sizeof(lda));
  }

  cu::CUfunction function_;
  Dim3 grid_, block_;
  unsigned int smem_;
  int device_;
  bool programmatic_dependent_launch_;
  Dim3 cluster_;
  Params filled_;
  std::size_t size_;
  std::uint64_t stream_;
  std::size_t a_offset_, bias_offset_, out_offset_, lda_offset_;
};

}  // namespace humming_aot::launcher
