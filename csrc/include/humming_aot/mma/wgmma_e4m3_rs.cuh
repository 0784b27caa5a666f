#pragma once
// Warpgroup-level wgmma.mma_async with 8-bit float inputs and A from registers (SM90a):
// D[64 x N] (+)= A[64 x 32] * B[32 x N], A and B e4m3. A is this thread's four registers of four
// codes each (the 8-bit A fragment: warp w of the warpgroup holds rows 16 w .. 16 w + 15; a[0] row
// g, K 4 t .. 4 t + 3; a[1] row g + 8, the same K; a[2] and a[3] the same rows at K + 16; g = lane
// / 4, t = lane % 4); B is K-major with the 128-byte swizzle, through a matrix descriptor
// (mma::k_major_sw128_descriptor: a K step of 32 codes is 32 bytes, 2 in its address field). The
// accumulator layout is that of every m64nN wgmma (mma/wgmma.cuh). `accumulate` false overwrites D
// with the product (the scale-d predicate), so that a promotion's scratch set needs no zeroing.
// The caller must not write a[] again until the wgmma that read it has completed (wait_group).
// One wrapper per N: the operand lists are spelled out (asm needs literal text). `volatile`:
// never reordered against the wgmma fences, commits and waits.

#include <humming_aot/mma/wgmma.cuh>

namespace humming_aot::mma {

template <int kN>
struct WgmmaE4m3Rs;

// Constraints of the accumulators d[i .. i + 3] and d[i .. i + 7] (read and written).
#define HUMMING_AOT_RS_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define HUMMING_AOT_RS_D8(i) HUMMING_AOT_RS_D4(i), HUMMING_AOT_RS_D4(i + 4)

template <>
struct WgmmaE4m3Rs<8> {
  static constexpr int kAccumulators = 4;
  static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D4(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<16> {
  static constexpr int kAccumulators = 8;
  static __device__ __forceinline__ void mma(float (&d)[8], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<32> {
  static constexpr int kAccumulators = 16;
  static __device__ __forceinline__ void mma(float (&d)[16], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<64> {
  static constexpr int kAccumulators = 32;
  static __device__ __forceinline__ void mma(float (&d)[32], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8), HUMMING_AOT_RS_D8(16), HUMMING_AOT_RS_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<96> {
  static constexpr int kAccumulators = 48;
  static __device__ __forceinline__ void mma(float (&d)[48], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8), HUMMING_AOT_RS_D8(16), HUMMING_AOT_RS_D8(24),
          HUMMING_AOT_RS_D8(32), HUMMING_AOT_RS_D8(40)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<128> {
  static constexpr int kAccumulators = 64;
  static __device__ __forceinline__ void mma(float (&d)[64], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8), HUMMING_AOT_RS_D8(16), HUMMING_AOT_RS_D8(24),
          HUMMING_AOT_RS_D8(32), HUMMING_AOT_RS_D8(40), HUMMING_AOT_RS_D8(48), HUMMING_AOT_RS_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<160> {
  static constexpr int kAccumulators = 80;
  static __device__ __forceinline__ void mma(float (&d)[80], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, {%80, %81, %82, %83}, %84, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8), HUMMING_AOT_RS_D8(16), HUMMING_AOT_RS_D8(24),
          HUMMING_AOT_RS_D8(32), HUMMING_AOT_RS_D8(40), HUMMING_AOT_RS_D8(48), HUMMING_AOT_RS_D8(56),
          HUMMING_AOT_RS_D8(64), HUMMING_AOT_RS_D8(72)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

template <>
struct WgmmaE4m3Rs<192> {
  static constexpr int kAccumulators = 96;
  static __device__ __forceinline__ void mma(float (&d)[96], const u32 (&a)[4], u64 desc_b, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100, p, 1, 1;\n}\n"
        : HUMMING_AOT_RS_D8(0), HUMMING_AOT_RS_D8(8), HUMMING_AOT_RS_D8(16), HUMMING_AOT_RS_D8(24),
          HUMMING_AOT_RS_D8(32), HUMMING_AOT_RS_D8(40), HUMMING_AOT_RS_D8(48), HUMMING_AOT_RS_D8(56),
          HUMMING_AOT_RS_D8(64), HUMMING_AOT_RS_D8(72), HUMMING_AOT_RS_D8(80), HUMMING_AOT_RS_D8(88)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

#undef HUMMING_AOT_RS_D8
#undef HUMMING_AOT_RS_D4

}  // namespace humming_aot::mma
