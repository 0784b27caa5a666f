#pragma once
// int4 weight codes (-8 .. 7) of W4A8's packed layout (version 2, humming_aot.w4a8) -> s8 codes of
// the same values, eight at a time, for the portable W4A8 body's int8 x int8 mma
// (kernel/dense_mma_w4a8.cuh; numerics/int4_e4m3.cuh makes e4m3 bytes of the same words).
//
// A stored code is a sign s and three bits m: v = m (s = 0) or v = -(m + 1) = ~m (s = 1). With m in
// bits 0-2 of a byte and s in bit 7 (b = 0x80 | m when negative), the s8 byte of v is b ^ 0x7F
// for s = 1 (0x80 | m | 0x78 with m's bits flipped: 0xF8 | (7 - m) = ~m) and b for s = 0. So
// byte = b ^ (t - (t >> 7)), t = b & 0x80: 0x80 - 1 = 0x7F where the sign is set, 0 elsewhere,
// with no borrow between bytes. The high codes of a word are laid out as int4_e4m3.cuh says: a
// rotation by 4 bits brings them where the low ones were.
// Cost: 9 instructions per 8 codes (a rotation, then per four codes 2 LOP3, a shift, a subtract).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct Int4ToS8 {
  static constexpr u32 kCode = 0x87878787u;  // a code's bits in each byte: m in bits 0-2, the sign in 7
  static constexpr u32 kSign = 0x80808080u;
  static constexpr float kValueScale = 1.f;    // the s8 bytes are the values themselves
  static constexpr bool kS8Bytes = true;       // s8 bytes (int8 activations) rather than e4m3 ones
  static constexpr int kEntryBytes = 4;        // a channel's per-K-tile entry: its group's fp32 scale
  static constexpr bool kGroupTables = false;  // (numerics/e2m1_e4m3.cuh builds tables per group of 32)
  static constexpr bool kSpans = false;        // a promotion per K tile (numerics/e2m1_e4m3.cuh: spans)

  // Four s8 bytes from four codes, one a byte (bits 0-2 and 7).
  static __device__ __forceinline__ u32 bytes(u32 word) {
    const u32 sign = word & kSign;
    return (word & kCode) ^ (sign - (sign >> 7));
  }

  // Eight codes into two registers of four s8 codes (the layout of Int4ToE4m3::convert).
  static __device__ __forceinline__ void convert(u32 codes, u32& low, u32& high) {
    low = bytes(codes);
    high = bytes(__funnelshift_r(codes, codes, 4));
  }
};

}  // namespace humming_aot::numerics
