#pragma once
// int4 weight codes (-8 .. 7) -> e4m3 codes of the same values, four at a time, for W4A8's
// register operand (mainloop/int4_e4m3_groups.cuh). Every int4 value is exact in e4m3; the group
// scale is not applied here (it weighs the fp32 sums of its K group instead), so the conversion
// is a table lookup and nothing else.
//
// prmt looks up 8 bytes with the low 3 bits of each selector nibble; a nibble whose bit 3 is set
// yields its byte's sign (0x00 or 0xFF) instead. So each 4-bit code is stored (humming_aot.w4a8,
// `encode`) as an index m (bits 0-2) into two tables and a bit b (bit 3) saying which: with b = 0
// the value is kClear[m], with b = 1 kSet[m], and the two values of one index share their sign
// (m 0-3: 2m and 2m + 1; m 4-7: 7 - 2m and 6 - 2m). Looking up the code in the first table and
// the code with b flipped in the second, one of the two yields the value (or its complement) and
// the other a sign byte that is 0x00 for m 0-3 and 0xFF for m 4-7, and their XOR is the value's
// e4m3 code: the first table holds the complements of the negative values (so its entries are all
// positive bytes, whose sign byte is 0x00), the second the values themselves.
// Cost: 2 prmt + 1 xor per 4 codes, plus 1 xor and 2 shifts per 8.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct Int4ToE4m3 {
  // bytes m = 0..7 of (kClearLo, kClearHi): e4m3(0, 2, 4, 6), ~e4m3(-1, -3, -5, -7)
  static constexpr u32 kClearLo = 0x4C484000u, kClearHi = 0x31353B47u;
  // bytes m = 0..7 of (kSetLo, kSetHi): e4m3(1, 3, 5, 7, -2, -4, -6, -8)
  static constexpr u32 kSetLo = 0x4E4A4438u, kSetHi = 0xD0CCC8C0u;

  // prmt.b32 in its default mode (bit 3 of a selector nibble replicates the byte's sign;
  // __byte_perm ignores that bit)
  static __device__ __forceinline__ u32 permute(u32 lo, u32 hi, u32 selector) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(lo), "r"(hi), "r"(selector));
    return d;
  }

  // Eight codes (nibble j = code j) into two registers of four e4m3 codes: codes 0-3 into `low`
  // (byte j = code j), codes 4-7 into `high`.
  static __device__ __forceinline__ void convert(u32 codes, u32& low, u32& high) {
    const u32 flipped = codes ^ 0x88888888u;
    low = permute(kClearLo, kClearHi, codes) ^ permute(kSetLo, kSetHi, flipped);
    high = permute(kClearLo, kClearHi, codes >> 16) ^ permute(kSetLo, kSetHi, flipped >> 16);
  }
};

}  // namespace humming_aot::numerics
