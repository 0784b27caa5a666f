#pragma once
// HUMMING_AOT_HOST_DEVICE: for plain integer helpers that the kernels use and that the unit tests
// compile with a host C++ compiler (tests/unit/test_packed_codes.py, test_float_codes.py).

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HUMMING_AOT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HUMMING_AOT_HOST_DEVICE inline
#endif
