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
#include "device_memory.h"
#include "image_format.h"
#include "planned_launch.h"
#include "py_values.h"

namespace py = pybind11;

namespace humming_aot::launcher {
namespace {

// Python exception types, created once in PYBIND11_MODULE and owned by the module.
PyObject* g_cuda_error_type = nullptr;
PyObject* g_driver_not_found_type = nullptr;

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

std::uint64_t zeroed_device_memory(int device, std::uint64_t bytes) {
  if (bytes == 0 || bytes % 4 != 0) {
    throw py::value_error("alloc_zeroed_for_process: bytes must be a positive multiple of 4, got " +
                          std::to_string(bytes));
  }
  const cu::DriverApi& api = cu::driver();
  py::gil_scoped_release no_gil;
  return launcher::alloc_zeroed_for_process(api, device, static_cast<std::size_t>(bytes));
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
  m.def("alloc_zeroed_for_process", &hl::zeroed_device_memory, py::arg("device"), py::arg("bytes"),
        "`bytes` (a positive multiple of 4) of device memory on `device`, zero when this returns and never freed: "
        "cuMemAlloc in the device's primary context and a memset synchronized on a private stream, with the "
        "calling thread's stream-capture mode relaxed for the call, so that it works inside a CUDA-graph capture "
        "without becoming part of the graph. Returns the device address.");
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
      .def_property_readonly("params_bytes", &hl::PlannedLaunch::params_bytes)
      .def("bind", &hl::PlannedLaunch::bind, py::arg("stream"), py::arg("w"), py::arg("w_scale"),
           py::arg("w_zero_point"), py::arg("ldo"), py::arg("global_scale"),
           "bind(stream, w, w_scale, w_zero_point, ldo, global_scale) -> BoundLaunch: this launch with one weight's "
           "pointers, the output's row stride, the global scale and the stream written, and no workspace; for "
           "kernels without a tensor map (ValueError otherwise). The caller keeps the weight alive.");
  py::class_<hl::BoundLaunch>(m, "BoundLaunch",
                              "A PlannedLaunch bound to one weight and stream (PlannedLaunch.bind): launch(a, bias, "
                              "out, lda) writes the three pointers and the row stride and launches.")
      .def("launch", &hl::BoundLaunch::launch,
           "launch(a, bias, out, lda): pointers as ints (bias 0 for none); asynchronous, on the bound stream.")
      .def("params", &hl::BoundLaunch::params,
           "params(a, bias, out, lda): the Params bytes launch() would pass (needs no driver).")
      .def_property_readonly("stream", &hl::BoundLaunch::stream);
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
