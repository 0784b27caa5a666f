#pragma once
// Warp-level mma.sync m16n8k32 on 8-bit codes, both operands from registers: s8 x s8 into exact
// int32 sums (SM80+), e4m3 x e4m3 into fp32 (SM89+); and m16n8k64 on s4 codes, two to a byte
// (SM80-SM89 natively; later arches' ptxas emulates it on s8 mma). The operand traits of the
// portable W8A8 / W4A4 body (kernel/dense_mma_ss.cuh); the wgmma ones are mma/wgmma_s8.cuh and
// mma/wgmma_e4m3.cuh.
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32", .row.col), g = lane / 4, t = lane % 4:
// A: a[0] (row g, k 4t..4t+3), a[1] (row g + 8, same k), a[2] (row g, k 16 + 4t..), a[3] (row g + 8,
// k 16 + 4t..); B: b[0] (k 4t..4t+3, column g), b[1] (k 16 + 4t.., column g); C: c[0..1] (row g,
// columns 2t, 2t + 1), c[2..3] (row g + 8).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::mma {

// s8 codes: exact int32 sums (the W8A8 pack bounds K so that no sum overflows).
struct S8SyncCodes {
  using Sum = int;
  static constexpr bool kExactSums = true;

  // Not volatile: a pure register operation (as mma/mma_sync.cuh's).
  static __device__ __forceinline__ void mma(Sum (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// s4 codes, two to a byte (the lower K in the low nibble): the fragments of m16n8k64 are those of
// m16n8k32 above in bytes, so the body stages and loads bytes alike and a K step of 32 bytes is
// 64 codes. Exact int32 sums (|products| <= 64: no K a GPU holds overflows them).
struct S4SyncCodes {
  using Sum = int;
  static constexpr bool kExactSums = true;

  static __device__ __forceinline__ void mma(Sum (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// e4m3 codes: fp32 sums. NOTE: the fp8 tensor cores of SM89/SM90 keep fewer bits than fp32 in a
// running sum, so the body adds each K tile's sums into separate fp32 accumulators (kExactSums
// false: its promotion).
struct E4m3SyncCodes {
  using Sum = float;
  static constexpr bool kExactSums = false;

  static __device__ __forceinline__ void mma(Sum (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

}  // namespace humming_aot::mma
