#pragma once
// int4 weight codes (-8 .. 7) -> e4m3 codes of the same values times 2^-9, eight at a time, for
// W4A8's register operand (mainloop/int4_e4m3_groups.cuh). The group scale is not applied here (it
// weighs the fp32 sums of its K group), and the 2^9 is put back with the token scales at the end
// (kernel/dense_wgmma_w4a8.cuh): an exact power of two, so the output is the same as with e4m3
// codes of the values themselves.
//
// Why 2^-9: e4m3 bit patterns 0x00 .. 0x0F are the values p x 2^-9 (subnormals 0 .. 7, then the
// first binade 8 .. 15), a straight line, so a code becomes its e4m3 byte with integer adds and
// masks alone. A value v is stored (humming_aot.w4a8, `encode`) as a sign s and three bits m: v = m
// (s = 0) or v = -(m + 1) (s = 1). With m in bits 0-2 of a byte and s in bit 7, the byte plus s is
// the e4m3 byte: m, or 0x80 + |v| (0x81 .. 0x88 for v = -1 .. -8). Each byte of a packed word holds
// one code of the low register that way (bits 0-2 and 7) and the magnitude bits of one code of the
// high register (bits 4-6); the high code's sign sits in bit 3 of the next byte (mod 4), so that a
// rotation of the word by 4 bits lays the high codes out as the low ones were.
// Cost: 7 instructions per 8 codes (a rotation, 4 lop3, 2 LEA.HI), every constant an immediate.
// The prmt table lookup this replaced (2 prmt + 1 xor per 4 codes) needed a table word in a
// register for every prmt, which ptxas moved there from a uniform register each time under the
// consumers' register pressure (docs/performance/log.md section 37).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct Int4ToE4m3 {
  static constexpr u32 kCode = 0x87878787u;    // a code's bits in each byte: |v| - 1 or v in bits 0-2, the sign in 7
  static constexpr u32 kSign = 0x80808080u;    // the sign bit of each byte
  static constexpr float kValueScale = 512.f;  // 2^9: e4m3 byte p is the value p / kValueScale
  static constexpr bool kS8Bytes = false;      // s8 bytes (int8 activations) rather than e4m3 ones
  static constexpr int kEntryBytes = 4;        // a channel's per-K-tile entry: its group's fp32 scale
  static constexpr bool kGroupTables = false;  // (numerics/e2m1_e4m3.cuh builds tables per group of 32)
  static constexpr bool kSpans = false;        // a promotion per K tile (numerics/e2m1_e4m3.cuh: spans)

  // Four e4m3 bytes from four codes, one a byte: n = v (sign 0) or n = 0x80 + |v| - 1 (sign 1),
  // byte n + sign = v or 0x80 + |v|. (t >> 7) + y is one instruction (LEA.HI).
  static __device__ __forceinline__ u32 bytes(u32 word) { return (word & kCode) + ((word & kSign) >> 7); }

  // Eight codes into two registers of four e4m3 codes. Byte j of the word holds code j of `low` in
  // bits 0-2 and 7 and the magnitude bits of code j of `high` in bits 4-6; the sign of code j of
  // `high` is bit 3 of byte j + 1 (mod 4), where a rotation by 4 bits puts it beside them.
  static __device__ __forceinline__ void convert(u32 codes, u32& low, u32& high) {
    low = bytes(codes);
    high = bytes(__funnelshift_r(codes, codes, 4));
  }
};

}  // namespace humming_aot::numerics
