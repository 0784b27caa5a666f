#pragma once
// b-bit weight codes as stored in the packed weight (humming_aot/packed_layout.py) -> the padded
// words the dequantizer reads: 4 "nibble words" (one per 16x16 tile, 8 codes of up to 4 bits)
// for b <= 4, 8 "byte words" (two per tile, 4 codes of up to 8 bits) for 4 < b <= 8. For b = 4
// and b = 8 the stored words are the padded words; other widths fold the padding of the last
// words into the spare high bits of the others, and unfold() undoes that with shifts and masks.
// 1-bit codes are the exception: a tile's four codes per 16-bit half are stored side by side, and
// its padded word (the stored word shifted) holds register s's code at bit s, not 4 s
// (kRegisterSpacing), so that the bf16 biased decode reads all four in place.
// For codes of 1 to 3 bits, the nibble bits above the code are left as they fall (the fold's
// bits or the next code's): the dequantizers mask every code with kCodeMask2 anyway, which saves
// a mask per padded word.
// Plain integer code, usable on the host too (tests/unit/test_packed_codes.py compiles it there).

#include <humming_aot/numerics/host_device.cuh>
#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

// The kWordsPerTile padded words of 16 x 16 tile j of one K step (the dequantizer's input).
template <int kWordsPerTile>
HUMMING_AOT_HOST_DEVICE void copy_tile_words(const u32* padded, int j, u32 (&tile_words)[kWordsPerTile]) {
#pragma unroll
  for (int e = 0; e < kWordsPerTile; ++e) tile_words[e] = padded[j * kWordsPerTile + e];
}

// (x & kMask) | kOr as one lop3 (LUT 0xEA): the dequantizers' step from a code's bits to the
// magic number holding it.
template <u32 kMask, u32 kOr>
HUMMING_AOT_HOST_DEVICE u32 masked_or(u32 x) {
#if defined(__CUDA_ARCH__)
  u32 y;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(y) : "r"(x), "n"(kMask), "n"(kOr));
  return y;
#else
  return (x & kMask) | kOr;
#endif
}

template <int kBits>
struct PackedCodes {
  static_assert(kBits >= 1 && kBits <= 8, "1- to 8-bit codes");
  static constexpr int kLaneBits = kBits <= 4 ? 4 : 8;         // padded code width
  static constexpr int kPaddedWords = kLaneBits == 4 ? 4 : 8;  // per lane per 16-row K step (4 tiles)
  static constexpr u32 kOnes4 = 0x11111111u;                   // bit 0 of every nibble
  static constexpr u32 kOnes8 = 0x01010101u;                   // bit 0 of every byte
  // the code bits of a nibble-lane pair (bits [0, kBits) and [16, 16 + kBits)), for kBits <= 4
  static constexpr u32 kCodeMask2 = ((1u << (kBits < 4 ? kBits : 4)) - 1u) * 0x00010001u;

  static constexpr int kTileWords = kPaddedWords / 4;  // padded words per 16x16 tile
  // Nibble words: bits between the codes of registers s and s + 1 of each 16-bit half (register
  // s at bit kRegisterSpacing * s, and 16 higher).
  static constexpr int kRegisterSpacing = kBits == 1 ? 1 : 4;

  // Bit i set: stored word i goes into a padded word of tile j. A body that dequantizes one
  // tile per warp (the wgmma body) loads only these words and unfolds only that tile.
  static HUMMING_AOT_HOST_DEVICE constexpr u32 tile_sources(int j) {
    constexpr u32 kAll = (1u << kBits) - 1u;
    if constexpr (kBits == 4) return 1u << j;
    if constexpr (kBits == 8) return 3u << (2 * j);
    if constexpr (kBits == 1) return 1u;
    if constexpr (kBits == 2) return 1u << (j / 2);
    if constexpr (kBits == 3) return j < 3 ? 1u << j : kAll;
    // 5: V_4 from P_4, V_5 from P_0 and P_1, V_6 from P_1..P_3, V_7 from P_3 and P_4
    if constexpr (kBits == 5) return j < 2 ? 3u << (2 * j) : j == 2 ? 0x13u : 0x1Eu;
    // 6 and 7: byte words 2j and 2j + 1; the last tile's folded words gather from every stored word
    return 2 * j + 1 < kBits ? 3u << (2 * j) : kAll;
  }

  // The padded words of tile kTile alone, from the stored words tile_sources(kTile) names (the
  // others are not read).
  template <int kTile>
  static HUMMING_AOT_HOST_DEVICE void unfold_tile(const u32 (&p)[kBits], u32 (&out)[kTileWords]) {
    u32 source[kBits], padded[kPaddedWords];
    for (int i = 0; i < kBits; ++i) source[i] = (tile_sources(kTile) >> i) & 1u ? p[i] : 0u;
    unfold(source, padded);
    for (int e = 0; e < kTileWords; ++e) out[e] = padded[kTile * kTileWords + e];
  }

  // 1-bit codes: the padded word of tile j, which may be a run-time index (one shift).
  static HUMMING_AOT_HOST_DEVICE u32 one_bit_tile_word(u32 stored, int j) {
    static_assert(kBits == 1, "1-bit codes only");
    return stored >> (4 * j);
  }

  // p: the lane's kBits stored words of one K step; out: its padded words (tile j: words
  // [j * kPaddedWords / 4, (j + 1) * kPaddedWords / 4)).
  static HUMMING_AOT_HOST_DEVICE void unfold(const u32 (&p)[kBits], u32 (&out)[kPaddedWords]) {
    if constexpr (kBits == 4 || kBits == 8) {
      for (int i = 0; i < kBits; ++i) out[i] = p[i];
    } else if constexpr (kBits == 1) {  // register s at bit s; the bits above undefined (see kCodeMask2)
      for (int j = 0; j < 4; ++j) out[j] = one_bit_tile_word(p[0], j);
    } else if constexpr (kBits == 2) {  // nibble bits 2-3 undefined
      out[0] = p[0];
      out[1] = p[0] >> 2;
      out[2] = p[1];
      out[3] = p[1] >> 2;
    } else if constexpr (kBits == 3) {  // nibble bit 3 of words 0-2 undefined
      for (int j = 0; j < 3; ++j) out[j] = p[j];
      out[3] = ((p[0] >> 3) & kOnes4) | ((p[1] >> 2) & (kOnes4 << 1)) | ((p[2] >> 1) & (kOnes4 << 2));
    } else {
      constexpr u32 kLow = ((1u << kBits) - 1u) * kOnes8;
      for (int i = 0; i < kBits; ++i) out[i] = p[i] & kLow;
      if constexpr (kBits == 7) {
        u32 v = 0;
        for (int i = 0; i < 7; ++i) v |= (p[i] >> (7 - i)) & (kOnes8 << i);
        out[7] = v;
      } else if constexpr (kBits == 6) {
        for (int f = 0; f < 2; ++f) {
          u32 v = 0;
          for (int i = 0; i < 3; ++i) v |= (p[3 * f + i] >> (6 - 2 * i)) & ((3u * kOnes8) << (2 * i));
          out[6 + f] = v;
        }
      } else {  // 5: bits 5-7 of P_0..P_4 hold V_5, V_6, V_7 in runs (packed_layout._FIVE_BIT_HOMES)
        out[5] = ((p[0] >> 5) & (7u * kOnes8)) | ((p[1] >> 2) & (0x18u * kOnes8));
        out[6] = ((p[1] >> 7) & kOnes8) | ((p[2] >> 4) & (0x0Eu * kOnes8)) | ((p[3] >> 1) & (0x10u * kOnes8));
        out[7] = ((p[3] >> 6) & (3u * kOnes8)) | ((p[4] >> 3) & (0x1Cu * kOnes8));
      }
    }
  }
};

}  // namespace humming_aot::numerics
