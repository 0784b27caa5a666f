// Loads libcuda.so.1 on first use and resolves the entry points declared in cuda_driver.h.
// Why dlopen instead of linking -lcuda: `import humming_aot._C` must work on machines without a
// driver (CI, CPU-only integrations); only the first real CUDA call needs one.

#include "cuda_driver.h"

#include <dlfcn.h>

#include <string>

namespace humming_aot::launcher::cu {
namespace {

constexpr const char* kDriverLibrary = "libcuda.so.1";

enum class DriverStatus {
  kReady,       // loaded, every entry point resolved, cuInit(0) succeeded
  kNotFound,    // dlopen failed
  kTooOld,      // loaded, but an entry point is missing (a driver older than CUDA 12.0)
  kInitFailed,  // loaded, but cuInit(0) failed (no device, stub library, ...)
};

struct DriverState {
  DriverStatus status = DriverStatus::kNotFound;
  DriverApi api{};
  int version = 0;                      // cuDriverGetVersion, e.g. 13000; 0 when unknown
  CUresult init_result = CUDA_SUCCESS;  // what cuInit returned when status is kInitFailed
  std::string reason;                   // why driver() fails; empty when kReady
};

template <typename Fn>
void resolve(void* handle, const char* name, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(handle, name));
  if (slot == nullptr) {
    missing += missing.empty() ? name : std::string(", ") + name;
  }
}

// 12040 -> "12.4"
std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string error_name(const DriverApi& api, CUresult result) {
  const char* name = nullptr;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

std::string error_message(const DriverApi& api, CUresult result, const char* call, const std::string& context) {
  const char* text = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(result, &text) != CUDA_SUCCESS || text == nullptr) {
    text = "the driver has no description for this code";
  }
  std::string message = call;
  if (!context.empty()) {
    message += "(" + context + ")";
  }
  return message + ": " + error_name(api, result) + " (" + text + ")";
}

DriverState load_driver() {
  DriverState state;
  dlerror();  // clear any stale error so the one reported below is dlopen's
  void* handle = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    state.reason = std::string("no NVIDIA driver was found: dlopen(\"") + kDriverLibrary +
                   "\") failed: " + (error != nullptr ? error : "unknown error") +
                   ". Install the NVIDIA driver, or make its libcuda.so.1 visible to the dynamic loader "
                   "(ldconfig or LD_LIBRARY_PATH; in a container, start it with the NVIDIA container "
                   "runtime, e.g. --gpus all). CPU tensors need no driver.";
    return state;
  }
  // The handle is never closed: kernels, libraries and function pointers live as long as the process.
  DriverApi& api = state.api;
  std::string missing;
  resolve(handle, "cuGetErrorName", api.cuGetErrorName, missing);
  resolve(handle, "cuGetErrorString", api.cuGetErrorString, missing);
  resolve(handle, "cuInit", api.cuInit, missing);
  resolve(handle, "cuDriverGetVersion", api.cuDriverGetVersion, missing);
  resolve(handle, "cuDeviceGet", api.cuDeviceGet, missing);
  resolve(handle, "cuDeviceGetAttribute", api.cuDeviceGetAttribute, missing);
  resolve(handle, "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain, missing);
  resolve(handle, "cuCtxGetCurrent", api.cuCtxGetCurrent, missing);
  resolve(handle, "cuCtxSetCurrent", api.cuCtxSetCurrent, missing);
  resolve(handle, "cuLibraryLoadData", api.cuLibraryLoadData, missing);
  resolve(handle, "cuLibraryUnload", api.cuLibraryUnload, missing);
  resolve(handle, "cuLibraryGetKernel", api.cuLibraryGetKernel, missing);
  resolve(handle, "cuLibraryGetGlobal", api.cuLibraryGetGlobal, missing);
  resolve(handle, "cuKernelSetAttribute", api.cuKernelSetAttribute, missing);
  resolve(handle, "cuKernelGetAttribute", api.cuKernelGetAttribute, missing);
  resolve(handle, "cuLaunchKernel", api.cuLaunchKernel, missing);
  resolve(handle, "cuMemcpyDtoH_v2", api.cuMemcpyDtoH_v2, missing);
  resolve(handle, "cuMemAlloc_v2", api.cuMemAlloc_v2, missing);
  resolve(handle, "cuMemFree_v2", api.cuMemFree_v2, missing);
  resolve(handle, "cuMemsetD32Async", api.cuMemsetD32Async, missing);
  resolve(handle, "cuStreamCreate", api.cuStreamCreate, missing);
  resolve(handle, "cuStreamSynchronize", api.cuStreamSynchronize, missing);
  resolve(handle, "cuStreamDestroy_v2", api.cuStreamDestroy_v2, missing);
  resolve(handle, "cuThreadExchangeStreamCaptureMode", api.cuThreadExchangeStreamCaptureMode, missing);
  api.cuLaunchKernelEx = reinterpret_cast<PFN_cuLaunchKernelEx>(dlsym(handle, "cuLaunchKernelEx"));  // optional
  api.cuTensorMapEncodeTiled =
      reinterpret_cast<PFN_cuTensorMapEncodeTiled>(dlsym(handle, "cuTensorMapEncodeTiled"));  // optional
  api.cuKernelGetFunction = reinterpret_cast<PFN_cuKernelGetFunction>(dlsym(handle, "cuKernelGetFunction"));
  api.cuOccupancyMaxActiveClusters =  // optional, with cuKernelGetFunction
      reinterpret_cast<PFN_cuOccupancyMaxActiveClusters>(dlsym(handle, "cuOccupancyMaxActiveClusters"));

  if (api.cuDriverGetVersion != nullptr && api.cuDriverGetVersion(&state.version) != CUDA_SUCCESS) {
    state.version = 0;
  }
  if (!missing.empty()) {
    state.status = DriverStatus::kTooOld;
    state.reason = std::string("no usable NVIDIA driver was found: ") + kDriverLibrary + " (" +
                   (state.version > 0 ? "a driver for CUDA " + version_text(state.version) : "unknown version") +
                   ") lacks " + missing +
                   "; humming_aot needs a driver for CUDA 12.0 or newer: update the NVIDIA driver";
    return state;
  }
  const CUresult init = api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    state.status = DriverStatus::kInitFailed;
    state.init_result = init;
    state.reason = error_message(api, init, "cuInit", "0");
    return state;
  }
  state.status = DriverStatus::kReady;
  return state;
}

const DriverState& driver_state() {
  // C++11 initialises a function-local static exactly once, even with concurrent callers.
  static const DriverState state = load_driver();
  return state;
}

}  // namespace

const DriverApi& driver() {
  const DriverState& state = driver_state();
  switch (state.status) {
    case DriverStatus::kReady:
      return state.api;
    case DriverStatus::kInitFailed:
      throw CudaError(state.init_result, error_name(state.api, state.init_result), state.reason);
    default:
      throw DriverNotFound(state.reason);
  }
}

int driver_version() {
  const DriverState& state = driver_state();
  if (state.status == DriverStatus::kNotFound) {
    throw DriverNotFound(state.reason);
  }
  return state.version;
}

bool driver_available() noexcept {
  try {
    return driver_state().status == DriverStatus::kReady;
  } catch (...) {  // only std::bad_alloc while building the state
    return false;
  }
}

bool programmatic_launch_available() noexcept {
  try {
    const DriverState& state = driver_state();
    return state.status == DriverStatus::kReady && state.api.cuLaunchKernelEx != nullptr;
  } catch (...) {  // only std::bad_alloc while building the state
    return false;
  }
}

std::string driver_unavailable_reason() { return driver_state().reason; }

void throw_cuda_error(const DriverApi& api, CUresult result, const char* call, const std::string& context) {
  throw CudaError(result, error_name(api, result), error_message(api, result, call, context));
}

}  // namespace humming_aot::launcher::cu
