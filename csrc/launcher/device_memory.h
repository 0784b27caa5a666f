#pragma once
// Device memory the launcher owns: buffers that must be zero before a kernel's first use and stay
// allocated for the process (the split-K and stream-K tile counters, which every protocol leaves
// at zero again). Allocated and zeroed outside any CUDA-graph capture, so that a buffer first
// asked for inside a capture is neither part of the graph's memory pool (where an earlier node of
// the graph could write it) nor zeroed only when that graph replays.

#include <cstddef>
#include <cstdint>

#include "cuda_driver.h"

namespace humming_aot::launcher {

// `bytes` (a multiple of 4) of device memory on device `ordinal`, zero when this returns: the
// calling thread's capture mode relaxed for the call, cuMemAlloc in the device's primary context,
// cuMemsetD32Async on a private stream and its synchronization. Never freed. Throws CudaError.
std::uint64_t alloc_zeroed_for_process(const cu::DriverApi& api, int ordinal, std::size_t bytes);

}  // namespace humming_aot::launcher
