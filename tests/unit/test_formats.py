"""humming_aot.formats: every code of every format of at most 8 bits, against independent oracles
(ml_dtypes, torch float8 dtypes, a bit-string decoder, a brute-force nearest-value encoder)."""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from humming_aot import formats

SMALL_NAMES = [n for n in formats.all_names() if formats.get(n).bits <= 8]
FLOAT_NAMES = [n for n in SMALL_NAMES if formats.get(n).kind is formats.FormatKind.FLOAT]
INT_NAMES = [n for n in SMALL_NAMES if formats.get(n).is_integer]
LISTED = ["float4e2m1", "float6e3m2", "float6e2m3", "float5e2m2", "float3e1m1", "float7e3m3", "float4e0m3",
          "float8e4m3", "float8e5m2", "float8e8m0"]

ML_DTYPES = {
    "float4e2m1": ml_dtypes.float4_e2m1fn,
    "float6e2m3": ml_dtypes.float6_e2m3fn,
    "float6e3m2": ml_dtypes.float6_e3m2fn,
    "float8e4m3": ml_dtypes.float8_e4m3fn,
    "float8e5m2": ml_dtypes.float8_e5m2,
    "float8e3m4": ml_dtypes.float8_e3m4,
    "float8e8m0": ml_dtypes.float8_e8m0fnu,
    "int2": ml_dtypes.int2, "int4": ml_dtypes.int4, "uint1": ml_dtypes.uint1,
    "uint2": ml_dtypes.uint2, "uint4": ml_dtypes.uint4,
}
TORCH_FLOAT8 = {"float8e4m3": "float8_e4m3fn", "float8e5m2": "float8_e5m2", "float8e8m0": "float8_e8m0fnu"}


def all_codes(fmt: formats.ElementFormat) -> torch.Tensor:
    return torch.arange(fmt.num_codes, dtype=torch.uint8)


def assert_same_values(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values, equal NaN positions, equal signs of zero."""
    assert torch.equal(torch.isnan(actual), torch.isnan(expected))
    keep = ~torch.isnan(expected)
    assert torch.equal(actual[keep], expected[keep])
    assert torch.equal(torch.signbit(actual[keep]), torch.signbit(expected[keep]))


def bit_string_value(name: str, code: int) -> float:
    """Independent decoder: reads the bit string with exact fractions, following the documented
    special-value rules (B < 8, E <= 1 or M == 0: all finite; float8e4m3: fn; other 8-bit: IEEE)."""
    if name == "float8e8m0":
        return math.nan if code == 255 else float(Fraction(2) ** (code - 127))
    fmt = formats.get(name)
    bits = format(code, f"0{fmt.bits}b")
    if fmt.is_integer:
        return float(int(bits, 2) - (2 ** fmt.bits if fmt.is_signed and bits[0] == "1" else 0))
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    sign = -1 if bits[0] == "1" else 1
    exp_bits, man_bits = bits[1 : 1 + e], bits[1 + e :]
    fraction = Fraction(int(man_bits, 2) if man_bits else 0, 2**m)
    if e == 0:
        return sign * float(fraction * 2**m)
    if fmt.bits == 8 and e >= 2 and m >= 1:
        if (e, m) == (4, 3) and exp_bits + man_bits == "1" * 7:
            return math.nan
        if (e, m) != (4, 3) and exp_bits == "1" * e:
            return sign * math.inf if fraction == 0 else math.nan
    bias = 2 ** (e - 1) - 1
    exponent = int(exp_bits, 2)
    magnitude = fraction * Fraction(2) ** (1 - bias) if exponent == 0 else (1 + fraction) * Fraction(2) ** (exponent - bias)
    return sign * float(magnitude)


def brute_force_encode(fmt: formats.ElementFormat, x: torch.Tensor) -> torch.Tensor:
    """Nearest finite code by exhaustive search; ties to the even code, or with no mantissa bits
    to the larger magnitude unless the other candidate is 0; for signed floats only codes with x's
    sign are candidates (the sign of zero is kept)."""
    values = fmt.values().to(torch.float64)
    codes = torch.arange(fmt.num_codes)
    finite = torch.isfinite(values)
    dist = (x[:, None] - values[None, :]).abs()
    dist[:, ~finite] = math.inf
    if fmt.kind is formats.FormatKind.FLOAT:
        code_negative = (codes >> (fmt.bits - 1)).bool()
        dist[torch.signbit(x)[:, None] != code_negative[None, :]] = math.inf
    best = dist.min(dim=1, keepdim=True).values
    tied = dist == best
    if fmt.is_float and fmt.mantissa_bits == 0:
        preference = torch.where(values == 0, math.inf, values.abs())[None, :]
    else:
        preference = (2 - (codes & 1))[None, :]  # even codes first among the tied ones
    preference = torch.where(tied, preference.to(torch.float64), -1.0)
    return preference.argmax(dim=1)


# ------------------------------------------------------------------------------ exhaustive
@pytest.mark.parametrize("name", SMALL_NAMES)
def test_encode_decode_round_trip_every_code(name):
    fmt = formats.get(name)
    codes = all_codes(fmt)
    values = fmt.decode(codes)
    assert values.dtype == torch.float32 and values.shape == (fmt.num_codes,)
    finite_or_inf = ~torch.isnan(values)
    assert torch.equal(fmt.encode(values)[finite_or_inf], codes[finite_or_inf])
    assert int(torch.isnan(values).sum()) == {
        formats.SpecialValues.FINITE: 0,
        formats.SpecialValues.NAN_ONLY: 1 if fmt.kind is formats.FormatKind.EXPONENT else 2,
        formats.SpecialValues.IEEE: 2 * (2**fmt.mantissa_bits - 1),
    }[fmt.special_values]


@pytest.mark.parametrize("name", SMALL_NAMES)
def test_decode_matches_bit_string_oracle(name):
    fmt = formats.get(name)
    expected = torch.tensor([bit_string_value(name, c) for c in range(fmt.num_codes)], dtype=torch.float32)
    assert_same_values(fmt.decode(all_codes(fmt)), expected)


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_decode_matches_ml_dtypes(name):
    fmt = formats.get(name)
    codes = all_codes(fmt)
    expected = torch.from_numpy(codes.numpy().view(ML_DTYPES[name]).astype(np.float32))
    assert_same_values(fmt.decode(codes), expected)


@pytest.mark.parametrize("name", sorted(TORCH_FLOAT8))
def test_decode_matches_torch_float8(name):
    dtype = getattr(torch, TORCH_FLOAT8[name], None)
    if dtype is None:
        pytest.skip(f"this torch has no torch.{TORCH_FLOAT8[name]}")
    codes = all_codes(formats.get(name))
    assert_same_values(formats.get(name).decode(codes), codes.view(dtype).to(torch.float32))


@pytest.mark.parametrize("name", SMALL_NAMES)
def test_encode_matches_brute_force_nearest(name):
    fmt = formats.get(name)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    span = 1.25 * max(abs(fmt.min_value), fmt.max_value)
    x = (torch.rand(4096, generator=gen, dtype=torch.float64) * 2 - 1) * span
    if fmt.kind is formats.FormatKind.EXPONENT:  # spread over the exponent range instead
        x = torch.exp2((torch.rand(4096, generator=gen, dtype=torch.float64) * 2 - 1) * 130)
    finite_values = fmt.values().to(torch.float64)
    finite_values = finite_values[torch.isfinite(finite_values)]
    x = torch.cat([x, finite_values, finite_values * (1 + 2**-20), finite_values * (1 - 2**-20)])
    assert torch.equal(fmt.encode(x).long(), brute_force_encode(fmt, x))


@pytest.mark.parametrize("name", [n for n in SMALL_NAMES if formats.get(n).kind is not formats.FormatKind.EXPONENT])
def test_midpoints_round_to_even_code(name):
    fmt = formats.get(name)
    values = fmt.values().to(torch.float64)
    codes = torch.arange(fmt.num_codes)[torch.isfinite(values)]
    # -0 sorts before +0 so that each zero neighbours the values of its own sign.
    codes = codes[torch.argsort((~torch.signbit(values[codes])).long(), stable=True)]
    codes = codes[torch.argsort(values[codes], stable=True)]
    sorted_values = values[codes]
    distinct = sorted_values[1:] != sorted_values[:-1]  # skips the +-0 pair
    lo, hi = codes[:-1][distinct], codes[1:][distinct]
    mids = (sorted_values[:-1] + sorted_values[1:])[distinct] / 2
    encoded = fmt.encode(mids).long()
    if fmt.mantissa_bits == 0 and fmt.is_float:
        # Significand to even: away from zero between powers of two, towards 0 next to 0.
        larger = torch.where(values[lo].abs() > values[hi].abs(), lo, hi)
        smaller = torch.where(values[lo].abs() > values[hi].abs(), hi, lo)
        expected = torch.where(values[smaller] == 0, smaller, larger)
    else:
        expected = torch.where(lo % 2 == 0, lo, hi)
        assert bool((expected % 2 == 0).all())
    if fmt.kind is formats.FormatKind.FLOAT:  # a midpoint 0 between -s and +s: keeps its + sign
        expected = torch.where(mids == 0, 0, expected)
    assert torch.equal(encoded, expected)


def test_float8e8m0_ties_go_up_like_ml_dtypes():
    fmt = formats.get("float8e8m0")
    x = torch.tensor([1.5, 3.0, 0.75, 1.4999, 1.5001, 2.0**-100 * 1.5])
    expected = x.numpy().astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert fmt.encode(x).tolist() == expected.tolist() == [128, 129, 127, 127, 128, 28]


@pytest.mark.parametrize("name", ["float4e2m1", "float6e2m3", "float6e3m2", "float8e4m3", "float8e3m4"])
def test_encode_matches_ml_dtypes_cast_in_range(name):
    fmt = formats.get(name)
    gen = torch.Generator().manual_seed(7)
    x = (torch.rand(20000, generator=gen) * 2 - 1) * fmt.max_value
    expected = x.numpy().astype(ML_DTYPES[name]).view(np.uint8)
    assert fmt.encode(x).numpy().tolist() == expected.tolist()


def test_float8e4m3_encode_matches_clamped_torch_cast():
    x = torch.tensor([500.0, 448.0, 464.0, 465.0, 1e9, math.inf, -math.inf, -1e9, -0.0, 0.0, math.nan, 2.0**-10, 3 * 2.0**-10])
    x = torch.cat([x, torch.randn(10000, generator=torch.Generator().manual_seed(3)) * 200])
    # Older torch casts overflow to NaN, newer saturates; clamping first gives satfinite on both.
    expected = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(formats.get("float8e4m3").encode(x), expected)


# ----------------------------------------------------------------- saturation, inf, NaN, zero
@pytest.mark.parametrize("name", SMALL_NAMES)
def test_saturation_and_inf(name):
    fmt = formats.get(name)
    big = torch.tensor([max(fmt.max_value, -fmt.min_value) * 4 + 1, 1e300, math.inf], dtype=torch.float64)
    codes = fmt.encode(big)
    top = fmt.encode(torch.tensor([fmt.max_value]))
    if fmt.has_inf:
        assert torch.equal(codes[:2], top.expand(2)) and fmt.decode(codes[2:]).item() == math.inf
        assert fmt.decode(fmt.encode(torch.tensor([-math.inf]))).item() == -math.inf
    else:
        assert torch.equal(codes, top.expand(3))
    if fmt.is_signed:
        bottom = fmt.encode(torch.tensor([fmt.min_value]))
        assert fmt.decode(bottom).item() == fmt.min_value
        assert torch.equal(fmt.encode(-big[:2]), bottom.expand(2))


@pytest.mark.parametrize("name", SMALL_NAMES)
def test_nan_as_documented(name):
    fmt = formats.get(name)
    x = torch.tensor([1.0, math.nan])
    if fmt.has_nan:
        codes = fmt.encode(x)
        assert codes[1].item() == fmt.nan_code == (0xFF if name == "float8e8m0" else 0x7F)
        assert math.isnan(fmt.decode(codes[1:]).item())
    else:
        assert fmt.nan_code is None
        with pytest.raises(ValueError, match=r"no NaN encoding.*\(1,\)"):
            fmt.encode(x)


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_float_sign_of_zero_is_kept(name):
    fmt = formats.get(name)
    negative_zero = 1 << (fmt.bits - 1)
    tiny = fmt.smallest_positive / 4
    codes = fmt.encode(torch.tensor([-0.0, 0.0, -tiny, tiny], dtype=torch.float64)).tolist()
    assert codes == [negative_zero, 0, negative_zero, 0]


@pytest.mark.parametrize("name", INT_NAMES)
def test_integer_codes(name):
    fmt = formats.get(name)
    b = fmt.bits
    values = torch.arange(int(fmt.min_value), int(fmt.max_value) + 1, dtype=torch.float32)
    codes = fmt.encode(values)
    assert codes.tolist() == [int(v) % 2**b for v in values.tolist()]  # two's complement
    assert fmt.encode(torch.tensor([-0.0, -0.4, 0.5, -0.5])).tolist() == [0, 0, 0, 0]
    assert fmt.max_value == (2 ** (b - 1) - 1 if fmt.is_signed else 2**b - 1)


def test_named_examples():
    assert formats.get("int4").decode(torch.tensor([0xF, 0x8, 0x7], dtype=torch.uint8)).tolist() == [-1, -8, 7]
    assert formats.get("int4").encode(torch.tensor([2.5, 3.5, -2.5, 100.0, -100.0])).tolist() == [2, 4, 0xE, 7, 8]
    assert formats.get("float4e0m3").values().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, -0.0, -1, -2, -3, -4, -5, -6, -7]
    table = {"float4e2m1": 6, "float6e3m2": 28, "float6e2m3": 7.5, "float8e4m3": 448, "float8e5m2": 57344,
             "float5e2m2": 7, "float3e1m1": 3, "float7e3m3": 30, "float8e8m0": 2.0**127}
    assert {n: formats.get(n).max_value for n in table} == table
    assert formats.get("float4e2m1").smallest_positive == 0.5
    assert formats.get("float8e4m3").smallest_positive == 2.0**-9
    assert formats.get("float8e8m0").min_value == 2.0**-127


def test_float8e8m0_edges():
    fmt = formats.get("float8e8m0")
    x = torch.tensor([0.0, -0.0, 2.0**-140, -1.0, 2.0**200, math.inf, -math.inf, math.nan, 1.0], dtype=torch.float64)
    assert fmt.encode(x).tolist() == [0, 0, 0, 255, 254, 254, 255, 255, 127]
    assert not fmt.is_signed and not fmt.has_negative_zero and fmt.has_nan and not fmt.has_inf


@pytest.mark.parametrize("name", LISTED)
def test_listed_formats_exist(name):
    fmt = formats.get(name)
    assert fmt.name == name and fmt.bits == int(name[5]) and fmt.num_codes == 2**fmt.bits


# ---------------------------------------------------------------------------- wide formats
@pytest.mark.parametrize("name,dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_torch_float_formats(name, dtype):
    fmt = formats.get(name)
    x = torch.tensor([1.0, 1 + 2.0**-12, 1e30, -math.inf, math.nan, 3.0])
    encoded = fmt.encode(x)
    assert encoded.dtype == dtype and fmt.torch_dtype == dtype
    assert_same_values(fmt.decode(encoded), x.to(dtype).float())
    raw = encoded.view(torch.int16 if fmt.bits == 16 else torch.int32)
    assert_same_values(fmt.decode(raw), x.to(dtype).float())
    assert fmt.max_value == torch.finfo(dtype).max and fmt.has_inf and not fmt.saturates
    assert fmt.smallest_positive == float(torch.finfo(dtype).smallest_normal) * 2.0**-fmt.mantissa_bits
    with pytest.raises(ValueError, match="at most 8 bits"):
        fmt.values()
    with pytest.raises(ValueError, match="expects a"):
        fmt.decode(torch.zeros(2, dtype=torch.uint8))


# ------------------------------------------------------------------------------- plumbing
def test_encode_is_chunked_consistently(monkeypatch):
    fmt = formats.get("float8e4m3")
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)) * 100
    whole = fmt.encode(x)
    monkeypatch.setattr(formats, "_ENCODE_CHUNK", 77)
    assert torch.equal(fmt.encode(x), whole) and whole.shape == x.shape


def test_encode_accepts_integer_and_half_inputs():
    fmt = formats.get("int8")
    assert fmt.encode(torch.tensor([-300, 5, 300])).tolist() == [0x80, 5, 0x7F]
    assert torch.equal(formats.get("float4e2m1").encode(torch.tensor([0.75, 5.0], dtype=torch.bfloat16)),
                       torch.tensor([2, 6], dtype=torch.uint8))


@pytest.mark.parametrize(
    "name,message",
    [
        ("fp8", r"did you mean 'float8e4m3'"),
        ("float8_e4m3fn", r"did you mean 'float8e4m3'"),
        ("bf16", r"did you mean 'bfloat16'"),
        ("int9", r"valid names: int1\.\.int8"),
        ("int04", r"valid names"),
        ("float9e4m4", r"float\{B\}e\{E\}m\{M\} with B == 1\+E\+M <= 8"),
        ("float8e4m4", r"needs B == 1 \+ E \+ M"),
        ("float1e0m0", r"valid names"),
        ("float64", r"valid names"),
    ],
)
def test_unknown_names_raise_helpful_errors(name, message):
    with pytest.raises(ValueError, match=message):
        formats.get(name)


def test_get_rejects_non_strings_and_all_names_resolve():
    with pytest.raises(ValueError, match="must be a str"):
        formats.get(4)
    names = formats.all_names()
    assert len(names) == len(set(names)) and all(formats.get(n).name == n for n in names)


def test_decode_rejects_bad_codes():
    fmt = formats.get("float4e2m1")
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 15\].*\[0, 16\]"):
        fmt.decode(torch.tensor([0, 16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="integer codes"):
        fmt.decode(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        fmt.encode([1.0])
