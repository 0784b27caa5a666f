// humming_aot._C: the pybind11 launcher. Loads kernel images with context-independent
// cuLibraryLoadData, reads their self-description and launches them with one Params struct passed
// by value. No torch and no CUDA headers: streams, devices and handles cross as Python ints, and
// the driver is dlopen'ed on first use (cuda_driver.h), so `import humming_aot._C` needs no GPU.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "device_context.h"
#include "image_format.h"

namespace py = pybind11;

namespace humming_aot::launcher {
namespace {

using Dim3 = std::array<unsigned int, 3>;

// Python exception types, created once in PYBIND11_MODULE and owned by the module.
PyObject* g_cuda_error_type = nullptr;
PyObject* g_driver_not_found_type = nullptr;

template <typename Handle>
Handle to_handle(std::uint64_t value, const char* kind) {
  if (value == 0) {
    throw py::value_error(std::string("the ") + kind + " handle is 0: pass the value that load_library / " +
                          "get_kernel returned");
  }
  return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(value));
}

template <typename Handle>
std::uint64_t from_handle(Handle handle) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
}

// Read-only view of a bytes-like object without copying. bytes take a fast path with no buffer
// export; anything else (bytearray, memoryview, ctypes structure) must be C-contiguous.
// Construct and destroy with the GIL held.
class ByteView {
 public:
  explicit ByteView(py::handle object) {
    if (PyBytes_CheckExact(object.ptr())) {
      data_ = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(object.ptr()));
      size_ = static_cast<std::size_t>(PyBytes_GET_SIZE(object.ptr()));
      return;
    }
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      throw py::error_already_set();
    }
    exported_ = true;
    data_ = static_cast<const unsigned char*>(view_.buf);
    size_ = static_cast<std::size_t>(view_.len);
  }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  ~ByteView() {
    if (exported_) {
      PyBuffer_Release(&view_);
    }
  }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  Py_buffer view_{};
  bool exported_ = false;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

std::string dim3_text(const Dim3& dim) {
  return "(" + std::to_string(dim[0]) + ", " + std::to_string(dim[1]) + ", " + std::to_string(dim[2]) + ")";
}

std::string device_text(int device) { return "device " + std::to_string(device); }

// ---- The Python-visible functions ----

int driver_version() { return cu::driver_version(); }

std::string image_problem_of(const py::buffer& image) {
  const ByteView bytes(image);
  return image_problem(bytes.data(), bytes.size());
}

std::uint64_t load_library(const py::buffer& image, const std::string& what) {
  const ByteView bytes(image);
  const std::string problem = image_problem(bytes.data(), bytes.size());
  if (!problem.empty()) {
    throw py::value_error("load_library(" + what + "): " + problem);
  }
  const cu::DriverApi& api = cu::driver();
  cu::CUlibrary library = nullptr;
  {
    py::gil_scoped_release no_gil;  // loading may take milliseconds (eager module loading)
    // The driver reads 64-bit header fields; a memoryview slice may start anywhere.
    std::vector<std::uint64_t> aligned;
    const void* data = bytes.data();
    if (reinterpret_cast<std::uintptr_t>(data) % alignof(std::uint64_t) != 0) {
      aligned.resize((bytes.size() + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t));
      std::memcpy(aligned.data(), bytes.data(), bytes.size());
      data = aligned.data();
    }
    // No options: the driver copies the image, so the caller's bytes may be freed afterwards.
    cu::check(api, api.cuLibraryLoadData(&library, data, nullptr, nullptr, 0, nullptr, nullptr, 0), "cuLibraryLoadData",
              what);
  }
  return from_handle(library);
}

void unload_library(std::uint64_t library) {
  const auto handle = to_handle<cu::CUlibrary>(library, "library");
  const cu::DriverApi& api = cu::driver();
  cu::check(api, api.cuLibraryUnload(handle), "cuLibraryUnload", "");
}

std::uint64_t get_kernel(std::uint64_t library, const std::string& name) {
  const auto handle = to_handle<cu::CUlibrary>(library, "library");
  const cu::DriverApi& api = cu::driver();
  cu::CUkernel kernel = nullptr;
  cu::check(api, api.cuLibraryGetKernel(&kernel, handle, name.c_str()), "cuLibraryGetKernel", name);
  return from_handle(kernel);
}

py::bytes read_global(std::uint64_t library, const std::string& name, int device) {
  const auto handle = to_handle<cu::CUlibrary>(library, "library");
  const cu::DriverApi& api = cu::driver();
  std::string contents;
  {
    // NOTE: cuMemcpyDtoH is synchronous (it waits for the legacy default stream) and is not
    // allowed during CUDA-graph capture: load kernels before capturing, as warm-up runs do.
    py::gil_scoped_release no_gil;
    ensure_current_context(api, device);
    cu::CUdeviceptr pointer = 0;
    std::size_t bytes = 0;
    cu::check(api, api.cuLibraryGetGlobal(&pointer, &bytes, handle, name.c_str()), "cuLibraryGetGlobal",
              name + ", " + device_text(device));
    contents.resize(bytes);
    if (bytes > 0) {
      cu::check(api, api.cuMemcpyDtoH_v2(contents.data(), pointer, bytes), "cuMemcpyDtoH",
                name + ", " + std::to_string(bytes) + " bytes, " + device_text(device));
    }
  }
  return py::bytes(contents);
}

void set_max_dynamic_smem(std::uint64_t kernel, int device, int nbytes) {
  const auto handle = to_handle<cu::CUkernel>(kernel, "kernel");
  const cu::DriverApi& api = cu::driver();
  const cu::CUdevice dev = device_handle(api, device);
  cu::check(api, api.cuKernelSetAttribute(cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes, handle, dev),
            "cuKernelSetAttribute",
            "MAX_DYNAMIC_SHARED_SIZE_BYTES = " + std::to_string(nbytes) + ", " + device_text(device));
}

int kernel_attribute(std::uint64_t kernel, int attribute, int device) {
  const auto handle = to_handle<cu::CUkernel>(kernel, "kernel");
  const cu::DriverApi& api = cu::driver();
  const cu::CUdevice dev = device_handle(api, device);
  int value = 0;
  cu::check(api, api.cuKernelGetAttribute(&value, static_cast<cu::CUfunction_attribute>(attribute), handle, dev),
            "cuKernelGetAttribute", "attribute " + std::to_string(attribute) + ", " + device_text(device));
  return value;
}

int device_attribute(int device, int attribute) {
  const cu::DriverApi& api = cu::driver();
  const cu::CUdevice dev = device_handle(api, device);
  int value = 0;
  cu::check(api, api.cuDeviceGetAttribute(&value, static_cast<cu::CUdevice_attribute>(attribute), dev),
            "cuDeviceGetAttribute", "attribute " + std::to_string(attribute) + ", " + device_text(device));
  return value;
}

// How many clusters of `cluster` CTAs of `kernel` (block threads, smem bytes of dynamic shared
// memory, placed as launch_bytes places them) the device holds at once; 0 when the driver cannot
// say (it lacks cuOccupancyMaxActiveClusters or cuKernelGetFunction).
int max_active_clusters(std::uint64_t kernel, const Dim3& block, unsigned int smem, const Dim3& cluster, int device) {
  const auto handle = to_handle<cu::CUkernel>(kernel, "kernel");
  const cu::DriverApi& api = cu::driver();
  if (api.cuOccupancyMaxActiveClusters == nullptr || api.cuKernelGetFunction == nullptr) return 0;
  if (cluster[0] * cluster[1] * cluster[2] == 0 || block[0] * block[1] * block[2] == 0) {
    throw py::value_error("max_active_clusters: the block " + dim3_text(block) + " and the cluster " +
                          dim3_text(cluster) + " must not be empty");
  }
  ensure_current_context(api, device);
  cu::CUfunction function = nullptr;
  cu::check(api, api.cuKernelGetFunction(&function, handle), "cuKernelGetFunction", device_text(device));
  cu::CUlaunchAttribute attributes[2]{};
  attributes[0].id = cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attributes[0].value.clusterDim = {cluster[0], cluster[1], cluster[2]};
  attributes[1].id = cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
  attributes[1].value.clusterSchedulingPolicyPreference = cu::CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
  // the grid only has to be a whole number of clusters
  const cu::CUlaunchConfig config{cluster[0], cluster[1], cluster[2], block[0],   block[1],
                                  block[2],   smem,       nullptr,    attributes, 2};
  int clusters = 0;
  cu::check(api, api.cuOccupancyMaxActiveClusters(&clusters, function, &config), "cuOccupancyMaxActiveClusters",
            "block " + dim3_text(block) + ", cluster " + dim3_text(cluster) + ", smem " + std::to_string(smem) +
                " bytes, " + device_text(device));
  return clusters;
}

// The hot path: no allocation and one cuCtxGetCurrent besides the launch itself.
// The 128 bytes of a CUtensorMap over a row-major (rows, cols) matrix of 16-bit elements at
// `address` with `row_stride_bytes` between rows, read in boxes of (box_rows, box_cols) with the
// 128-byte swizzle (box_cols * 2 == 128) and out-of-bounds rows read as zeros. Encoding needs no
// context; the map is valid on every device that can read `address`.
py::bytes encode_tensor_map_2d(std::uint64_t address, std::uint64_t rows, std::uint64_t cols,
                               std::uint64_t row_stride_bytes, unsigned int box_rows, unsigned int box_cols) {
  const cu::DriverApi& api = cu::driver();
  if (api.cuTensorMapEncodeTiled == nullptr) {
    throw cu::DriverNotFound(
        "the NVIDIA driver lacks cuTensorMapEncodeTiled (CUDA 12.0+): the TMA kernels cannot be launched; update "
        "the driver");
  }
  if (address % 16 != 0 || row_stride_bytes % 16 != 0 || box_cols * 2 != 128 || box_rows == 0 || box_rows > 256 ||
      rows == 0 || cols == 0) {
    throw py::value_error("encode_tensor_map_2d: the address (" + std::to_string(address) + ") and the row stride (" +
                          std::to_string(row_stride_bytes) +
                          " bytes) must be multiples of 16, the box 1-256 rows of 64 16-bit columns, the matrix "
                          "non-empty");
  }
  cu::CUtensorMap map{};
  const unsigned long long dims[2] = {cols, rows};
  const unsigned long long strides[1] = {row_stride_bytes};
  const unsigned int box[2] = {box_cols, box_rows};
  const unsigned int element_strides[2] = {1, 1};
  cu::check(
      api,
      api.cuTensorMapEncodeTiled(&map, cu::CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                                 reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), dims, strides, box,
                                 element_strides, cu::CU_TENSOR_MAP_INTERLEAVE_NONE, cu::CU_TENSOR_MAP_SWIZZLE_128B,
                                 cu::CU_TENSOR_MAP_L2_PROMOTION_L2_256B, cu::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeTiled",
      "a (" + std::to_string(rows) + ", " + std::to_string(cols) + ") matrix, box (" + std::to_string(box_rows) + ", " +
          std::to_string(box_cols) + ")");
  return py::bytes(reinterpret_cast<const char*>(&map), sizeof(map));
}

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

void launch(std::uint64_t kernel, const Dim3& grid, const Dim3& block, unsigned int smem, std::uint64_t stream,
            const py::buffer& params, int device, bool programmatic_dependent_launch, const Dim3& cluster) {
  const auto function = to_handle<cu::CUfunction>(kernel, "kernel");
  const ByteView param_bytes(params);
  if (param_bytes.size() == 0) {
    throw py::value_error("launch: params is empty; pass the bytes of the kernel's Params struct");
  }
  launch_bytes(function, grid, block, smem, stream, param_bytes.data(), param_bytes.size(), device,
               programmatic_dependent_launch, cluster);
}

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

// ---- Exceptions ----

PyObject* new_exception_type(const char* name, const char* doc, PyObject* base) {
  py::dict attributes;
  attributes["code"] = py::none();
  attributes["error_name"] = py::none();
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, base, attributes.ptr());
  if (type == nullptr) {
    throw py::error_already_set();
  }
  return type;
}

void raise_cuda_error(const cu::CudaError& error) {
  PyObject* exception = PyObject_CallFunction(g_cuda_error_type, "s", error.what());
  if (exception == nullptr) {
    return;  // the failure to build the exception is the error now set
  }
  py::object owned = py::reinterpret_steal<py::object>(exception);
  owned.attr("code") = static_cast<int>(error.code());
  owned.attr("error_name") = error.error_name();
  PyErr_SetObject(g_cuda_error_type, exception);
}

void translate_exception(std::exception_ptr pending) {
  try {
    std::rethrow_exception(pending);
  } catch (const cu::CudaError& error) {
    raise_cuda_error(error);
  } catch (const cu::DriverNotFound& error) {
    PyErr_SetString(g_driver_not_found_type, error.what());
  }
}

}  // namespace
}  // namespace humming_aot::launcher

PYBIND11_MODULE(_C, m) {
  namespace hl = humming_aot::launcher;
  m.doc() =
      "humming_aot's kernel launcher: CUDA driver calls through a libcuda.so.1 loaded on first use. "
      "Handles (library, kernel, stream) are Python ints; every driver failure raises CudaError.";

  hl::g_cuda_error_type = hl::new_exception_type(
      "humming_aot._C.CudaError",
      "A CUDA driver call failed. The message names the call, what it was doing, the error name and "
      "the driver's description; `code` is the CUresult (None when the driver is missing) and "
      "`error_name` its name, e.g. 'CUDA_ERROR_NO_BINARY_FOR_GPU'.",
      PyExc_RuntimeError);
  hl::g_driver_not_found_type = hl::new_exception_type(
      "humming_aot._C.DriverNotFoundError",
      "No usable NVIDIA driver: libcuda.so.1 could not be loaded (the message has dlerror's text) or "
      "lacks an entry point humming_aot needs. Raised by the first call that needs the driver, never at "
      "import.",
      hl::g_cuda_error_type);
  m.attr("CudaError") = py::reinterpret_borrow<py::object>(hl::g_cuda_error_type);
  m.attr("DriverNotFoundError") = py::reinterpret_borrow<py::object>(hl::g_driver_not_found_type);
  py::register_local_exception_translator(&hl::translate_exception);

  m.def("driver_available", &humming_aot::launcher::cu::driver_available,
        "Whether a usable driver is present: loads libcuda.so.1 and runs cuInit(0) on the first call. "
        "Never raises.");
  m.def("supports_programmatic_launch", &humming_aot::launcher::cu::programmatic_launch_available,
        "Whether launch(..., programmatic_dependent_launch=True) can use Programmatic Dependent Launch: "
        "the driver is usable and has cuLaunchKernelEx. Says nothing about the device (PDL needs sm_90+). "
        "Never raises.");
  m.def("driver_unavailable_reason", &humming_aot::launcher::cu::driver_unavailable_reason,
        "Why driver_available() is False ('' when it is True). Never raises.");
  m.def("driver_version", &hl::driver_version,
        "cuDriverGetVersion (e.g. 13000 for a CUDA 13.0 driver; 0 if the driver would not say).");
  m.def("image_problem", &hl::image_problem_of, py::arg("image"),
        "'' when `image` (bytes-like) is a complete fatbin or cubin, else what is wrong with it. "
        "load_library runs the same check. Needs no driver.");
  m.def("load_library", &hl::load_library, py::arg("image"), py::arg("what"),
        "cuLibraryLoadData on a fatbin or cubin (bytes-like; copied by the driver). Context-independent. "
        "`what` names the image in error messages, e.g. 'kernel gemm_dense_...'. Returns the CUlibrary.");
  m.def("unload_library", &hl::unload_library, py::arg("library"), "cuLibraryUnload.");
  m.def("get_kernel", &hl::get_kernel, py::arg("library"), py::arg("name"),
        "cuLibraryGetKernel: the CUkernel (an int) of the extern \"C\" kernel `name`.");
  m.def("read_global", &hl::read_global, py::arg("library"), py::arg("name"), py::arg("device"),
        "The bytes of the __device__ / __constant__ variable `name` as loaded on `device` "
        "(cuLibraryGetGlobal + synchronous cuMemcpyDtoH; makes the device's primary context current "
        "if the thread has none).");
  m.def("set_max_dynamic_smem", &hl::set_max_dynamic_smem, py::arg("kernel"), py::arg("device"), py::arg("nbytes"),
        "cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes) for `device`.");
  m.def("kernel_attribute", &hl::kernel_attribute, py::arg("kernel"), py::arg("attribute"), py::arg("device"),
        "cuKernelGetAttribute (CUfunction_attribute values: MAX_THREADS_PER_BLOCK 0, LOCAL_SIZE_BYTES 3, "
        "NUM_REGS 4, MAX_DYNAMIC_SHARED_SIZE_BYTES 8).");
  m.def("device_attribute", &hl::device_attribute, py::arg("device"), py::arg("attribute"),
        "cuDeviceGetAttribute (CUdevice_attribute values: MULTIPROCESSOR_COUNT 16, "
        "COMPUTE_CAPABILITY_MAJOR 75, COMPUTE_CAPABILITY_MINOR 76, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97).");
  m.def("max_active_clusters", &hl::max_active_clusters, py::arg("kernel"), py::arg("block"), py::arg("smem"),
        py::arg("cluster"), py::arg("device"),
        "cuOccupancyMaxActiveClusters: how many clusters of shape `cluster` of `kernel` (block threads, `smem` "
        "bytes of dynamic shared memory, load-balanced placement as launch() asks for) `device` holds at once; "
        "0 when the driver cannot say.");
  m.def("encode_tensor_map_2d", &hl::encode_tensor_map_2d, py::arg("address"), py::arg("rows"), py::arg("cols"),
        py::arg("row_stride_bytes"), py::arg("box_rows"), py::arg("box_cols"),
        "The 128 bytes of a CUtensorMap (cuTensorMapEncodeTiled) over a row-major (rows, cols) matrix of 16-bit "
        "elements at device address `address`, rows `row_stride_bytes` apart (a multiple of 16), read in boxes of "
        "(box_rows <= 256, box_cols = 64) with the 128-byte swizzle; rows past the end read as zeros. Used by the "
        "TMA kernel bodies' Params (kernel/params.cuh, TmaGemmParams).");
  py::class_<hl::PlannedLaunch>(m, "PlannedLaunch",
                                "One kernel's launch with its grid, block, shared memory, cluster, PDL and the "
                                "fixed bytes of its Params decided ahead; launch() writes the per-call fields "
                                "(pointers, row strides, global scale, tensor map) into a copy and launches. The "
                                "offsets of those fields come from humming_aot.params_abi.")
      .def(py::init<std::uint64_t, const hl::Dim3&, const hl::Dim3&, unsigned int, int, bool, const hl::Dim3&,
                    const py::buffer&, const std::array<std::size_t, 7>&, std::size_t, std::size_t, std::size_t,
                    std::int64_t>(),
           py::arg("kernel"), py::arg("grid"), py::arg("block"), py::arg("smem"), py::arg("device"),
           py::arg("programmatic_dependent_launch"), py::arg("cluster"), py::arg("params_template"),
           py::arg("pointer_offsets"), py::arg("lda_offset"), py::arg("ldo_offset"), py::arg("global_scale_offset"),
           py::arg("tensor_map_offset"))
      .def("launch", &hl::PlannedLaunch::launch,
           "launch(stream, a, w, w_scale, w_zero_point, bias, out, workspace, lda, ldo, global_scale, tensor_map): "
           "pointers as ints (0 for none), tensor_map the 128 bytes of the activations' CUtensorMap or None. "
           "Asynchronous, on `stream` (a CUstream as an int).")
      .def("params", &hl::PlannedLaunch::params,
           "params(a, w, w_scale, w_zero_point, bias, out, workspace, lda, ldo, global_scale, tensor_map): the "
           "Params bytes launch() would pass with these fields (needs no driver).")
      .def_property_readonly("params_bytes", &hl::PlannedLaunch::params_bytes);
  m.def("launch", &hl::launch, py::arg("kernel"), py::arg("grid"), py::arg("block"), py::arg("smem"), py::arg("stream"),
        py::arg("params"), py::arg("device"), py::kw_only(), py::arg("programmatic_dependent_launch") = false,
        py::arg("cluster") = std::array<unsigned int, 3>{1, 1, 1},
        "cuLaunchKernel of a CUkernel whose single argument is a struct passed by value; `params` holds "
        "its bytes (bytes-like, not copied). grid and block are (x, y, z); smem is dynamic shared memory "
        "in bytes; stream is a CUstream as an int (torch.cuda.current_stream().cuda_stream; 0 = legacy "
        "default stream). If the thread has no current context, `device`'s primary context is made "
        "current first. Asynchronous: errors inside the kernel surface at the next synchronisation. "
        "programmatic_dependent_launch=True launches through cuLaunchKernelEx with "
        "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (ask for it on sm_90+ devices only; the "
        "kernel must execute griddepcontrol.wait before reading what the previous kernel in the stream "
        "writes); without cuLaunchKernelEx in the driver it falls back to cuLaunchKernel. cluster=(x, y, z) "
        "other than (1, 1, 1) launches thread-block clusters of that shape (sm_90+; each grid dimension a "
        "multiple of it) through cuLaunchKernelEx, and raises ValueError without it.");
}
