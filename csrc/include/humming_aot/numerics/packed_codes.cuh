#pragma once
// b-bit weight codes as stored in the packed weight (humming_aot/packing.py) -> the padded
// words the dequantizer reads: 4 "nibble words" (one per 16x16 tile, 8 codes of up to 4 bits)
// for b <= 4, 8 "byte words" (two per tile, 4 codes of up to 8 bits) for 4 < b <= 8. For b = 4
// and b = 8 the stored words are the padded words; other widths fold the padding of the last
// words into the spare high bits of the others, and unfold() undoes that with shifts and masks.
// Plain integer code, usable on the host too (tests/unit/test_packed_codes.py compiles it there).

#include <humming_aot/numerics/host_device.cuh>
#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

template <int kBits>
struct PackedCodes {
  static_assert(kBits >= 1 && kBits <= 8, "1- to 8-bit codes");
  static constexpr int kLaneBits = kBits <= 4 ? 4 : 8;        // padded code width
  static constexpr int kPaddedWords = kLaneBits == 4 ? 4 : 8;  // per lane per 16-row K step (4 tiles)
  static constexpr u32 kOnes4 = 0x11111111u;                   // bit 0 of every nibble
  static constexpr u32 kOnes8 = 0x01010101u;                   // bit 0 of every byte

  // p: the lane's kBits stored words of one K step; out: its padded words (tile j: words
  // [j * kPaddedWords / 4, (j + 1) * kPaddedWords / 4)).
  static HUMMING_AOT_HOST_DEVICE void unfold(const u32 (&p)[kBits], u32 (&out)[kPaddedWords]) {
    if constexpr (kBits == 4 || kBits == 8) {
      for (int i = 0; i < kBits; ++i) out[i] = p[i];
    } else if constexpr (kBits == 1) {
      for (int j = 0; j < 4; ++j) out[j] = (p[0] >> j) & kOnes4;
    } else if constexpr (kBits == 2) {
      out[0] = p[0] & 0x33333333u;
      out[1] = (p[0] >> 2) & 0x33333333u;
      out[2] = p[1] & 0x33333333u;
      out[3] = (p[1] >> 2) & 0x33333333u;
    } else if constexpr (kBits == 3) {
      for (int j = 0; j < 3; ++j) out[j] = p[j] & 0x77777777u;
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
      } else {  // 5
        for (int c = 0; c < 3; ++c) {
          u32 v = 0;
          for (int i = 0; i < 5; ++i) v |= (p[i] >> (5 + c - i)) & (kOnes8 << i);
          out[5 + c] = v;
        }
      }
    }
  }
};

}  // namespace humming_aot::numerics

