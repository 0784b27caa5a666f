#pragma once
// Device handles and the calling thread's current context.
// Context-independent libraries (cuLibraryLoadData) need no context to load, but reading a global
// and launching on the null stream use the current one. When a thread has none (a fresh thread, or
// a process where torch has not touched the GPU yet), the device's primary context is made
// current: the same context the CUDA runtime, and therefore torch, uses.

#include "cuda_driver.h"

namespace humming_aot::launcher {

// cuDeviceGet for a device ordinal; throws CudaError (CUDA_ERROR_INVALID_DEVICE) for a bad one.
cu::CUdevice device_handle(const cu::DriverApi& api, int ordinal);

// Cold path of ensure_current_context: retains `ordinal`'s primary context (once per device and
// process, never released, like the runtime) and makes it current on the calling thread.
void make_primary_context_current(const cu::DriverApi& api, int ordinal, cu::CUresult get_current_result);

// Hot path: one cuCtxGetCurrent when the thread already has a current context.
inline void ensure_current_context(const cu::DriverApi& api, int ordinal) {
  cu::CUcontext current = nullptr;
  const cu::CUresult result = api.cuCtxGetCurrent(&current);
  if (result != cu::CUDA_SUCCESS || current == nullptr) {
    make_primary_context_current(api, ordinal, result);
  }
}

}  // namespace humming_aot::launcher
