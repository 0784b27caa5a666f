#pragma once
// Fixed-width integer names and the 16-bit activation types of the kernels, with no CUDA toolkit
// header: the generated sources compile the same under nvcc and under NVRTC without -I paths to
// the toolkit. Activation types carry their PTX type name and the magic constants the integer
// dequantizer uses (see numerics/int_dequantizer.cuh).

namespace humming_aot {

using u32 = unsigned int;
using i64 = long long;
using u64 = unsigned long long;

// Select<c, A, B>::Type is A if c else B: std::conditional without <type_traits>. Naming a class
// template specialization here does not instantiate it, so the branch not taken may fail its
// static_asserts (the mma.sync body names both mainloops).
template <bool kFirst, class First, class Second>
struct Select {
  using Type = First;
};
template <class First, class Second>
struct Select<false, First, Second> {
  using Type = Second;
};

namespace numerics {

// float16: 10 mantissa bits, so 1024 + q is exact for codes q < 1024.
struct Float16 {
  static constexpr bool kIsBFloat16 = false;
  static constexpr u32 kMagicBits = 0x6400u;  // 1024.0 as f16
  static constexpr int kMagicValue = 1024;
};

// bfloat16: 7 mantissa bits, so 128 + q is exact for codes q < 128 (4-bit codes); 8-bit codes
// go through fp32 instead.
struct BFloat16 {
  static constexpr bool kIsBFloat16 = true;
  static constexpr u32 kMagicBits = 0x4300u;  // 128.0 as bf16
  static constexpr int kMagicValue = 128;
};

enum class ZeroPointKind {
  kImplicit,  // symmetric: zero point 2^(bits-1), a compile-time constant
  kInteger,   // explicit zero point per scale group, stored as a value of the activation dtype
  kFloat,     // a float (HQQ-style) zero point per scale group, in the activation dtype:
              // w = round(round(q - z) * s), each step rounded to the activation dtype
};

}  // namespace numerics
}  // namespace humming_aot
