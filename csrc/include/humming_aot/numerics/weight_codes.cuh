#pragma once
// The weight code families a kernel body is instantiated with: each names its code width (which
// fixes the packed layout, memory/stage_loader.cuh) and its dequantizer (numerics/*_dequantizer.cuh).
//   IntWeights<kBits>:        integer codes with an implicit or explicit zero point (int/uint 1-8)
//   FloatWeights<kExp, kMan>: signed small floats float{1+kExp+kMan}e{kExp}m{kMan} (kExp = 0:
//                             sign-magnitude integers), symmetric only

#include <humming_aot/numerics/float_dequantizer.cuh>
#include <humming_aot/numerics/int_dequantizer.cuh>

namespace humming_aot::numerics {

template <int kBits_>
struct IntWeights {
  static constexpr int kBits = kBits_;
  template <class Act, ZeroPointKind kZeroPoint>
  using Dequantizer = IntDequantizer<Act, kBits, kZeroPoint>;
};

template <int kExp, int kMan>
struct FloatWeights {
  static constexpr int kBits = 1 + kExp + kMan;
  template <class Act, ZeroPointKind kZeroPoint>
  struct Check {
    static_assert(kZeroPoint == ZeroPointKind::kImplicit, "float weights take no zero point");
    using Type = FloatDequantizer<Act, kExp, kMan>;
  };
  template <class Act, ZeroPointKind kZeroPoint>
  using Dequantizer = typename Check<Act, kZeroPoint>::Type;
};

}  // namespace humming_aot::numerics
