"""QuantizedWeight (the canonical, unpacked form of a quantized weight), quantize and dequantize.

Value convention, for a weight of shape (*lead, N, K) (``lead`` is () or (E,) for MoE experts)::

    w[..., n, k] ~= (decode(codes[..., n, k]) - zero_point) * scale * global_scale

where decode is ``humming_aot.formats.get(format.element).decode``. Signed integers are two's
complement: ``int4`` code 0xF decodes to -1. GPTQ stores the same weight as an offset code
``u = c ^ 2^(b-1)`` with the implicit zero point 2^(b-1): ``(u - 2^(b-1)) * s == decode(c) * s``.

Producer recipes reproduced by :func:`quantize` (all arithmetic float32, in the producers' order):

* signed int, no zero point (GPTQ ``sym=True``): ``s = amax / ((2^b - 1) / 2)`` (= 2 amax / 15 for
  int4), rounded to the scale dtype; codes = clamp(round_half_even(w / s), -2^(b-1), 2^(b-1) - 1).
  The grid [-8 s, 7 s] covers [-amax, amax] to within half a step.
* uint with integer zero point (AWQ): the tile's range [min, max] is widened to contain 0 (as GPTQ
  ``sym=False`` does), ``s = (max - min) / (2^b - 1)`` rounded to the scale dtype,
  ``z = clamp(round(-min / s), 0, 2^b - 1)``, ``u = clamp(round(w / s) + z, 0, 2^b - 1)``.
* uint with float zero point: as above with ``z = -min / s`` rounded to the scale dtype and
  ``u = clamp(round(w / s + z), 0, 2^b - 1)``.
* float elements: ``s = amax / max_element`` (448 for float8e4m3) rounded to the scale dtype;
  codes = encode(w / s), saturating.
* float8e8m0 scales (MX): ``s = 2^(floor(log2(amax)) - emax_elem)`` (OCP MX v1.0 section 6.3),
  codes = encode(w / s), saturating.
* GROUP_WITH_GLOBAL (NVFP4): ``g = amax_tensor / (448 * 6)``; ``s = e4m3(amax_group / 6 / g)``;
  codes = encode(w / (s * g)).

Tiles whose values are all 0 get scale 1.0 (and zero point 0); a nonzero tile whose scale
underflows the scale dtype gets its smallest positive value. Nothing produces NaN.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import formats
from humming_aot.quant import _scaling
from humming_aot.quant.weight_format import ScaleGranularity, WeightFormat, ZeroPointKind

__all__ = ["QuantizedWeight", "dequantize", "quantize"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class QuantizedWeight:
    """A quantized weight, one code per element (packing for a kernel is a later step).

    * ``codes``: uint8 (*lead, N, K), ``formats.get(format.element).encode`` codes; for signed
      integers the two's complement bits, e.g. int4 -1 is 0x0F.
    * ``scales``: float32, ``format.scale_shape(codes.shape)``: TENSOR (*lead, 1), CHANNEL
      (*lead, N, 1), GROUP and GROUP_WITH_GLOBAL (*lead, N, K / group_size), BLOCK
      (*lead, ceil(N / block_n), ceil(K / group_size)); positive values exactly representable in
      ``format.scale_dtype``.
    * ``zero_points``: None (ZeroPointKind.NONE); uint8 in [0, 2^b - 1] (INTEGER) or float32
      representable in the scale dtype (FLOAT), the shape of ``scales``.
    * ``global_scale``: float32 (*lead,) (a 0-dim tensor for one weight) for GROUP_WITH_GLOBAL,
      else None.

    ``__post_init__`` checks types, shapes and devices; :meth:`validate` also checks values.
    """

    format: WeightFormat
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        fmt = self.format
        if not isinstance(fmt, WeightFormat):
            raise ValueError(
                f"format must be a WeightFormat, got {type(fmt).__name__} {fmt!r}: use WeightFormat.parse(...)"
            )
        _check_tensor("codes", self.codes, torch.uint8, None)
        if self.codes.dim() < 2:
            raise ValueError(f"codes have shape (N, K) or (E, N, K), got {tuple(self.codes.shape)}")
        scale_shape = fmt.scale_shape(self.codes.shape)
        _check_tensor("scales", self.scales, torch.float32, scale_shape, self.codes.device)
        if fmt.zero_point is ZeroPointKind.NONE:
            if self.zero_points is not None:
                raise ValueError(
                    f"{fmt} has no zero point, but zero_points were given: drop them or add :zp to the format"
                )
        else:
            dtype = torch.uint8 if fmt.zero_point is ZeroPointKind.INTEGER else torch.float32
            _check_tensor("zero_points", self.zero_points, dtype, scale_shape, self.codes.device)
        if fmt.granularity is ScaleGranularity.GROUP_WITH_GLOBAL:
            _check_tensor("global_scale", self.global_scale, torch.float32, self.shape[:-2], self.codes.device)
        elif self.global_scale is not None:
            raise ValueError(f"{fmt} has no global scale, but global_scale was given: drop it or use +global")

    @property
    def shape(self) -> tuple[int, ...]:
        """(*lead, N, K) of the weight."""
        return tuple(self.codes.shape)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """A copy with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return QuantizedWeight(**moved)

    def check_codes(self) -> None:
        """Check the codes (synchronizes a GPU): each one of the element's codes and none a NaN
        encoding, and integer zero points in the codes' range. ValueError otherwise. (pack asks
        this much: it masks codes to their bits, so a code out of range would land in its
        neighbour's.)"""
        fmt = self.format
        elem = formats.get(fmt.element)
        if self.codes.numel():
            high = int(self.codes.max())
            if high >= elem.num_codes:
                raise ValueError(f"{fmt.element} codes lie in [0, {elem.num_codes - 1}] (one unpacked code per element, "
                                 f"signed integers as their two's complement bits), got values in "
                                 f"[{int(self.codes.min())}, {high}]")
            if elem.nan_code is not None:
                nan = torch.isnan(elem.values()).to(self.codes.device)[self.codes.long()]
                if bool(nan.any()):
                    raise ValueError(f"{fmt.element} codes hold NaN encodings (e.g. {int(self.codes[nan][0]):#x}): a "
                                     "quantized weight must be finite")
        if fmt.zero_point is ZeroPointKind.INTEGER and self.zero_points.numel():
            if int(self.zero_points.max()) >= elem.num_codes:
                raise ValueError(f"integer zero points of {fmt.element} lie in [0, {elem.num_codes - 1}], "
                                 f"got {int(self.zero_points.max())}")

    def validate(self) -> None:
        """Check values (synchronizes a GPU): codes in range and not NaN codes, scales positive,
        finite and representable in the scale dtype, zero points in range. ValueError otherwise."""
        fmt = self.format
        self.check_codes()
        _check_scale_values("scales", self.scales, formats.get(fmt.scale_dtype), positive=True)
        if fmt.zero_point is ZeroPointKind.FLOAT:
            _check_scale_values("zero_points", self.zero_points, formats.get(fmt.scale_dtype), positive=False)
        if self.global_scale is not None:
            _check_scale_values("global_scale", self.global_scale, formats.get("float32"), positive=True)


# Stacked experts are quantized a few at a time, at most this many float32 bytes of them at once:
# each expert's recipe is its own (its scales, zero points and global scale come from its values
# alone, so the codes are the same bits), while the float32 copy of a whole stack and the recipe's
# temporaries take about five times its float32 bytes (DeepSeek-V3's 256 x 4096 x 7168 gate_up
# experts in bfloat16, 15 GB, ran an 80 GB GPU out of memory in one piece).
QUANTIZE_CHUNK_BYTES = 1 << 30


def quantize(w: torch.Tensor, fmt: WeightFormat | str) -> QuantizedWeight:
    """Quantize ``w`` (float16/bfloat16/float32/float64, (N, K) or (E, N, K), finite, any device)
    with the recipe of ``fmt`` (see the module docstring); the result lives on ``w``'s device.
    Experts are quantized QUANTIZE_CHUNK_BYTES of float32 at a time (the same codes as in one piece)."""
    fmt = WeightFormat.parse(fmt)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.numel() == 0:
        got = getattr(w, "dtype", type(w).__name__)
        raise ValueError(f"w must be a non-empty floating point torch.Tensor, got {got}")
    if w.is_meta:
        raise ValueError("w is on the meta device (a model made without its weights, e.g. under init_empty_weights): "
                         "load the weights first, then quantize them")
    if w.dim() > 3:
        raise ValueError(f"w must be one (N, K) weight or stacked experts (E, N, K), got shape {tuple(w.shape)}")
    fmt.scale_shape(w.shape)  # shape and group-size checks with their messages
    if w.dim() == 3:
        per = max(1, QUANTIZE_CHUNK_BYTES // (4 * w[0].numel()))
        if w.shape[0] > per:
            return _quantize_experts(w, fmt, per)
    return _quantize(w, fmt)


def _quantize_experts(w: torch.Tensor, fmt: WeightFormat, per: int) -> QuantizedWeight:
    """quantize of (E, N, K) experts `per` at a time, into tensors of the whole stack."""
    parts = {}
    for first in range(0, w.shape[0], per):
        part = _quantize(w[first:first + per], fmt, first)
        for field in ("codes", "scales", "zero_points", "global_scale"):
            value = getattr(part, field)
            if value is None:
                continue
            if field not in parts:
                parts[field] = value.new_empty((w.shape[0], *value.shape[1:]))
            parts[field][first:first + per] = value
    return QuantizedWeight(format=fmt, **parts)


def _quantize(w: torch.Tensor, fmt: WeightFormat, first: int = 0) -> QuantizedWeight:
    """quantize of w in one piece (w: experts from index `first` of a stack, for the messages)."""
    n, k = w.shape[-2:]
    x = w.to(torch.float32)
    _scaling.check_finite(x, "the weight", first)
    elem, scale_fmt = formats.get(fmt.element), formats.get(fmt.scale_dtype)
    rows, cols = fmt.tile_shape(w.shape)
    if fmt.zero_point is not ZeroPointKind.NONE:
        return _quantize_with_zero_point(x, fmt, elem, scale_fmt)
    amax = _scaling.tile_reduce(x.abs(), rows, cols, torch.amax)
    global_scale = None
    if fmt.granularity is ScaleGranularity.GROUP_WITH_GLOBAL:
        global_scale = _scaling.dynamic_global_scale(amax, elem, scale_fmt)
    # GPTQ's symmetric scale: a grid of 2^b - 1 steps spanning [-amax, amax].
    grid = _scaling.symmetric_scales(
        amax, elem, scale_fmt, int_denominator=(elem.num_codes - 1) / 2, global_scale=global_scale
    )
    divisor = grid if global_scale is None else grid * global_scale[..., None, None]
    codes = elem.encode(x / _scaling.tile_expand(divisor, rows, cols, n, k))
    return QuantizedWeight(
        format=fmt, codes=codes, scales=grid.reshape(fmt.scale_shape(w.shape)), global_scale=global_scale
    )


def _quantize_with_zero_point(
    x: torch.Tensor, fmt: WeightFormat, elem: formats.ElementFormat, scale_fmt: formats.ElementFormat
) -> QuantizedWeight:
    rows, cols = fmt.tile_shape(x.shape)
    n, k = x.shape[-2:]
    qmax = float(elem.num_codes - 1)
    low = _scaling.tile_reduce(x, rows, cols, torch.amin).clamp_(max=0)
    high = _scaling.tile_reduce(x, rows, cols, torch.amax).clamp_(min=0)
    scales = _scaling.to_scale_format(_scaling.divide(high - low, qmax), high > low, scale_fmt)
    full_scales = _scaling.tile_expand(scales, rows, cols, n, k)
    if fmt.zero_point is ZeroPointKind.INTEGER:
        zeros = torch.round(-low / scales).clamp_(0, qmax)
        full_zeros = _scaling.tile_expand(zeros, rows, cols, n, k)
        codes = (torch.round(x / full_scales) + full_zeros).clamp_(0, qmax)
        zero_points = zeros.to(torch.uint8)
    else:
        zero_points = scale_fmt.nearest(-low / scales)
        full_zeros = _scaling.tile_expand(zero_points, rows, cols, n, k)
        codes = torch.round(x / full_scales + full_zeros).clamp_(0, qmax)
    shape = fmt.scale_shape(x.shape)
    return QuantizedWeight(
        format=fmt,
        codes=codes.to(torch.uint8),
        scales=scales.reshape(shape),
        zero_points=zero_points.reshape(shape),
    )


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """float32 (*lead, N, K): ``(decode(codes) - zero_point) * scale * global_scale``, each step a
    float32 operation in that order (for NVFP4, decode * scale is exact, so only * global rounds)."""
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"dequantize expects a QuantizedWeight, got {type(qw).__name__}")
    fmt = qw.format
    rows, cols = fmt.tile_shape(qw.shape)
    *lead, n, k = qw.shape
    grid_shape = (*lead, -(-n // rows), -(-k // cols))

    def expand(per_tile: torch.Tensor) -> torch.Tensor:
        return _scaling.tile_expand(per_tile.reshape(grid_shape), rows, cols, n, k)

    values = formats.get(fmt.element).decode(qw.codes)
    if qw.zero_points is not None:
        values = values - expand(qw.zero_points.to(torch.float32))
    values = values * expand(qw.scales)
    if qw.global_scale is not None:
        values = values * qw.global_scale[..., None, None]
    return values


def _check_tensor(
    name: str,
    value: object,
    dtype: torch.dtype,
    shape: tuple[int, ...] | None,
    device: torch.device | None = None,
) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a {dtype} torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {value.dtype}: convert with .to({dtype})")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {tuple(shape)} for this format and weight shape, got {tuple(value.shape)}"
        )
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device} but codes are on {device}: move them to one device")


def _check_scale_values(
    name: str, value: torch.Tensor, scale_fmt: formats.ElementFormat, *, positive: bool
) -> None:
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite")
    if positive and not bool((value > 0).all()):
        raise ValueError(f"{name} must be positive, got a minimum of {float(value.min())}")
    if not bool((scale_fmt.nearest(value) == value).all()):
        raise ValueError(
            f"{name} must be exactly representable in {scale_fmt.name}: round them with "
            f"humming_aot.formats.get({scale_fmt.name!r}).nearest(...)"
        )
