#pragma once
// uint4 weight codes (0 .. 15) less an integer zero point z (0 .. 15, one per channel per group of
// a multiple of 128: AWQ) -> e4m3 or s8 bytes of d = q - z (-15 .. 15), eight at a time, for the
// W4A8 bodies' register operand (mainloop/int4_e4m3_groups.cuh, kernel/dense_mma_w4a8.cuh).
//
// Layout (humming_aot.w4a8_uint4): the words are in the int4 layout's order, byte j of a word holds
// code j of the low A register in bits 0-3 and code j of the high one in bits 4-7. A channel's
// per-K-tile entry is two words: its group's fp32 scale and z x 0x01010101 (z in every byte), from
// which `table` makes the row's state once per K step (the mainloop's kGroupTables interface;
// the state is the same for every step of a K tile, so ptxas keeps one copy).
//
// With t = q + 0x80808080 - z x 0x01010101 (one IADD3), each byte of t is 0x80 + d (0x71 .. 0x8F:
// no borrow or carry between bytes), so:
//   s8:   t ^ 0x80 is d in two's complement;
//   e4m3: the bytes 0x00 .. 0x0F are the values p x 2^-9 (numerics/int4_e4m3.cuh), so the e4m3
//         byte of d x 2^-9 is |q - z| (one VABSDIFF4 on the bytes) with the sign bit where bit 7
//         of t is clear (d < 0); the kernel puts the 2^9 back with the token scales.
// Cost per 8 codes: e4m3 9 instructions (a shift, 2 masks, 2 VABSDIFF4, 2 IADD3, 2 lop3), s8 7;
// state: one register per row (its zero-point word). The bodies count 4 registers per unit for it,
// as for MXFP4's tables: with 2, the 128-token wgmma-w4a8 tile took two scratch sets and ptxas
// 13.0 spilled 60 bytes inside its K loop.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

struct Uint4ZeroPointBytes {
  static constexpr int kEntryBytes = 8;       // a channel's per-K-tile entry: fp32 scale, zero-point bytes
  static constexpr bool kGroupTables = true;  // per-row state (its zero point) from the entry's second word
  static constexpr bool kSpans = false;       // a promotion per K tile (numerics/e2m1_e4m3.cuh: spans)

  struct Table {
    u32 zero;  // z in every byte
  };

  // A row's state from its entry's second word (z x 0x01010101); the same for every K step.
  static __device__ __forceinline__ Table table(u32 zero_bytes, int) { return {zero_bytes}; }

  // 0x80 + q - z in each byte of four codes q
  static __device__ __forceinline__ u32 offset_difference(u32 q, const Table& row) {
    return q + 0x80808080u - row.zero;
  }

  static __device__ __forceinline__ u32 low_codes(u32 codes) { return codes & 0x0F0F0F0Fu; }
  static __device__ __forceinline__ u32 high_codes(u32 codes) { return (codes >> 4) & 0x0F0F0F0Fu; }
};

struct Uint4ZeroPointToE4m3 : Uint4ZeroPointBytes {
  static constexpr float kValueScale = 512.f;  // 2^9: e4m3 byte p is the value p / kValueScale
  static constexpr bool kS8Bytes = false;      // e4m3 bytes (float8e4m3 activations)

  // Four e4m3 bytes of (q - z) x 2^-9 from four codes q, one a byte (bits 0-3).
  static __device__ __forceinline__ u32 bytes(u32 q, const Table& row) {
    return __vabsdiffu4(q, row.zero) | (~offset_difference(q, row) & 0x80808080u);
  }

  // Eight codes into two registers of four e4m3 bytes, the low register's row by `low`, the high
  // one's by `high`.
  static __device__ __forceinline__ void convert(u32 codes, const Table& low, const Table& high, u32& a_low,
                                                 u32& a_high) {
    a_low = bytes(low_codes(codes), low);
    a_high = bytes(high_codes(codes), high);
  }
};

struct Uint4ZeroPointToS8 : Uint4ZeroPointBytes {
  static constexpr float kValueScale = 1.f;  // the s8 bytes are the values themselves
  static constexpr bool kS8Bytes = true;     // s8 bytes (int8 activations)

  // Four s8 bytes of q - z from four codes q, one a byte (bits 0-3).
  static __device__ __forceinline__ u32 bytes(u32 q, const Table& row) {
    return offset_difference(q, row) ^ 0x80808080u;
  }

  static __device__ __forceinline__ void convert(u32 codes, const Table& low, const Table& high, u32& a_low,
                                                 u32& a_high) {
    a_low = bytes(low_codes(codes), low);
    a_high = bytes(high_codes(codes), high);
  }
};

}  // namespace humming_aot::numerics
