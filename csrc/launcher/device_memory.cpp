// Zeroed device memory for the process (see device_memory.h).

#include "device_memory.h"

#include <string>

#include "device_context.h"

namespace humming_aot::launcher {
namespace {

// Restores the thread's capture mode and current context however the call ends.
class Scope {
 public:
  Scope(const cu::DriverApi& api, int ordinal) : api_(api) {
    cu::check(api, api.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent", "device " + std::to_string(ordinal));
    make_primary_context_current(api, ordinal, cu::CUDA_SUCCESS);
    const cu::CUresult exchanged = api.cuThreadExchangeStreamCaptureMode(&mode_);
    if (exchanged != cu::CUDA_SUCCESS) {  // (no destructor runs for a constructor that throws)
      if (previous_ != nullptr) api.cuCtxSetCurrent(previous_);
      cu::check(api, exchanged, "cuThreadExchangeStreamCaptureMode", "relaxed");
    }
  }
  ~Scope() {
    api_.cuThreadExchangeStreamCaptureMode(&mode_);
    if (previous_ != nullptr) api_.cuCtxSetCurrent(previous_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const cu::DriverApi& api_;
  cu::CUcontext previous_ = nullptr;
  cu::CUstreamCaptureMode mode_ = cu::CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace

std::uint64_t alloc_zeroed_for_process(const cu::DriverApi& api, int ordinal, std::size_t bytes) {
  const std::string what = std::to_string(bytes) + " bytes, device " + std::to_string(ordinal);
  Scope scope(api, ordinal);
  cu::CUdeviceptr pointer = 0;
  cu::check(api, api.cuMemAlloc_v2(&pointer, bytes), "cuMemAlloc", what);
  cu::CUstream stream = nullptr;
  const cu::CUresult created = api.cuStreamCreate(&stream, cu::CU_STREAM_NON_BLOCKING);
  const cu::CUresult set = created == cu::CUDA_SUCCESS ? api.cuMemsetD32Async(pointer, 0, bytes / 4, stream) : created;
  const cu::CUresult synced = set == cu::CUDA_SUCCESS ? api.cuStreamSynchronize(stream) : set;
  if (created == cu::CUDA_SUCCESS) api.cuStreamDestroy_v2(stream);
  if (synced != cu::CUDA_SUCCESS) api.cuMemFree_v2(pointer);  // (a failed call leaves nothing behind)
  cu::check(api, created, "cuStreamCreate", what);
  cu::check(api, set, "cuMemsetD32Async", what);
  cu::check(api, synced, "cuStreamSynchronize", what);
  return pointer;
}

}  // namespace humming_aot::launcher
