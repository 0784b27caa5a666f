"""numerics/reciprocal_quotient.cuh's steps (r = RN(1/d); q0 = RN(x r), clamped to +-FLT_MAX in
by_product_any; e = RN(x - q0 d); q = RN(q0 + e r), the sign of x on q) replayed in exact
arithmetic on the CPU, against x / d correctly rounded, over every finite bfloat16 and float16 x
and divisors drawn afresh each run across the kernel's range [2^-64, 2^64], its ends, and the
quantizers' own amax / largest-code scales. The header's contract: the same float32 wherever
|x / d| >= 2^-36 (by_product: below 2^127; by_product_any: any, overflow to inf included), and
below that a quotient under 2^-35 with the sign of x. The GPU tests (tests/gpu/test_act_quant_gpu.py)
check the kernels' codes bit for bit against the references.
"""
from __future__ import annotations

import numpy as np
import pytest

F32, F64 = np.float32, np.float64


_OVERFLOW = float(np.finfo(F32).max) + 2.0**103  # halfway from FLT_MAX to 2^128: rounds to inf


def _rn32(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """RN32(hi + lo) for a float64 pair with hi = RN64(hi + lo): rounding hi alone is right unless
    hi lies exactly halfway between two float32 (or at the overflow threshold), where lo's sign
    picks the side."""
    with np.errstate(over="ignore"):
        r = hi.astype(F32)
    inward = (np.abs(hi) == _OVERFLOW) & (np.sign(lo) == -np.sign(hi))
    r = np.where(inward, np.copysign(np.finfo(F32).max, hi).astype(F32), r)
    r64 = r.astype(F64)
    other = np.nextafter(r, np.where(hi > r64, F32(np.inf), F32(-np.inf))).astype(F64)
    halfway = (hi != r64) & (hi == (r64 + other) / 2)
    toward_other = halfway & (np.sign(lo) == np.sign(other - r64))  # (lo == 0: hi's own tie, to even)
    return np.where(toward_other, other.astype(F32), r)


def _exact_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum: hi = RN64(a + b), lo = a + b - hi exactly."""
    hi = a + b
    bb = hi - a
    return hi, (a - (hi - bb)) + (b - bb)


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN32(a b + c) of float32 operands: a b is exact in float64 (24 + 24 bits), the sum exact as
    a TwoSum pair, then one rounding."""
    return _rn32(*_exact_sum(a.astype(F64) * b.astype(F64), c.astype(F64)))


def _steps(x: np.ndarray, d: F32, any_quotient: bool) -> np.ndarray:
    r = F32(1.0 / F64(d))  # RN32(1/d): float64 division then float32 rounding is innocuous (53 >= 2 x 24 + 2)
    with np.errstate(over="ignore"):
        q0 = (x.astype(F64) * F64(r)).astype(F32)  # the product is exact in float64: one rounding
    if any_quotient:
        q0 = np.clip(q0, -np.finfo(F32).max, np.finfo(F32).max)
    e = _fma32(-q0, np.full_like(x, d), x)
    q = _fma32(e, np.full_like(x, r), q0)
    return np.copysign(q, x)


def _reference(x: np.ndarray, d: F32) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (x.astype(F64) / F64(d)).astype(F32)  # innocuous double rounding, as above


def _all_finite(dtype) -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint16)
    if dtype == "bfloat16":
        x = (bits.astype(np.uint32) << 16).view(F32)
    else:
        x = bits.view(np.float16).astype(F32)
    return x[np.isfinite(x)]


def _divisors(rng: np.random.Generator) -> list[F32]:
    ends = [F32(2.0**-64), F32(2.0**64), F32(1.0), np.nextafter(F32(1.0), F32(2.0)), F32(1.0 / 3.0)]
    spread = [F32(2.0 ** rng.uniform(-64.0, 64.0)) for _ in range(24)]
    spread = [d for d in spread if F32(2.0**-64) <= d <= F32(2.0**64)]
    scales = []  # amax / largest code (int8, float8e4m3, float8e5m2, float4e2m1 x 448), amax any 16-bit value
    for dtype in ("bfloat16", "float16"):
        x = _all_finite(dtype)
        for amax in np.abs(rng.choice(x[x != 0], 4)):
            for largest in (127.0, 448.0, 57344.0, 6.0 * 448.0):
                d = F32(F64(amax) / largest)
                if F32(2.0**-64) <= d:
                    scales.append(d)
    return ends + spread + scales


@pytest.mark.parametrize("any_quotient", [False, True], ids=["by_product", "by_product_any"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_steps_give_the_correctly_rounded_quotient(dtype, any_quotient):
    seed = int(np.random.SeedSequence().entropy % (1 << 32))
    rng = np.random.default_rng(seed)
    x_all = _all_finite(dtype)
    checked = overflowed = 0
    for d in _divisors(rng):
        x = x_all if any_quotient else x_all[np.abs(x_all.astype(F64) / F64(d)) < 2.0**127]
        q, ref = _steps(x, d, any_quotient), _reference(x, d)
        overflowed += int(np.isinf(ref).sum())
        big = np.abs(ref) >= F32(2.0**-36)
        wrong = big & (q.view(np.uint32) != ref.view(np.uint32))
        assert not wrong.any(), (f"seed={seed} d={d!r}: x={x[wrong][:4]} gives {q[wrong][:4]}, "
                                 f"x / d rounds to {ref[wrong][:4]}")
        small = ~big
        assert (np.abs(q[small]) < F32(2.0**-35)).all(), f"seed={seed} d={d!r}: a tiny quotient came out large"
        assert (np.signbit(q[small]) == np.signbit(x[small])).all(), f"seed={seed} d={d!r}: sign lost"
        checked += int(big.sum())
    assert checked > 1_000_000, checked
    assert overflowed > 0 or not any_quotient or dtype == "float16", "no quotient reached inf: widen the divisors"


def test_a_remainder_below_the_subnormals_is_what_the_guard_is_for():
    """Without the contract's bound the steps do go wrong: x at the bottom of bfloat16's range over
    a divisor below 2^-64 gives a quotient a unit off (so the kernel divides there)."""
    x = _all_finite("bfloat16")
    x = x[(x > 0) & (x < F32(2.0**-120))]
    d = F32(2.0**-100) * F32(1.3)
    q, ref = _steps(x, d, True), _reference(x, d)
    assert (q.view(np.uint32) != ref.view(np.uint32)).any()


def test_an_overflowing_product_needs_the_clamp():
    """by_product on quotients past float32 gives NaN (inf - inf), not the division's inf: what the
    clamp of by_product_any is for."""
    x = np.array([3.0e38, -1.0e38], dtype=F32)
    d = F32(2.0**-64)
    with np.errstate(invalid="ignore"):  # (inf - inf)
        assert np.isnan(_steps(x, d, False)).all()
    q = _steps(x, d, True)
    assert np.array_equal(q, _reference(x, d)) and np.isinf(q).all()
