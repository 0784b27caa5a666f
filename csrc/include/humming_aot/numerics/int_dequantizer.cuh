#pragma once
// Integer weight codes -> MMA B fragments of the activation dtype, with the group scale and zero
// point applied: w = (q - z) * s, rounded once to the activation dtype (bitwise what
// PackedWeight.dequantized() in humming_aot/packing.py returns). Stage: registers, between the shared-memory load
// of a packed weight word and the mma. SM80+.
//
// Packed word layout (humming_aot/packed_layout.py): for one 16 (k) x 16 (n) tile, lane (g = lane / 4,
// t = lane % 4) holds the 8 values it feeds to two m16n8k16 B fragments: n = g and n = 8 + g,
// k = 2t, 2t+1, 2t+8, 2t+9.
//  - 4-bit: one word; nibble i holds (k = 2t + (i >= 4) + 8 * (i & 1), n = 8 * ((i >> 1) & 1) + g),
//    so `(word >> 4s) & 0x000F000F` is the pair for register s of the two fragments.
//  - 8-bit: two words, word h for n = 8h + g; byte i holds k = 2t + (i & 1) + 8 * (i >> 1).
//  Other widths arrive here as such padded words (numerics/packed_codes.cuh unfolds them).
// Integer -> float uses the magic-number trick: OR-ing a code into the mantissa of 2^m gives
// 2^m + q exactly, and one subtraction of (2^m + z) leaves q - z. A float zero point (kFloat)
// cannot join the magic (its fraction would be lost): q is made exact first, then q - z and
// (q - z) * s each round once in the activation dtype. Without a float zero point, q - z is exact
// in the activation dtype, and apply_unscaled returns it for bodies that apply the scale to fp32
// sums instead (mainloop/swapped_warp_pipeline.cuh, kScalesInFp32).
// Biased decode (kFoldsOffset: bf16, implicit zero point, codes of up to 7 bits, for bodies that
// scale fp32 sums): the magic stays in. Register s of a tile reads its code at a bit position p_s
// of the 16-bit lane where the code's unit is 1, so it holds bias_s + q exactly, with
// bias_s = 2^(7 - p_s). Codes of 2 and 3 bits then sit where they are read in half of the
// registers (no shift), 1-bit codes in all four (p_s = s, their packing's point), and no
// subtraction follows: the body subtracts sum (bias + z) x a from the fp32 sums, an mma of the
// constant offset_pair() fragment with the same activations per K step, or one per warp run
// (mainloop/swapped_warp_pipeline.cuh, kPairOffset; 1-bit codes then also take apply_biased_nibble).

#include <humming_aot/numerics/packed_codes.cuh>
#include <humming_aot/numerics/packed_half2.cuh>

namespace humming_aot::numerics {

// kBits: 1 to 8. Codes of up to 4 bits are dequantized from nibble words, wider ones from byte
// words (numerics/packed_codes.cuh unfolds the stored words into those first).
template <class Act, int kBits, ZeroPointKind kZeroPoint>
struct IntDequantizer {
  using H2 = PackedHalf2<Act>;
  static constexpr int kLaneBits = PackedCodes<kBits>::kLaneBits;

  static constexpr int kWordsPerTile = kLaneBits / 4;  // padded words per lane per 16x16 tile
  static constexpr int kImplicitZero = 1 << (kBits - 1);
  // bf16 holds 128 + q exactly only for q < 128: 8-bit codes go through fp32 (2^23 + q). Byte
  // codes of 5 to 7 bits take the magic as 4-bit codes do (their unfolded bytes are below 128).
  static constexpr bool kViaFloat32 = Act::kIsBFloat16 && kBits == 8;
  // the magic's high byte in every byte: byte_perm of a code byte below it gives magic + q
  static constexpr u32 kMagicHighBytes = (Act::kMagicBits >> 8) * 0x01010101u;
  static constexpr bool kExplicitZero = kZeroPoint != ZeroPointKind::kImplicit;
  static constexpr bool kFloatZero = kZeroPoint == ZeroPointKind::kFloat;
  static constexpr u32 kMagic2 = Act::kMagicBits | (Act::kMagicBits << 16);
  // q - z is exact in the activation dtype (|q - z| < 256), so apply_unscaled is available
  static constexpr bool kUnscaledExact = !kFloatZero;

  // Biased decode (see the top of the file). bf16 only: fp16's magic (1024) would put ~10 bits
  // of bias into the fp32 sums before the subtraction, too close to an fp16 result's precision.
  static constexpr bool kFoldsOffset = Act::kIsBFloat16 && !kExplicitZero && !kViaFloat32;
  // Nibble register s (code at bit 4s of the padded word; bit s for 1-bit codes): the right
  // shift that brings it to bit biased_position(s), whose mantissa bits hold the whole code
  // (bf16: bits 0-6). 1-bit codes are read in place, each register at a bias of its own.
  static HUMMING_AOT_HOST_DEVICE constexpr int biased_shift(int s) {
    return kBits == 1 ? 0 : kBits == 4 ? 8 * (s >> 1) + (s & 1) : 8 * (s >> 1);
  }
  static HUMMING_AOT_HOST_DEVICE constexpr int biased_position(int s) {
    return kLaneBits == 8 ? 0 : kBits == 1 ? s : kBits == 4 ? 3 * (s & 1) : 4 * (s & 1);
  }
  // bf16 bits of a positive integer below 256 (exact: at most 8 significant bits)
  static HUMMING_AOT_HOST_DEVICE constexpr u32 bf16_bits_of(int v) {
    int e = 0;
    while ((v >> (e + 1)) != 0) ++e;
    return (static_cast<u32>(127 + e) << 7) | (static_cast<u32>(v << (7 - e)) & 0x7Fu);
  }
  // register s's magic (2^(7 - p), both lanes) and the offset fragment's pair (bias + z)
  static HUMMING_AOT_HOST_DEVICE constexpr u32 biased_magic2(int s) {
    return bf16_bits_of(128 >> biased_position(s)) * 0x00010001u;
  }
  static HUMMING_AOT_HOST_DEVICE constexpr u32 offset_pair(int s) {
    return bf16_bits_of((128 >> biased_position(s)) + kImplicitZero) * 0x00010001u;
  }

  template <int s>
  static __device__ __forceinline__ u32 biased_register(u32 word) {
    return masked_or<(PackedCodes<kBits>::kCodeMask2 << biased_position(s)), biased_magic2(s)>(word >> biased_shift(s));
  }

  // bias_s + q for register s = 2h + r of one 16x16 tile (frag[h][r] as in apply), exact.
  static __device__ __forceinline__ void apply_biased(const u32 (&words)[kWordsPerTile], u32 (&frag)[2][2]) {
    static_assert(kFoldsOffset, "the biased decode is for bf16 codes of up to 7 bits with the implicit zero point");
    if constexpr (kLaneBits == 4) {
      frag[0][0] = biased_register<0>(words[0]);
      frag[0][1] = biased_register<1>(words[0]);
      frag[1][0] = biased_register<2>(words[0]);
      frag[1][1] = biased_register<3>(words[0]);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // 128 + q: bias 128 in every register
        frag[h][0] = __byte_perm(words[h], kMagicHighBytes, 0x4140);
        frag[h][1] = __byte_perm(words[h], kMagicHighBytes, 0x4342);
      }
    }
  }

  // 1-bit codes read in place from both nibbles of each byte (the swapped tile's run offset,
  // mainloop/swapped_warp_pipeline.cuh): the stored word holds tile j's register s at bit 4j + s, so tiles
  // 0 and 1 are read from the word and tiles 2 and 3 from the word >> 8, one shift instead of
  // three. The low nibble (kUpper = false) is the biased decode above: bias 128 >> s, unit 1. The
  // high nibble's bits 4-7 take bias 64 >> s with a unit of 8: bits 4-6 are mantissa bits of
  // 64 >> s, bit 7 is the exponent's lowest bit of 8 (even: 8 + 8q is 8 or 16). Its sums are
  // 8 x (q - z) x a after the offset (bias + 8z) x a is subtracted: the body scales them by s / 8.
  static constexpr int kUpperUnit = 8;
  static HUMMING_AOT_HOST_DEVICE constexpr int nibble_bias(int s, bool upper) { return upper ? 64 >> s : 128 >> s; }
  static HUMMING_AOT_HOST_DEVICE constexpr u32 nibble_offset_pair(int s, bool upper) {
    return bf16_bits_of(nibble_bias(s, upper) + (upper ? kUpperUnit : 1) * kImplicitZero) * 0x00010001u;
  }

  template <int s, bool kUpper>
  static __device__ __forceinline__ u32 nibble_register(u32 word) {
    static_assert(kBits == 1 && kFoldsOffset, "1-bit codes, bf16, implicit zero point");
    return masked_or<(0x00010001u << (s + 4 * kUpper)), bf16_bits_of(nibble_bias(s, kUpper)) * 0x00010001u>(word);
  }

  // bias + unit x q for the tile whose codes sit in the low (kUpper: high) nibble of each byte of `word`.
  template <bool kUpper>
  static __device__ __forceinline__ void apply_biased_nibble(u32 word, u32 (&frag)[2][2]) {
    frag[0][0] = nibble_register<0, kUpper>(word);
    frag[0][1] = nibble_register<1, kUpper>(word);
    frag[1][0] = nibble_register<2, kUpper>(word);
    frag[1][1] = nibble_register<3, kUpper>(word);
  }

  // q - z for register s = 2h + r of one 16x16 tile, exact: the biased decode, then bias_s + z
  // subtracted from each register pair (one packed fma each, on the FMA pipe) - for bodies that
  // would rather not spend an mma per K step on the offset fragment.
  static __device__ __forceinline__ void apply_biased_exact(const u32 (&words)[kWordsPerTile], u32 (&frag)[2][2]) {
    apply_biased(words, frag);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) frag[h][r] = H2::sub(frag[h][r], offset_pair(2 * h + r));
  }

  // The value subtracted from (magic + q): magic + zero point, per lane pair.
  static __device__ __forceinline__ u32 implicit_offset2() {
    constexpr u32 bits = Act::kMagicBits + kImplicitZero;
    return bits | (bits << 16);  // exact: magic + z stays on the integer grid of the magic
  }

  // A tile's scale and offset, each broadcast to both 16-bit lanes for its two columns
  // (h = 0: n = g, h = 1: n = 8 + g). Prepared once per scale row: a body whose K steps share
  // one row prepares them once per stage instead of once per step.
  struct Pairs {
    u32 scale_h[2];
    u32 offset_h[2];    // magic + zero point, both lanes (kFloat: the zero point alone)
    float offset_f[2];  // 2^23 + zero point (kViaFloat32 with explicit zero points)
  };

  //   scale2:  (s(n = g), s(n = 8 + g)) packed pair of this lane's two columns
  //   zero2:   same for the zero point (ignored for kImplicit)
  static __device__ __forceinline__ Pairs prepare(u32 scale2, u32 zero2) {
    Pairs p;
    p.scale_h[0] = H2::broadcast_low(scale2);
    p.scale_h[1] = H2::broadcast_high(scale2);
    if constexpr (kFloatZero) {
      p.offset_h[0] = H2::broadcast_low(zero2);
      p.offset_h[1] = H2::broadcast_high(zero2);
    } else if constexpr (kExplicitZero && kViaFloat32) {
      float z0, z1;
      H2::to_floats(zero2, z0, z1);
      p.offset_f[0] = 8388608.0f + z0;  // exact: z is an integer below 256
      p.offset_f[1] = 8388608.0f + z1;
    } else if constexpr (kExplicitZero) {
      p.offset_h[0] = H2::add(H2::broadcast_low(zero2), kMagic2);
      p.offset_h[1] = H2::add(H2::broadcast_high(zero2), kMagic2);
    } else {
      p.offset_h[0] = p.offset_h[1] = implicit_offset2();
      p.offset_f[0] = p.offset_f[1] = 8388608.0f + kImplicitZero;
    }
    return p;
  }

  // magic + q pair (exact) -> w pair of the n = 8h + g column (kScaled = false: q - z, exact).
  template <bool kScaled>
  static __device__ __forceinline__ u32 finish(u32 magic_q, const Pairs& p, int h) {
    if constexpr (kFloatZero) {
      static_assert(kScaled, "q - z rounds with a float zero point: the scale must follow in the same dtype");
      return H2::mul(H2::sub(H2::sub(magic_q, kMagic2), p.offset_h[h]), p.scale_h[h]);
    } else if constexpr (kScaled) {
      return H2::mul(H2::sub(magic_q, p.offset_h[h]), p.scale_h[h]);
    } else {
      return H2::sub(magic_q, p.offset_h[h]);
    }
  }

  // Dequantize one 16x16 tile for one lane: w = (q - z) * s.
  //   words:   kWordsPerTile packed words
  //   frag:    frag[h][r], register r (0: k = 2t..2t+1, 1: k = 2t+8..2t+9) of the n = 8h + g fragment
  static __device__ __forceinline__ void apply(const u32 (&words)[kWordsPerTile], const Pairs& p, u32 (&frag)[2][2]) {
    decode<true>(words, p, frag);
  }

  // The same without the scale: q - z, exact (kUnscaledExact); the caller scales the fp32 sums.
  static __device__ __forceinline__ void apply_unscaled(const u32 (&words)[kWordsPerTile], const Pairs& p,
                                                        u32 (&frag)[2][2]) {
    decode<false>(words, p, frag);
  }

  template <bool kScaled>
  static __device__ __forceinline__ void decode(const u32 (&words)[kWordsPerTile], const Pairs& p, u32 (&frag)[2][2]) {
    if constexpr (kLaneBits == 4) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int h = s >> 1, r = s & 1;
        // (word >> 4s) & code mask | magic2 (the mask also drops the bits above a code of fewer
        // than 4 bits, which unfolding leaves undefined)
        const u32 x =
            masked_or<PackedCodes<kBits>::kCodeMask2, kMagic2>(words[0] >> (PackedCodes<kBits>::kRegisterSpacing * s));
        frag[h][r] = finish<kScaled>(x, p, h);
      }
    } else if constexpr (!kViaFloat32) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 lo = __byte_perm(words[h], kMagicHighBytes, 0x4140);
        const u32 hi = __byte_perm(words[h], kMagicHighBytes, 0x4342);
        frag[h][0] = finish<kScaled>(lo, p, h);
        frag[h][1] = finish<kScaled>(hi, p, h);
      }
    } else if constexpr (kFloatZero) {  // bf16 byte codes: q exact through fp32 (bf16 holds 0..255)
      static_assert(kScaled, "q - z rounds with a float zero point: the scale must follow in the same dtype");
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = __uint_as_float(__byte_perm(words[h], 0x4B000000u, 0x7440 + i)) - 8388608.0f;
        frag[h][0] = H2::mul(H2::sub(H2::from_floats(q[0], q[1]), p.offset_h[h]), p.scale_h[h]);
        frag[h][1] = H2::mul(H2::sub(H2::from_floats(q[2], q[3]), p.offset_h[h]), p.scale_h[h]);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // (2^23 + q) - (2^23 + z)
          v[i] = __uint_as_float(__byte_perm(words[h], 0x4B000000u, 0x7440 + i)) - p.offset_f[h];
        }
        // |q - z| <= 255 fits bf16's 8 significant bits: both conversions are exact
        frag[h][0] = H2::from_floats(v[0], v[1]);
        frag[h][1] = H2::from_floats(v[2], v[3]);
        if constexpr (kScaled) {
          frag[h][0] = H2::mul(frag[h][0], p.scale_h[h]);
          frag[h][1] = H2::mul(frag[h][1], p.scale_h[h]);
        }
      }
    }
  }

  static __device__ __forceinline__ void dequantize(const u32 (&words)[kWordsPerTile], u32 scale2, u32 zero2,
                                                    u32 (&frag)[2][2]) {
    apply(words, prepare(scale2, zero2), frag);
  }
};

}  // namespace humming_aot::numerics
