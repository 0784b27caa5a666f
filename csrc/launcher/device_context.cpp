// Primary-context bookkeeping for ensure_current_context (see device_context.h).

#include "device_context.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace humming_aot::launcher {
namespace {

std::string device_text(int ordinal) { return "device " + std::to_string(ordinal); }

}  // namespace

cu::CUdevice device_handle(const cu::DriverApi& api, int ordinal) {
  cu::CUdevice device = 0;
  cu::check(api, api.cuDeviceGet(&device, ordinal), "cuDeviceGet", device_text(ordinal));
  return device;
}

void make_primary_context_current(const cu::DriverApi& api, int ordinal, cu::CUresult get_current_result) {
  cu::check(api, get_current_result, "cuCtxGetCurrent", device_text(ordinal));
  // Retain each device's primary context once: retaining on every thread that lacks a current
  // context would only grow its reference count.
  static std::mutex mutex;
  static std::unordered_map<int, cu::CUcontext> primary_contexts;
  cu::CUcontext context = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = primary_contexts.find(ordinal);
    if (found != primary_contexts.end()) {
      context = found->second;
    } else {
      const cu::CUdevice device = device_handle(api, ordinal);
      cu::check(api, api.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", device_text(ordinal));
      primary_contexts.emplace(ordinal, context);
    }
  }
  cu::check(api, api.cuCtxSetCurrent(context), "cuCtxSetCurrent", device_text(ordinal) + " primary context");
}

}  // namespace humming_aot::launcher
