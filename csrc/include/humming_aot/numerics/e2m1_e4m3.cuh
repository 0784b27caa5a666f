#pragma once
// MXFP4 weight codes (float4e2m1, a float8e8m0 scale per 32 of K) -> e4m3 codes of the values times
// their group's scale relative to the K tile's, eight at a time, for the W4A8 bodies' register
// operand (mainloop/int4_e4m3_groups.cuh, kernel/dense_mma_w4a8.cuh).
//
// A K tile of 128 holds four groups of 32, and one wgmma / mma k32 step is one group. Per channel
// and K tile humming_aot.w4a8.pack stores an entry of two words: the fp32 tile scale 2^b (weighing
// the K tile's fp32 sums, as an int4 weight's group scale does) and four bytes o_g = 8 (d_g + 5),
// d_g = e_g - b in -5 .. 6 the exponent of group g's scale relative to it. Every e2m1 value times
// 2^d for d in -5 .. 6 is a normal e4m3 value (0.5 x 2^-5 = 2^-6 the least, 6 x 2^6 = 384 the
// most), whose byte is the e4m3 byte of the value itself plus 8 d. So for each channel and group a
// lane builds an 8-byte table of the e4m3 bytes of magnitudes 0 .. 7 times 2^d (two IMAD on the
// group's byte), and prmt looks four codes up at once.
//
// A stored word holds eight codes: nibble n has, in bits 0-2, the magnitude of code n % 4 of the
// low register (n < 4) or of the high one (n >= 4), and in bit 3 the sign of code n / 2 of the low
// register (n even) or of the high one (n odd), so that the low register's signs are bits 3, 11,
// 19, 27 (one shift from the e4m3 sign bits) and the high one's bits 7, 15, 23, 31.
// Cost: 7 instructions per 8 codes (a mask, 2 prmt, a shift, 2 lop3, one more shift), plus 3 per
// channel and group for its table.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct E2m1ToE4m3 {
  static constexpr float kValueScale = 1.f;  // the bytes are the values (times 2^d) themselves
  static constexpr bool kS8Bytes = false;    // s8 bytes (int8 activations) rather than e4m3 ones
  static constexpr int kEntryBytes = 8;      // a channel's per-K-tile entry: fp32 tile scale, 4 group bytes
  static constexpr bool kGroupTables = true;
  // entries may hold a span's scale over several K tiles (humming_aot.w4a8.pack's fold span)
  static constexpr bool kSpans = true;

  // e4m3 magnitudes 0 .. 7 (0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^d, d = o / 8 - 5: byte i of (lo, hi).
  struct Table {
    u32 lo, hi;
  };

  // Group `group`'s table from a channel's group bytes (o_0 .. o_3, o_g at byte g).
  static __device__ __forceinline__ Table table(u32 group_bytes, int group) {
    u32 o;  // byte `group`, zeros above it
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(o) : "r"(group_bytes), "r"(0x4440u + static_cast<u32>(group)));
    // (0x30 - 40, 0x38 - 40, 0x3C - 40 above 0; 0x40 .. 0x4C - 40): the e4m3 bytes of 0.5 .. 6 less 8 x 5
    return {o * 0x01010100u + 0x14100800u, o * 0x01010101u + 0x24201C18u};
  }

  // Eight codes into two registers of four e4m3 codes, the low register's channel by `low`, the
  // high one's by `high`.
  static __device__ __forceinline__ void convert(u32 codes, const Table& low, const Table& high, u32& a_low,
                                                 u32& a_high) {
    const u32 magnitudes = codes & 0x77777777u;  // prmt's selectors: no sign-replicating nibble
    u32 l, h;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(l) : "r"(low.lo), "r"(low.hi), "r"(magnitudes));
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(h) : "r"(high.lo), "r"(high.hi), "r"(magnitudes >> 16));
    a_low = l | ((codes << 4) & 0x80808080u);
    a_high = h | (codes & 0x80808080u);
  }
};

}  // namespace humming_aot::numerics
