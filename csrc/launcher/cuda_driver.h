#pragma once
// The slice of the CUDA driver API that the launcher uses, declared here instead of including
// <cuda.h> so that the extension builds without a CUDA toolkit and imports without a driver.
// libcuda.so.1 is dlopen'ed on first use (once per process, thread-safe); every failure becomes a
// C++ exception that module.cpp turns into humming_aot._C.CudaError / DriverNotFoundError.
// Invariant: the enum values and type sizes below equal <cuda.h>'s (tests/unit/test_launcher.py
// compiles a static_assert check against the toolkit's header when one is installed).

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace humming_aot::launcher::cu {

// ---- Types (ABI of the public driver API, CUDA 12.0+) ----

enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
};

enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

enum CUfunction_attribute : int {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
  CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

// Only passed as null arrays: the launcher uses no JIT or library-load options.
enum CUjit_option : int {};
enum CUlibraryOption : int {};

using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOTE: 64-bit on every platform the driver supports
using CUcontext = struct CUctx_st*;
using CUlibrary = struct CUlib_st*;
using CUkernel = struct CUkern_st*;
using CUfunction = struct CUfunc_st*;  // a CUkernel may be passed where a CUfunction is expected
using CUstream = struct CUstream_st*;
enum CUstream_flags : unsigned int { CU_STREAM_NON_BLOCKING = 1 };
// A thread's stream-capture interaction mode: relaxed lets it make calls that a global-mode
// capture (torch's default) forbids, such as cuMemAlloc.
enum CUstreamCaptureMode : int { CU_STREAM_CAPTURE_MODE_RELAXED = 2 };

// cuLaunchKernelEx's configuration. Only the attributes the launcher sets are declared; the
// driver reads every attribute as an (id, 64-byte value) record, whatever the id.
enum CUlaunchAttributeID : int {
  // value.clusterDim: the grid is tiled into thread-block clusters of this shape (sm_90+), whose
  // CTAs run together on one GPC and share their shared memory.
  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
  // value.clusterSchedulingPolicyPreference: how the clusters are placed on the GPCs
  CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
  // value.programmaticStreamSerializationAllowed = 1: the kernel may start before the previous
  // kernel in its stream has finished (Programmatic Dependent Launch, sm_90+); it must execute
  // griddepcontrol.wait before touching memory that kernel writes.
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

enum CUclusterSchedulingPolicy : int {
  CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING = 2,  // fill the GPCs evenly (the default spreads)
};

// alignas(8): <cuda.h>'s union also holds pointer and 64-bit members.
union alignas(8) CUlaunchAttributeValue {
  char pad[64];
  struct {
    unsigned int x;
    unsigned int y;
    unsigned int z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
  CUclusterSchedulingPolicy clusterSchedulingPolicyPreference;
};

struct CUlaunchAttribute {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
};

struct CUlaunchConfig {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;  // dynamic shared memory per block, in bytes
  CUstream hStream;
  CUlaunchAttribute* attrs;  // numAttrs records; may be null when numAttrs is 0
  unsigned int numAttrs;
};

// The driver reads these records by <cuda.h>'s layout (LP64, the only ABI libcuda.so.1 ships for).
static_assert(sizeof(CUlaunchAttributeValue) == 64 && alignof(CUlaunchAttributeValue) == 8,
              "CUlaunchAttributeValue is <cuda.h>'s 64-byte, 8-byte aligned union");
static_assert(offsetof(CUlaunchAttribute, value) == 8 && sizeof(CUlaunchAttribute) == 72,
              "CUlaunchAttribute is a 4-byte id, 4 bytes of padding and the 64-byte value");
static_assert(offsetof(CUlaunchConfig, hStream) == 32 && offsetof(CUlaunchConfig, attrs) == 40 &&
                  offsetof(CUlaunchConfig, numAttrs) == 48 && sizeof(CUlaunchConfig) == 56,
              "CUlaunchConfig is seven unsigned ints, then the stream, attrs and numAttrs at 8-byte alignment");

// ---- Entry points (exported names; the _v2 suffix where the driver exports one) ----

using PFN_cuGetErrorName = CUresult (*)(CUresult error, const char** name);
using PFN_cuGetErrorString = CUresult (*)(CUresult error, const char** text);
using PFN_cuInit = CUresult (*)(unsigned int flags);
using PFN_cuDriverGetVersion = CUresult (*)(int* version);
using PFN_cuDeviceGet = CUresult (*)(CUdevice* device, int ordinal);
using PFN_cuDeviceGetAttribute = CUresult (*)(int* value, CUdevice_attribute attribute, CUdevice device);
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext* context, CUdevice device);
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext* context);
using PFN_cuCtxSetCurrent = CUresult (*)(CUcontext context);
using PFN_cuLibraryLoadData = CUresult (*)(CUlibrary* library, const void* image, CUjit_option* jit_options,
                                           void** jit_option_values, unsigned int num_jit_options,
                                           CUlibraryOption* library_options, void** library_option_values,
                                           unsigned int num_library_options);
using PFN_cuLibraryUnload = CUresult (*)(CUlibrary library);
using PFN_cuLibraryGetKernel = CUresult (*)(CUkernel* kernel, CUlibrary library, const char* name);
using PFN_cuLibraryGetGlobal = CUresult (*)(CUdeviceptr* pointer, std::size_t* bytes, CUlibrary library,
                                            const char* name);
using PFN_cuKernelSetAttribute = CUresult (*)(CUfunction_attribute attribute, int value, CUkernel kernel,
                                              CUdevice device);
using PFN_cuKernelGetAttribute = CUresult (*)(int* value, CUfunction_attribute attribute, CUkernel kernel,
                                              CUdevice device);
using PFN_cuLaunchKernel = CUresult (*)(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                                        unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                                        unsigned int block_z, unsigned int dynamic_smem_bytes, CUstream stream,
                                        void** kernel_params, void** extra);
using PFN_cuLaunchKernelEx = CUresult (*)(const CUlaunchConfig* config, CUfunction function, void** kernel_params,
                                          void** extra);
using PFN_cuMemcpyDtoH_v2 = CUresult (*)(void* host, CUdeviceptr device, std::size_t bytes);
using PFN_cuMemAlloc_v2 = CUresult (*)(CUdeviceptr* pointer, std::size_t bytes);
using PFN_cuMemFree_v2 = CUresult (*)(CUdeviceptr pointer);
using PFN_cuMemsetD32Async = CUresult (*)(CUdeviceptr pointer, unsigned int value, std::size_t count, CUstream stream);
using PFN_cuStreamCreate = CUresult (*)(CUstream* stream, unsigned int flags);
using PFN_cuStreamSynchronize = CUresult (*)(CUstream stream);
using PFN_cuStreamDestroy_v2 = CUresult (*)(CUstream stream);
using PFN_cuThreadExchangeStreamCaptureMode = CUresult (*)(CUstreamCaptureMode* mode);
using PFN_cuKernelGetFunction = CUresult (*)(CUfunction* function, CUkernel kernel);
using PFN_cuOccupancyMaxActiveClusters = CUresult (*)(int* clusters, CUfunction function, const CUlaunchConfig* config);

// TMA descriptors (CUDA 12.0+, sm_90+ devices). The map is opaque: 128 bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};
static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is <cuda.h>'s 128-byte opaque struct");
enum CUtensorMapDataType : int { CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1 };
enum CUtensorMapInterleave : int { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle : int { CU_TENSOR_MAP_SWIZZLE_128B = 3 };
enum CUtensorMapL2promotion : int { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum CUtensorMapFloatOOBfill : int { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };  // out-of-bounds elements read as 0
using PFN_cuTensorMapEncodeTiled = CUresult (*)(CUtensorMap* map, CUtensorMapDataType data_type, unsigned int rank,
                                                void* global_address, const unsigned long long* global_dims,
                                                const unsigned long long* global_strides, const unsigned int* box_dims,
                                                const unsigned int* element_strides, CUtensorMapInterleave interleave,
                                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                                CUtensorMapFloatOOBfill oob_fill);

// Resolved entry points. Every member is non-null once driver() returned, except those marked optional.
struct DriverApi {
  PFN_cuGetErrorName cuGetErrorName;
  PFN_cuGetErrorString cuGetErrorString;
  PFN_cuInit cuInit;
  PFN_cuDriverGetVersion cuDriverGetVersion;
  PFN_cuDeviceGet cuDeviceGet;
  PFN_cuDeviceGetAttribute cuDeviceGetAttribute;
  PFN_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain;
  PFN_cuCtxGetCurrent cuCtxGetCurrent;
  PFN_cuCtxSetCurrent cuCtxSetCurrent;
  PFN_cuLibraryLoadData cuLibraryLoadData;
  PFN_cuLibraryUnload cuLibraryUnload;
  PFN_cuLibraryGetKernel cuLibraryGetKernel;
  PFN_cuLibraryGetGlobal cuLibraryGetGlobal;
  PFN_cuKernelSetAttribute cuKernelSetAttribute;
  PFN_cuKernelGetAttribute cuKernelGetAttribute;
  PFN_cuLaunchKernel cuLaunchKernel;
  PFN_cuMemcpyDtoH_v2 cuMemcpyDtoH_v2;
  PFN_cuMemAlloc_v2 cuMemAlloc_v2;
  PFN_cuMemFree_v2 cuMemFree_v2;
  PFN_cuMemsetD32Async cuMemsetD32Async;
  PFN_cuStreamCreate cuStreamCreate;
  PFN_cuStreamSynchronize cuStreamSynchronize;
  PFN_cuStreamDestroy_v2 cuStreamDestroy_v2;
  PFN_cuThreadExchangeStreamCaptureMode cuThreadExchangeStreamCaptureMode;
  // Optional (null when the driver lacks it): only Programmatic Dependent Launch needs it, and that is
  // an overlap optimization, so its absence degrades to cuLaunchKernel instead of refusing the driver.
  PFN_cuLaunchKernelEx cuLaunchKernelEx;
  // Optional: only the TMA kernel bodies need it (humming_aot._C.encode_tensor_map_2d says so when absent).
  PFN_cuTensorMapEncodeTiled cuTensorMapEncodeTiled;
  // Optional (CUDA 12.0+ drivers): how many clusters of a launch fit on the device at once
  // (humming_aot._C.max_active_clusters returns 0 when absent).
  PFN_cuKernelGetFunction cuKernelGetFunction;
  PFN_cuOccupancyMaxActiveClusters cuOccupancyMaxActiveClusters;
};

// ---- Errors ----

// A driver call returned something other than CUDA_SUCCESS.
// what(): "<call>(<context>): <CUDA_ERROR_NAME> (<driver's description>)".
class CudaError : public std::runtime_error {
 public:
  CudaError(CUresult code, std::string error_name, const std::string& message)
      : std::runtime_error(message), code_(code), error_name_(std::move(error_name)) {}
  CUresult code() const noexcept { return code_; }
  const std::string& error_name() const noexcept { return error_name_; }

 private:
  CUresult code_;
  std::string error_name_;
};

// libcuda.so.1 could not be loaded, or it lacks an entry point the launcher needs.
class DriverNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- Access ----

// The loaded and initialised (cuInit) driver. Throws DriverNotFound, or CudaError when cuInit failed.
const DriverApi& driver();

// cuDriverGetVersion of the loaded driver (e.g. 13000; 0 if it would not say). Needs no device, so it
// also works where cuInit failed. Throws DriverNotFound when libcuda.so.1 cannot be loaded.
int driver_version();

// Whether driver() would succeed. Loads the driver on first call; never throws.
bool driver_available() noexcept;

// Whether driver() would succeed and its cuLaunchKernelEx is resolved, so that a launch can ask for
// Programmatic Dependent Launch (the device must also be sm_90+). Never throws.
bool programmatic_launch_available() noexcept;

// Why driver() would fail ("" when it would not). Never throws.
std::string driver_unavailable_reason();

// Throws CudaError for `result`, naming the call and its context (e.g. "kernel gemm_dense_...").
[[noreturn]] void throw_cuda_error(const DriverApi& api, CUresult result, const char* call, const std::string& context);

// Cold-path check: throws CudaError unless `result` is CUDA_SUCCESS.
inline void check(const DriverApi& api, CUresult result, const char* call, const std::string& context) {
  if (result != CUDA_SUCCESS) {
    throw_cuda_error(api, result, call, context);
  }
}

}  // namespace humming_aot::launcher::cu
