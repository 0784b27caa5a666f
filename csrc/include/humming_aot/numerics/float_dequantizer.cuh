#pragma once
// Small signed float weight codes (1 sign, kExp exponent and kMan mantissa bits, IEEE-style bias
// with subnormals) -> MMA B fragments of the activation dtype, times the group scale: w = v * s,
// rounded once to the activation dtype (bitwise what PackedWeight.dequantized() in
// humming_aot/packing.py returns). kExp = 0 is a sign-magnitude integer. Same packed words,
// fragment layout and interface (Pairs, prepare, apply, dequantize) as numerics/int_dequantizer.cuh.
//
// kExp >= 1: numerics/float_codes.cuh places a code's fields at the bottom of the target's, which
// is the code's value times 2^-c exactly (c: the bias difference, a subnormal for small codes),
// and the dequantizer multiplies it by the scale pre-multiplied by 2^c once per scale pair:
// exact, because humming_aot.packing keeps s x 2^c finite (it moves a power of two into the
// global scale when it would not be). One rounding, in the only multiply per weight pair.
// kExp = 0: the magnitude goes through the magic number (as integer codes do) and the sign bit
// is OR-ed in.

#include <humming_aot/numerics/float_codes.cuh>
#include <humming_aot/numerics/packed_codes.cuh>
#include <humming_aot/numerics/packed_half2.cuh>

namespace humming_aot::numerics {

// 2^e as a packed pair of the activation dtype (e inside its normal range).
template <class Act>
HUMMING_AOT_HOST_DEVICE constexpr u32 power_of_two_pair(int e) {
  const u32 bits = Act::kIsBFloat16 ? static_cast<u32>(127 + e) << 7 : static_cast<u32>(15 + e) << 10;
  return bits | (bits << 16);
}

template <int kExp, int kMan, bool kToBFloat16>
struct FloatCompensation {  // how far placed codes are from their values: value = placed x 2^kScale
  static constexpr int kScale = FloatCodes<kExp, kMan, kToBFloat16>::kCompensation;
};
template <int kMan, bool kToBFloat16>
struct FloatCompensation<0, kMan, kToBFloat16> {  // sign-magnitude integers are not placed
  static constexpr int kScale = 0;
};

template <class Act, int kExp, int kMan>
struct FloatDequantizer {
  using H2 = PackedHalf2<Act>;
  static constexpr int kBits = 1 + kExp + kMan;
  static_assert(kBits >= 2 && kBits <= 8, "2- to 8-bit float codes");
  static_assert(PackedCodes<kBits>::kRegisterSpacing == 4, "float codes read nibble s at bit 4 s");
  static constexpr int kLaneBits = PackedCodes<kBits>::kLaneBits;
  static constexpr int kWordsPerTile = kLaneBits / 4;  // padded words per lane per 16x16 tile
  using Compensation = FloatCompensation<kExp, kMan, Act::kIsBFloat16>;
  static constexpr u32 kScaleFactor2 = power_of_two_pair<Act>(Compensation::kScale);
  static constexpr u32 kMagnitude2 = ((1u << (kBits - 1)) - 1u) * 0x00010001u;
  static constexpr u32 kMagic2 = Act::kMagicBits | (Act::kMagicBits << 16);
  // no unscaled decode: the scale multiply also undoes the placement (x 2^c), so it stays
  static constexpr bool kUnscaledExact = false;
  static constexpr bool kFoldsOffset = false;  // no biased decode (numerics/int_dequantizer.cuh)

  struct Pairs {
    u32 scale_h[2];  // scale x 2^(compensation) of columns g (h = 0) and 8 + g (h = 1), both lanes
  };

  //   scale2: (s(n = g), s(n = 8 + g)) packed pair of this lane's two columns; zero2: unused
  static __device__ __forceinline__ Pairs prepare(u32 scale2, u32 /*zero2*/) {
    Pairs p;
    p.scale_h[0] = H2::broadcast_low(scale2);
    p.scale_h[1] = H2::broadcast_high(scale2);
    if constexpr (Compensation::kScale != 0) {
      p.scale_h[0] = H2::mul(p.scale_h[0], kScaleFactor2);
      p.scale_h[1] = H2::mul(p.scale_h[1], kScaleFactor2);
    }
    return p;
  }

  // Two codes at bits [0, kBits) and [16, 16 + kBits) of `pair` (higher bits of each half are
  // ignored) -> their two weights.
  static __device__ __forceinline__ u32 weight_pair(u32 pair, u32 scale2) {
    u32 v;
    if constexpr (kExp == 0) {
      // (magnitude | magic) - magic, exact: magnitudes stay below 128; then the sign bit
      v = H2::sub(masked_or<kMagnitude2, kMagic2>(pair), kMagic2) | ((pair << (16 - kBits)) & H2::kSignMask2);
    } else {
      v = FloatCodes<kExp, kMan, Act::kIsBFloat16>::place_pair(pair);
    }
    return H2::mul(v, scale2);
  }

  // Dequantize one 16x16 tile for one lane.
  //   words: kWordsPerTile padded words (numerics/packed_codes.cuh)
  //   frag:  frag[h][r], register r (0: k = 2t..2t+1, 1: k = 2t+8..2t+9) of the n = 8h + g fragment
  static __device__ __forceinline__ void apply(const u32 (&words)[kWordsPerTile], const Pairs& p, u32 (&frag)[2][2]) {
    if constexpr (kLaneBits == 4) {
#pragma unroll
      for (int s = 0; s < 4; ++s) frag[s >> 1][s & 1] = weight_pair(words[0] >> (4 * s), p.scale_h[s >> 1]);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        frag[h][0] = weight_pair(__byte_perm(words[h], 0u, 0x4140), p.scale_h[h]);
        frag[h][1] = weight_pair(__byte_perm(words[h], 0u, 0x4342), p.scale_h[h]);
      }
    }
  }

  static __device__ __forceinline__ void dequantize(const u32 (&words)[kWordsPerTile], u32 scale2, u32 zero2,
                                                    u32 (&frag)[2][2]) {
    apply(words, prepare(scale2, zero2), frag);
  }
};

}  // namespace humming_aot::numerics
