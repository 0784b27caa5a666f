#pragma once
// Warpgroup-level wgmma.mma_async (SM90a): D[64 x N] += A[64 x 16] * B[16 x N], A from registers
// (same per-warp fragment layout as the A operand of mma.sync m16n8k16, warp w of the warpgroup
// holding rows 16 w .. 16 w + 15), B from shared memory through a matrix descriptor, fp32
// accumulators. Fragment layout of D (PTX ISA, "wgmma 64xNx16 D"): d[4 j + e] holds row
// 16 w + g + 8 (e >> 1), column 8 j + 2 t + (e & 1), with g = lane / 4, t = lane % 4.
//
// The asm statements list every accumulator register, so one wrapper exists per N (8, and the
// multiples of 16 up to 256: the token counts of the TMA body's tiles); the macros below spell
// their operand lists once (an asm statement needs literal strings and constraint
// lists, which templates cannot produce). They are `volatile`: the compiler must not reorder them
// against wgmma fences, commits and waits.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::mma {

// Shared-memory matrix descriptor of a K-major operand stored with the 128-byte swizzle: rows of
// 64 16-bit elements (128 bytes), 8-row core groups 1024 bytes apart, starting at `smem_addr`
// (a 1024-byte-aligned tile base plus a K offset of 32 bytes per 16-element step).
__device__ __forceinline__ u64 k_major_sw128_descriptor(u32 smem_addr) {
  u64 desc = 0;
  desc |= static_cast<u64>((smem_addr & 0x3FFFFu) >> 4);  // start address, bits 0-13
  desc |= static_cast<u64>(1) << 16;                      // leading byte offset: unused for swizzled K-major
  desc |= static_cast<u64>(1024 >> 4) << 32;              // stride byte offset: next 8-row group
  desc |= static_cast<u64>(1) << 62;                      // layout: 128-byte swizzle
  return desc;
}

// Make this thread's earlier shared-memory writes (st.shared, cp.async) visible to wgmma, which
// reads shared memory through the async proxy; a barrier after it publishes them CTA-wide.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Order this thread's register writes (A fragments, accumulators) before later wgmma reads.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Close the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across an in-flight wgmma.
template <int kCount>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void wgmma_fence_operands(int (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Constraints of the accumulators d[i .. i + 3], d[i .. i + 7], d[i .. i + 31] (read and written).
#define HUMMING_AOT_WGMMA_D8(i)                                                                               \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define HUMMING_AOT_WGMMA_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define HUMMING_AOT_WGMMA_D32(i) \
  HUMMING_AOT_WGMMA_D8(i), HUMMING_AOT_WGMMA_D8(i + 8), HUMMING_AOT_WGMMA_D8(i + 16), HUMMING_AOT_WGMMA_D8(i + 24)

// The operand text of an m64nNk16 wgmma with A = N / 2 accumulators: {d...}, {a0..a3}, desc.
#define HUMMING_AOT_WGMMA_OPERANDS_4 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8"
#define HUMMING_AOT_WGMMA_OPERANDS_8 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12"
#define HUMMING_AOT_WGMMA_OPERANDS_12 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16"
#define HUMMING_AOT_WGMMA_OPERANDS_16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20"
#define HUMMING_AOT_WGMMA_OPERANDS_20 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}, {%20, %21, %22, %23}, %24"
#define HUMMING_AOT_WGMMA_OPERANDS_24 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28"
#define HUMMING_AOT_WGMMA_OPERANDS_28 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27}, {%28, %29, %30, %31}, %32"
#define HUMMING_AOT_WGMMA_OPERANDS_32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36"
#define HUMMING_AOT_WGMMA_OPERANDS_36 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40"
#define HUMMING_AOT_WGMMA_OPERANDS_40 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, {%40, %41, %42, %43}, %44"
#define HUMMING_AOT_WGMMA_OPERANDS_44 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43}, {%44, %45, %46, %47}, %48"
#define HUMMING_AOT_WGMMA_OPERANDS_48 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52"
#define HUMMING_AOT_WGMMA_OPERANDS_52 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51}, {%52, %53, %54, %55}, %56"
#define HUMMING_AOT_WGMMA_OPERANDS_56 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, {%56, %57, %58, %59}, %60"
#define HUMMING_AOT_WGMMA_OPERANDS_60 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59}, {%60, %61, %62, %63}, %64"
#define HUMMING_AOT_WGMMA_OPERANDS_64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68"
#define HUMMING_AOT_WGMMA_OPERANDS_72 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, {%72, %73, %74, %75}, %76"
#define HUMMING_AOT_WGMMA_OPERANDS_80 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, {%80, %81, %82, %83}, %84"
#define HUMMING_AOT_WGMMA_OPERANDS_88 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, {%88, %89, %90, %91}, %92"
#define HUMMING_AOT_WGMMA_OPERANDS_96 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100"
#define HUMMING_AOT_WGMMA_OPERANDS_104 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103}, {%104, %105, %106, %107}, %108"
#define HUMMING_AOT_WGMMA_OPERANDS_112 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111}, {%112, %113, %114, %115}, %116"
#define HUMMING_AOT_WGMMA_OPERANDS_120 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119}, {%120, %121, %122, %123}, %124"
#define HUMMING_AOT_WGMMA_OPERANDS_128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132"

// d += a * B(desc) for N = kN and the type suffix TYPE ("bf16.bf16" or "f16.f16"); the trailing
// "1, 1, 1, 0": scale D, no negation of A or B, B not transposed (K-major).
#define HUMMING_AOT_WGMMA(kN, TYPE, OPERANDS, ...)                                                    \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #kN "k16.f32." TYPE " " OPERANDS ", 1, 1, 1, 0;\n" \
               : __VA_ARGS__                                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

// The same for the activation dtype Act: the instruction's type suffix follows it.
#define HUMMING_AOT_WGMMA_FOR_ACT(kN, OPERANDS, ...)           \
  if constexpr (Act::kIsBFloat16) {                            \
    HUMMING_AOT_WGMMA(kN, "bf16.bf16", OPERANDS, __VA_ARGS__); \
  } else {                                                     \
    HUMMING_AOT_WGMMA(kN, "f16.f16", OPERANDS, __VA_ARGS__);   \
  }

template <class Act, int kN>
struct Wgmma;

// One wrapper per N: d[N / 2] += a * B(desc).
#define HUMMING_AOT_WGMMA_WRAPPER(kN, A, OPERANDS, ...)                                      \
  template <class Act>                                                                       \
  struct Wgmma<Act, kN> {                                                                    \
    static constexpr int kAccumulators = A;                                                  \
    static __device__ __forceinline__ void mma(float (&d)[A], const u32 (&a)[4], u64 desc) { \
      HUMMING_AOT_WGMMA_FOR_ACT(kN, OPERANDS, __VA_ARGS__)                                   \
    }                                                                                        \
  };

HUMMING_AOT_WGMMA_WRAPPER(8, 4, HUMMING_AOT_WGMMA_OPERANDS_4, HUMMING_AOT_WGMMA_D4(0))
HUMMING_AOT_WGMMA_WRAPPER(16, 8, HUMMING_AOT_WGMMA_OPERANDS_8, HUMMING_AOT_WGMMA_D8(0))
HUMMING_AOT_WGMMA_WRAPPER(24, 12, HUMMING_AOT_WGMMA_OPERANDS_12, HUMMING_AOT_WGMMA_D8(0), HUMMING_AOT_WGMMA_D4(8))
HUMMING_AOT_WGMMA_WRAPPER(32, 16, HUMMING_AOT_WGMMA_OPERANDS_16, HUMMING_AOT_WGMMA_D8(0), HUMMING_AOT_WGMMA_D8(8))
HUMMING_AOT_WGMMA_WRAPPER(40, 20, HUMMING_AOT_WGMMA_OPERANDS_20, HUMMING_AOT_WGMMA_D8(0), HUMMING_AOT_WGMMA_D8(8),
                          HUMMING_AOT_WGMMA_D4(16))
HUMMING_AOT_WGMMA_WRAPPER(48, 24, HUMMING_AOT_WGMMA_OPERANDS_24, HUMMING_AOT_WGMMA_D8(0), HUMMING_AOT_WGMMA_D8(8),
                          HUMMING_AOT_WGMMA_D8(16))
HUMMING_AOT_WGMMA_WRAPPER(56, 28, HUMMING_AOT_WGMMA_OPERANDS_28, HUMMING_AOT_WGMMA_D8(0), HUMMING_AOT_WGMMA_D8(8),
                          HUMMING_AOT_WGMMA_D8(16), HUMMING_AOT_WGMMA_D4(24))
HUMMING_AOT_WGMMA_WRAPPER(64, 32, HUMMING_AOT_WGMMA_OPERANDS_32, HUMMING_AOT_WGMMA_D32(0))
HUMMING_AOT_WGMMA_WRAPPER(72, 36, HUMMING_AOT_WGMMA_OPERANDS_36, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D4(32))
HUMMING_AOT_WGMMA_WRAPPER(80, 40, HUMMING_AOT_WGMMA_OPERANDS_40, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32))
HUMMING_AOT_WGMMA_WRAPPER(88, 44, HUMMING_AOT_WGMMA_OPERANDS_44, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32),
                          HUMMING_AOT_WGMMA_D4(40))
HUMMING_AOT_WGMMA_WRAPPER(96, 48, HUMMING_AOT_WGMMA_OPERANDS_48, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32),
                          HUMMING_AOT_WGMMA_D8(40))
HUMMING_AOT_WGMMA_WRAPPER(104, 52, HUMMING_AOT_WGMMA_OPERANDS_52, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32),
                          HUMMING_AOT_WGMMA_D8(40), HUMMING_AOT_WGMMA_D4(48))
HUMMING_AOT_WGMMA_WRAPPER(112, 56, HUMMING_AOT_WGMMA_OPERANDS_56, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32),
                          HUMMING_AOT_WGMMA_D8(40), HUMMING_AOT_WGMMA_D8(48))
HUMMING_AOT_WGMMA_WRAPPER(120, 60, HUMMING_AOT_WGMMA_OPERANDS_60, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D8(32),
                          HUMMING_AOT_WGMMA_D8(40), HUMMING_AOT_WGMMA_D8(48), HUMMING_AOT_WGMMA_D4(56))
HUMMING_AOT_WGMMA_WRAPPER(128, 64, HUMMING_AOT_WGMMA_OPERANDS_64, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32))
HUMMING_AOT_WGMMA_WRAPPER(144, 72, HUMMING_AOT_WGMMA_OPERANDS_72, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D8(64))
HUMMING_AOT_WGMMA_WRAPPER(160, 80, HUMMING_AOT_WGMMA_OPERANDS_80, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D8(64), HUMMING_AOT_WGMMA_D8(72))
HUMMING_AOT_WGMMA_WRAPPER(176, 88, HUMMING_AOT_WGMMA_OPERANDS_88, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D8(64), HUMMING_AOT_WGMMA_D8(72), HUMMING_AOT_WGMMA_D8(80))
HUMMING_AOT_WGMMA_WRAPPER(192, 96, HUMMING_AOT_WGMMA_OPERANDS_96, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D32(64))
HUMMING_AOT_WGMMA_WRAPPER(208, 104, HUMMING_AOT_WGMMA_OPERANDS_104, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D32(64), HUMMING_AOT_WGMMA_D8(96))
HUMMING_AOT_WGMMA_WRAPPER(224, 112, HUMMING_AOT_WGMMA_OPERANDS_112, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D32(64), HUMMING_AOT_WGMMA_D8(96), HUMMING_AOT_WGMMA_D8(104))
HUMMING_AOT_WGMMA_WRAPPER(240, 120, HUMMING_AOT_WGMMA_OPERANDS_120, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D32(64), HUMMING_AOT_WGMMA_D8(96), HUMMING_AOT_WGMMA_D8(104),
                          HUMMING_AOT_WGMMA_D8(112))
HUMMING_AOT_WGMMA_WRAPPER(256, 128, HUMMING_AOT_WGMMA_OPERANDS_128, HUMMING_AOT_WGMMA_D32(0), HUMMING_AOT_WGMMA_D32(32),
                          HUMMING_AOT_WGMMA_D32(64), HUMMING_AOT_WGMMA_D32(96))

#undef HUMMING_AOT_WGMMA_WRAPPER
#undef HUMMING_AOT_WGMMA_FOR_ACT
#undef HUMMING_AOT_WGMMA
#undef HUMMING_AOT_WGMMA_OPERANDS_4
#undef HUMMING_AOT_WGMMA_OPERANDS_8
#undef HUMMING_AOT_WGMMA_OPERANDS_12
#undef HUMMING_AOT_WGMMA_OPERANDS_16
#undef HUMMING_AOT_WGMMA_OPERANDS_20
#undef HUMMING_AOT_WGMMA_OPERANDS_24
#undef HUMMING_AOT_WGMMA_OPERANDS_28
#undef HUMMING_AOT_WGMMA_OPERANDS_32
#undef HUMMING_AOT_WGMMA_OPERANDS_36
#undef HUMMING_AOT_WGMMA_OPERANDS_40
#undef HUMMING_AOT_WGMMA_OPERANDS_44
#undef HUMMING_AOT_WGMMA_OPERANDS_48
#undef HUMMING_AOT_WGMMA_OPERANDS_52
#undef HUMMING_AOT_WGMMA_OPERANDS_56
#undef HUMMING_AOT_WGMMA_OPERANDS_60
#undef HUMMING_AOT_WGMMA_OPERANDS_64
#undef HUMMING_AOT_WGMMA_OPERANDS_72
#undef HUMMING_AOT_WGMMA_OPERANDS_80
#undef HUMMING_AOT_WGMMA_OPERANDS_88
#undef HUMMING_AOT_WGMMA_OPERANDS_96
#undef HUMMING_AOT_WGMMA_OPERANDS_104
#undef HUMMING_AOT_WGMMA_OPERANDS_112
#undef HUMMING_AOT_WGMMA_OPERANDS_120
#undef HUMMING_AOT_WGMMA_OPERANDS_128
#undef HUMMING_AOT_WGMMA_D32
#undef HUMMING_AOT_WGMMA_D8
#undef HUMMING_AOT_WGMMA_D4

}  // namespace humming_aot::mma
