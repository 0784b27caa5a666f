"""Element number formats: what every code of a weight, activation or scale format means.

``get(name)`` returns the :class:`ElementFormat` for a canonical name:

* ``int1`` .. ``int8``: two's complement integers; code ``c`` means ``c - 2^b`` when its top bit
  is set (``int4`` code ``0xF`` is -1). ``uint1`` .. ``uint8``: unsigned integers.
* ``float{B}e{E}m{M}`` with ``B == 1 + E + M <= 8``: sign, E exponent bits (bias ``2^(E-1) - 1``),
  M mantissa bits, with subnormals. ``E == 0`` means sign-magnitude integers (``float4e0m3``
  holds -7..7). Special values:

  - ``B < 8`` (and any ``E <= 1``): the OCP MX convention, every code finite, no inf, no NaN
    (``float4e2m1`` max 6, ``float6e3m2`` max 28, ``float6e2m3`` max 7.5).
  - ``float8e4m3``: the "fn" format, no inf, magnitude ``0x7F`` is NaN, max 448.
  - other 8-bit layouts with E >= 2 and M >= 1 (``float8e5m2``, ``float8e3m4``, ...): IEEE-like,
    an all-ones exponent is inf (mantissa 0) or NaN. (With M == 0 there is no room for NaN, so
    those layouts are all finite too.)

* ``float8e8m0``: the OCP MX scale, unsigned powers of two ``2^(c - 127)``, code ``0xFF`` NaN.
* ``float16``, ``bfloat16``, ``float32``: the torch dtypes (see :class:`FormatKind`).

Encoding rules shared by every format of at most 8 bits (each code is one ``uint8``):

* Round to nearest, ties to even: the code whose least significant bit is 0 (integers and
  floats with mantissa bits). Formats without mantissa bits (``M == 0``, ``float8e8m0``) round
  the significand to even instead, so a tie ``1.5 * 2^k`` goes to ``2^(k+1)`` (as ml_dtypes does
  for float8e8m0) and a tie between 0 and the smallest value goes to 0. Rounding is exact: the
  input is widened to float64 and rounded once.
* Saturation: a finite value beyond the largest finite value encodes to it (the ``.satfinite``
  behaviour of PTX ``cvt``). ``+-inf`` saturates too, except in IEEE-like formats, which keep it.
* NaN encodes to the format's NaN code (``0x7F`` for the float8 formats, ``0xFF`` for
  ``float8e8m0``); formats with no NaN code (integers, small floats) raise ``ValueError``.
* Signed floats keep the sign of zero: ``-0.0`` and negative values that round to zero give the
  negative-zero code (``0x80`` in float8e4m3), so ``encode(decode(c)) == c`` for every non-NaN
  code. Integers have one zero.
* ``float8e8m0`` has no zero and no sign: ``0`` and values below ``2^-127`` give code 0
  (``2^-127``), negative values give the NaN code.

The wider formats ``float16``/``bfloat16``/``float32`` encode with :func:`round_to` (round to
nearest even, overflow to inf, NaN kept; once, also from float64) and return a tensor of that
dtype rather than raw bits.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from enum import Enum

import torch

__all__ = ["ElementFormat", "FormatKind", "SpecialValues", "all_names", "get", "round_to"]

# Elements per encode step: bounds the float64 temporaries (~32 MiB each) on large tensors.
_ENCODE_CHUNK = 1 << 22

_INT_RE = re.compile(r"^(u?)int(\d+)$")
_FLOAT_RE = re.compile(r"^float(\d+)e(\d+)m(\d+)$")
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# Names people write for these formats elsewhere, to point them at the canonical spelling.
_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8e4m3", "e4m3": "float8e4m3", "float8_e4m3fn": "float8e4m3", "fp8e4m3": "float8e4m3",
    "e5m2": "float8e5m2", "float8_e5m2": "float8e5m2", "fp8e5m2": "float8e5m2",
    "ue8m0": "float8e8m0", "e8m0": "float8e8m0", "float8_e8m0fnu": "float8e8m0",
    "fp4": "float4e2m1", "e2m1": "float4e2m1", "float4_e2m1fn": "float4e2m1",
    "s4": "int4", "u4": "uint4", "s8": "int8", "u8": "uint8",
}

_VALID_NAMES_HELP = (
    "int1..int8, uint1..uint8, float{B}e{E}m{M} with B == 1+E+M <= 8 (e.g. float4e2m1, "
    "float6e3m2, float8e4m3, float8e5m2), float8e8m0, float16, bfloat16, float32"
)


class FormatKind(str, Enum):
    """How codes map to numbers."""

    INTEGER = "integer"
    """Two's complement (signed) or plain binary (unsigned) integers, at most 8 bits."""
    FLOAT = "float"
    """Sign, exponent and mantissa with subnormals, at most 8 bits."""
    EXPONENT = "exponent"
    """Unsigned powers of two with no mantissa and no zero (float8e8m0, the MX scale)."""
    TORCH_FLOAT = "torch_float"
    """float16, bfloat16, float32: encode is a torch cast that returns that dtype, not uint8."""


class SpecialValues(str, Enum):
    """Which codes are not finite numbers."""

    FINITE = "finite"
    """Every code is a finite number: no inf, no NaN (integers, OCP MX FP4/FP6)."""
    NAN_ONLY = "nan_only"
    """The all-ones magnitude is NaN; there is no inf (float8e4m3 "fn", float8e8m0)."""
    IEEE = "ieee"
    """The all-ones exponent holds inf (mantissa 0) and NaN (mantissa != 0)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ElementFormat:
    """One number format; obtain it with :func:`get`, not by constructing it.

    For INTEGER formats ``exponent_bits`` is 0 and ``mantissa_bits`` the value bits; for E0
    floats the magnitude is the mantissa as an integer.
    """

    name: str
    kind: FormatKind
    bits: int
    is_signed: bool
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    special_values: SpecialValues

    # ----------------------------------------------------------------------------- properties
    @property
    def is_integer(self) -> bool:
        return self.kind is FormatKind.INTEGER

    @property
    def is_float(self) -> bool:
        return self.kind is not FormatKind.INTEGER

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    @property
    def has_inf(self) -> bool:
        return self.special_values is SpecialValues.IEEE

    @property
    def has_nan(self) -> bool:
        return self.special_values is not SpecialValues.FINITE

    @property
    def has_negative_zero(self) -> bool:
        return self.kind in (FormatKind.FLOAT, FormatKind.TORCH_FLOAT)

    @property
    def saturates(self) -> bool:
        """Whether encode clamps finite overflow to ``max_value`` (all but TORCH_FLOAT)."""
        return self.kind is not FormatKind.TORCH_FLOAT

    @property
    def nan_code(self) -> int | None:
        """The code encode produces for NaN, or None where the format has no NaN (or > 8 bits)."""
        if self.kind is FormatKind.EXPONENT:
            return 0xFF
        if self.kind is FormatKind.FLOAT and self.has_nan:
            return (1 << (self.bits - 1)) - 1
        return None

    @property
    def torch_dtype(self) -> torch.dtype:
        """What encode returns: ``torch.uint8`` codes, or the float dtype for TORCH_FLOAT."""
        return _TORCH_DTYPES.get(self.name, torch.uint8)

    @property
    def max_value(self) -> float:
        """The largest finite value."""
        if self.kind is FormatKind.TORCH_FLOAT:
            return float(torch.finfo(self.torch_dtype).max)
        if self.kind is FormatKind.INTEGER:
            return float((1 << (self.bits - 1)) - 1 if self.is_signed else (1 << self.bits) - 1)
        if self.kind is FormatKind.EXPONENT:
            return 2.0 ** (254 - self.exponent_bias)
        return _float_max(self.exponent_bits, self.mantissa_bits, self.exponent_bias, self.special_values)

    @property
    def min_value(self) -> float:
        """The most negative finite value (0 for unsigned integers, 2^-127 for float8e8m0)."""
        if self.kind is FormatKind.INTEGER:
            return float(-(1 << (self.bits - 1))) if self.is_signed else 0.0
        if self.kind is FormatKind.EXPONENT:
            return self.smallest_positive
        return -self.max_value

    @property
    def smallest_positive(self) -> float:
        """The smallest positive value (a subnormal for floats that have them)."""
        if self.kind is FormatKind.TORCH_FLOAT:
            return float(torch.finfo(self.torch_dtype).smallest_normal) * 2.0 ** -self.mantissa_bits
        if self.kind is FormatKind.INTEGER or self.exponent_bits == 0:
            return 1.0
        if self.kind is FormatKind.EXPONENT:
            return 2.0 ** -self.exponent_bias
        return 2.0 ** (1 - self.exponent_bias - self.mantissa_bits)

    # -------------------------------------------------------------------------------- methods
    def values(self) -> torch.Tensor:
        """float32 (num_codes,): the value of every code (NaN for NaN codes); <= 8-bit formats."""
        if self.kind is FormatKind.TORCH_FLOAT:
            raise ValueError(f"{self.name} has {self.num_codes} codes; values() is for formats of at most 8 bits")
        return _code_values(self).clone()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Round ``x`` (any real dtype, any shape and device) to this format.

        Returns uint8 codes of ``x``'s shape (TORCH_FLOAT: a tensor of that dtype). See the module
        docstring for rounding, saturation, NaN and signed-zero rules.
        """
        if not isinstance(x, torch.Tensor):
            raise ValueError(
                f"{self.name}.encode expects a torch.Tensor, got {type(x).__name__}: wrap it with torch.tensor(...)"
            )
        if x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{self.name}.encode expects a real floating or integer tensor, got {x.dtype}")
        if self.kind is FormatKind.TORCH_FLOAT:
            return round_to(x, self.torch_dtype)
        if not self.has_nan and x.is_floating_point() and bool(torch.isnan(x).any()):
            raise ValueError(
                f"{self.name} has no NaN encoding but the input holds NaN at {_first_nan(x)}: "
                "replace NaN values before encoding, or use a format with a NaN code (float8e4m3, float8e5m2)"
            )
        out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        flat_in, flat_out = x.reshape(-1), out.view(-1)
        for start in range(0, flat_in.numel(), _ENCODE_CHUNK):
            chunk = flat_in[start : start + _ENCODE_CHUNK].to(torch.float64)
            flat_out[start : start + _ENCODE_CHUNK] = _encode_chunk(self, chunk)
        return out

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 values of ``codes``: uint8 (or any integer) codes below ``num_codes``, any shape.

        TORCH_FLOAT formats take a tensor of their dtype (or integer raw bits of the same width).
        """
        if not isinstance(codes, torch.Tensor):
            raise ValueError(f"{self.name}.decode expects a torch.Tensor, got {type(codes).__name__}")
        if self.kind is FormatKind.TORCH_FLOAT:
            return _decode_torch_float(self, codes)
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(
                f"{self.name}.decode expects integer codes (uint8), got {codes.dtype}: pass the output of encode()"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.num_codes):
            raise ValueError(
                f"{self.name} codes must lie in [0, {self.num_codes - 1}], got values in "
                f"[{int(codes.min())}, {int(codes.max())}]: unpack packed codes to one code per element first"
            )
        lut = _code_values(self).to(codes.device)
        return lut[codes.to(torch.int32)]

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """float32: the value encode() picks for every element of ``x`` (``decode(encode(x))``)."""
        return self.decode(self.encode(x))


def get(name: str) -> ElementFormat:
    """The format called ``name``; raises ValueError for unknown names, listing the valid ones."""
    if not isinstance(name, str):
        raise ValueError(f"a format name must be a str, got {type(name).__name__} {name!r}")
    # A plain dict, not functools.lru_cache: torch.compile traces through the ops that parse a
    # format, and Dynamo warns that it skips an lru_cache wrapper.
    fmt = _FORMATS.get(name)
    if fmt is None:
        fmt = _FORMATS[name] = _build(name)
    return fmt


def all_names() -> list[str]:
    """Every canonical name :func:`get` accepts, in a fixed order."""
    names = [f"{prefix}int{b}" for prefix in ("", "u") for b in range(1, 9)]
    names += [f"float{1 + e + m}e{e}m{m}" for e in range(8) for m in range(8) if 2 <= 1 + e + m <= 8]
    return names + ["float8e8m0", *_TORCH_DTYPES]


# --------------------------------------------------------------------------------- construction
_FORMATS: dict[str, ElementFormat] = {}  # get()'s formats by name, each built once


def _build(name: str) -> ElementFormat:
    if name in _TORCH_DTYPES:
        finfo = torch.finfo(_TORCH_DTYPES[name])
        mant = {"float16": 10, "bfloat16": 7, "float32": 23}[name]
        return ElementFormat(
            name=name, kind=FormatKind.TORCH_FLOAT, bits=finfo.bits, is_signed=True,
            exponent_bits=finfo.bits - 1 - mant, mantissa_bits=mant,
            exponent_bias=(1 << (finfo.bits - 2 - mant)) - 1, special_values=SpecialValues.IEEE,
        )
    if name == "float8e8m0":
        return ElementFormat(
            name=name, kind=FormatKind.EXPONENT, bits=8, is_signed=False, exponent_bits=8,
            mantissa_bits=0, exponent_bias=127, special_values=SpecialValues.NAN_ONLY,
        )
    if m := _INT_RE.match(name):
        bits = int(m.group(2))
        if 1 <= bits <= 8 and str(bits) == m.group(2):
            return ElementFormat(
                name=name, kind=FormatKind.INTEGER, bits=bits, is_signed=not m.group(1),
                exponent_bits=0, mantissa_bits=bits - (0 if m.group(1) else 1), exponent_bias=0,
                special_values=SpecialValues.FINITE,
            )
    if m := _FLOAT_RE.match(name):
        bits, exp, mant = (int(g) for g in m.groups())
        if bits == 1 + exp + mant and 2 <= bits <= 8 and name == f"float{bits}e{exp}m{mant}":
            return ElementFormat(
                name=name, kind=FormatKind.FLOAT, bits=bits, is_signed=True, exponent_bits=exp,
                mantissa_bits=mant, exponent_bias=(1 << (exp - 1)) - 1 if exp else 0,
                special_values=_float_specials(bits, exp, mant),
            )
        if bits != 1 + exp + mant:
            raise ValueError(
                f"unknown format {name!r}: float{{B}}e{{E}}m{{M}} needs B == 1 + E + M (sign, exponent, "
                f"mantissa), here 1 + {exp} + {mant} = {1 + exp + mant} != {bits}"
            )
    hint = f" (did you mean {_ALIASES[name.lower()]!r}?)" if name.lower() in _ALIASES else ""
    raise ValueError(f"unknown format {name!r}{hint}; valid names: {_VALID_NAMES_HELP}")


def _float_specials(bits: int, exp: int, mant: int) -> SpecialValues:
    if bits < 8 or exp <= 1 or mant == 0:
        return SpecialValues.FINITE
    if (exp, mant) == (4, 3):
        return SpecialValues.NAN_ONLY
    return SpecialValues.IEEE


def _float_max(exp: int, mant: int, bias: int, specials: SpecialValues) -> float:
    if exp == 0:
        return float((1 << mant) - 1)
    top_field = (1 << exp) - 1
    if specials is SpecialValues.IEEE:
        return (2.0 - 2.0 ** -mant) * 2.0 ** (top_field - 1 - bias)
    if specials is SpecialValues.NAN_ONLY:
        # The all-ones magnitude is NaN, so the largest mantissa of the top exponent is one less.
        return (2.0 - 2.0 ** (1 - mant)) * 2.0 ** (top_field - bias)
    return (2.0 - 2.0 ** -mant) * 2.0 ** (top_field - bias)


# ------------------------------------------------------------------------------ decode tables
@functools.lru_cache(maxsize=None)
def _code_values(fmt: ElementFormat) -> torch.Tensor:
    return torch.tensor([_code_value(fmt, c) for c in range(fmt.num_codes)], dtype=torch.float32)


def _code_value(fmt: ElementFormat, code: int) -> float:
    if fmt.kind is FormatKind.INTEGER:
        return float(code - (1 << fmt.bits) if fmt.is_signed and code >> (fmt.bits - 1) else code)
    if fmt.kind is FormatKind.EXPONENT:
        return math.nan if code == 0xFF else 2.0 ** (code - fmt.exponent_bias)
    mant_bits, exp_bits = fmt.mantissa_bits, fmt.exponent_bits
    sign = -1.0 if code >> (fmt.bits - 1) else 1.0
    magnitude = code & ((1 << (fmt.bits - 1)) - 1)
    exp_field, mantissa = magnitude >> mant_bits, magnitude & ((1 << mant_bits) - 1)
    if fmt.special_values is SpecialValues.NAN_ONLY and magnitude == (1 << (fmt.bits - 1)) - 1:
        return math.nan
    if fmt.special_values is SpecialValues.IEEE and exp_field == (1 << exp_bits) - 1:
        return sign * math.inf if mantissa == 0 else math.nan
    if exp_bits == 0:
        return sign * mantissa
    if exp_field == 0:
        return sign * mantissa * 2.0 ** (1 - fmt.exponent_bias - mant_bits)
    return sign * ((1 << mant_bits) + mantissa) * 2.0 ** (exp_field - fmt.exponent_bias - mant_bits)


def _decode_torch_float(fmt: ElementFormat, codes: torch.Tensor) -> torch.Tensor:
    if codes.dtype == fmt.torch_dtype:
        return codes.to(torch.float32)
    raw = {16: torch.int16, 32: torch.int32}[fmt.bits]
    if codes.dtype in (raw, {16: torch.uint16, 32: torch.uint32}[fmt.bits]):
        return codes.view(fmt.torch_dtype).to(torch.float32)
    raise ValueError(
        f"{fmt.name}.decode expects a {fmt.torch_dtype} tensor (or {raw} raw bits), got {codes.dtype}"
    )


# ----------------------------------------------------------------------------------- encoding
def _encode_chunk(fmt: ElementFormat, x: torch.Tensor) -> torch.Tensor:
    """uint8 codes of a 1-D float64 tensor; rounding is exact because float64 holds every input."""
    if fmt.kind is FormatKind.INTEGER:
        return _encode_integer(fmt, x)
    if fmt.kind is FormatKind.EXPONENT:
        return _encode_exponent(fmt, x)
    return _encode_float(fmt, x)


def _encode_integer(fmt: ElementFormat, x: torch.Tensor) -> torch.Tensor:
    # torch.round rounds half to even; clamp saturates (inf included).
    values = torch.round(x).clamp_(fmt.min_value, fmt.max_value).to(torch.int16)
    return (values & (fmt.num_codes - 1)).to(torch.uint8)


def _encode_exponent(fmt: ElementFormat, x: torch.Tensor) -> torch.Tensor:
    magnitude = x.clamp(fmt.smallest_positive, fmt.max_value)  # 0 -> 2^-127, +inf -> 2^127
    _, exponent = torch.frexp(magnitude)  # magnitude = f * 2^exponent, f in [0.5, 1)
    exponent = exponent - 1
    # The significand magnitude / 2^exponent lies in [1, 2); round(1.5) == 2 sends ties up.
    carry = torch.round(magnitude * _exp2(-exponent)) - 1
    codes = (exponent + fmt.exponent_bias + carry.to(torch.int32)).clamp_(0, 254)
    return torch.where(torch.isnan(x) | (x < 0), 0xFF, codes).to(torch.uint8)


def _encode_float(fmt: ElementFormat, x: torch.Tensor) -> torch.Tensor:
    mant_bits = fmt.mantissa_bits
    sign = torch.signbit(x).to(torch.int32) << (fmt.bits - 1)
    magnitude = x.abs().clamp_(max=fmt.max_value)
    if fmt.exponent_bits == 0:
        mag_code = torch.round(magnitude).to(torch.int32)
    else:
        min_exponent = 1 - fmt.exponent_bias
        _, exponent = torch.frexp(magnitude)
        # floor(log2(magnitude)); subnormals and zero (frexp gives 0 for it) share the minimum.
        exponent = torch.where(magnitude == 0, min_exponent, (exponent - 1).clamp_(min=min_exponent))
        # steps counts multiples of the spacing 2^(exponent - M) at this binade; dividing by a power
        # of two is exact, so torch.round (half to even) does the only rounding. The magnitude code is
        # then (binade index) * 2^M + steps, and a round-up into the next binade carries naturally.
        steps = torch.round(magnitude * _exp2(mant_bits - exponent)).to(torch.int32)
        mag_code = ((exponent - min_exponent) << mant_bits) + steps
    codes = sign | mag_code
    if fmt.has_inf:
        inf_code = ((1 << fmt.exponent_bits) - 1) << mant_bits
        codes = torch.where(torch.isinf(x), sign | inf_code, codes)
    if fmt.has_nan:
        codes = torch.where(torch.isnan(x), fmt.nan_code, codes)
    return codes.to(torch.uint8)


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded once, to nearest even, to ``dtype`` (any shape and device).

    torch casts float64 to float16 and bfloat16 through float32, which rounds twice: 1 + 2^-8 +
    2^-30 becomes 1.0 in bfloat16 instead of 1 + 2^-7. Here the float64 value is first narrowed to
    float32 rounding to odd (truncate, then set the last bit if anything was cut off), which keeps
    the information the second rounding needs because float32 has more than two bits beyond
    either 16-bit significand; the cast from there rounds once. Other dtypes are plain casts.
    """
    if x.dtype != torch.float64 or dtype not in (torch.float16, torch.bfloat16):
        return x.to(dtype)
    narrow = x.to(torch.float32)
    inexact = torch.isfinite(narrow) & (narrow.to(torch.float64) != x)
    bits = narrow.view(torch.int32)
    # sign-magnitude: one less in the bits is one float32 ulp toward zero, for either sign
    bits = torch.where(inexact & (narrow.to(torch.float64).abs() > x.abs()), bits - 1, bits)
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float32).to(dtype)


def _exp2(exponent: torch.Tensor) -> torch.Tensor:
    """float64 2^exponent for integer exponents in [-1022, 1023], built from the bits: exact on every
    device (torch.ldexp goes through a float32 pow, which CUDA does not round exactly)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def _first_nan(x: torch.Tensor) -> tuple[int, ...]:
    index = torch.nonzero(torch.isnan(x))[0]
    return tuple(int(i) for i in index)
