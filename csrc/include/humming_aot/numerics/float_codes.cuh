#pragma once
// Small signed float codes (sign, kExp exponent bits, kMan mantissa bits, IEEE-style bias) ->
// the bits of a 16-bit activation-dtype number, by placing the code's exponent and mantissa
// fields at the bottom of the target's: for every normal and subnormal code the placed number
// is the code's value times 2^-kCompensation exactly (kCompensation = target bias - code bias),
// so a dequantizer multiplies it by a scale pre-multiplied by 2^kCompensation
// (numerics/float_dequantizer.cuh). Codes that encode NaN or Inf place as finite numbers (the
// quantizer never produces them), except in IEEE-like formats with the target's exponent width,
// where they stay Inf and NaN. Needs kExp <= the target's exponent bits and kMan <= its mantissa
// bits (float16: E <= 5, M <= 10; bfloat16: E <= 8, M <= 7), and a code with the target's
// exponent width must be IEEE-like (a finite-only one would put its top binade on the target's
// Inf/NaN); kExp = 0 (sign-magnitude integers) takes the integer path instead.
//
// Plain integer code, compiled on the host by tests/unit/test_float_codes.py.

#include <humming_aot/numerics/host_device.cuh>
#include <humming_aot/numerics/types.cuh>

namespace humming_aot::numerics {

template <int kExp, int kMan, bool kToBFloat16>
struct FloatCodes {
  static constexpr int kBits = 1 + kExp + kMan;
  static constexpr int kTargetExp = kToBFloat16 ? 8 : 5;
  static constexpr int kTargetMan = kToBFloat16 ? 7 : 10;
  static_assert(kExp >= 1 && kExp <= kTargetExp && kMan <= kTargetMan && kBits <= 8,
                "the code's fields must fit the target's (E = 0 codes are sign-magnitude integers)");
  static constexpr int kCodeBias = (1 << (kExp - 1)) - 1;
  static constexpr int kTargetBias = (1 << (kTargetExp - 1)) - 1;
  static constexpr int kCompensation = kTargetBias - kCodeBias;  // value = placed * 2^kCompensation
  static constexpr u32 kMagnitudeMask = (1u << (kBits - 1)) - 1u;
  static constexpr int kShift = kTargetMan - kMan;

  // One code in the low kBits bits -> the 16 target bits (in the low half).
  static HUMMING_AOT_HOST_DEVICE u32 place(u32 code) {
    return ((code >> (kBits - 1)) & 1u) << 15 | (code & kMagnitudeMask) << kShift;
  }

  // Two codes at bits [0, kBits) and [16, 16 + kBits) of `pair` (the rest zero) -> a packed pair
  // of target numbers: the form the dequantizer extracts codes in.
  static HUMMING_AOT_HOST_DEVICE u32 place_pair(u32 pair) {
    constexpr u32 kMagnitude2 = kMagnitudeMask | (kMagnitudeMask << 16);
    constexpr u32 kSign2 = (1u << (kBits - 1)) | (1u << (kBits + 15));
    return (pair & kSign2) << (16 - kBits) | (pair & kMagnitude2) << kShift;
  }
};

}  // namespace humming_aot::numerics
