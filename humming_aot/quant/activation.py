"""Reference activation quantization: per-tensor (dynamic or static), per-token and per-group
(along K), to float8e4m3, float8e5m2, int8, int4, float4e2m1 or any other signed format of at most
8 bits, with float32 scale values representable in a scale dtype.

Recipes (float32 arithmetic, as vLLM's reference kernels do):

* integer elements: ``s = amax / (2^(b-1) - 1)`` (vLLM ``scaled_int8_quant``: amax / 127), codes
  = clamp(round_half_even(a / s), -2^(b-1), 2^(b-1) - 1). Weights use GPTQ's scale instead.
* float elements: ``s = amax / max_element``, codes = encode(a / s), saturating (a quotient past
  float32, inf, too: it gives the largest code, never an element's inf).
* float8e8m0 scales (MX, e.g. MXFP4 activations, group 32): ``s = 2^(floor(log2(amax)) - emax)``.
* float8e4m3 scales (NVFP4 activations, group 16): two levels, ``s = e4m3(amax / max_element / g)``
  and codes = encode(a / (s * g)) with a float32 global scale ``g``: the static ``global_scale``
  given (a calibrated input scale), or ``amax_tensor / (448 * max_element)``.
* static per-tensor: codes = encode(a / static_scale).

A group or token of zeros gets scale 1.0.
"""
from __future__ import annotations

import dataclasses
from enum import Enum

import torch

from humming_aot import formats
from humming_aot.quant import _scaling
from humming_aot.quant.weight_format import SCALE_DTYPES

__all__ = ["ActivationGranularity", "QuantizedActivation", "dequantize_activation", "quantize_activation"]


class ActivationGranularity(str, Enum):
    """Which activation elements share one scale; ``a`` has shape (*lead, K) with M = prod(lead) rows."""

    TENSOR = "tensor"
    """One scale for the whole tensor, dynamic (from amax) or static (given); scales shape (1,)."""
    TOKEN = "token"
    """One scale per row (token), dynamic; scales shape (*lead, 1)."""
    GROUP = "group"
    """One scale per row per group_size consecutive elements of K, dynamic (DeepSeek-V3 1x128,
    MX, NVFP4); scales shape (*lead, K / group_size)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class QuantizedActivation:
    """Quantized activations: ``a ~= decode(codes) * scale [* global_scale]``.

    ``codes`` uint8 (*lead, K); ``scales`` float32 (see :class:`ActivationGranularity`);
    ``global_scale`` float32 0-dim tensor when ``scale_dtype`` is float8e4m3, else None.
    """

    element: str
    granularity: ActivationGranularity
    group_size: int | None
    scale_dtype: str
    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _check_recipe(self.element, self.granularity, self.group_size, self.scale_dtype)
        if not isinstance(self.codes, torch.Tensor) or self.codes.dtype != torch.uint8 or self.codes.dim() < 1:
            raise ValueError("codes must be a uint8 tensor of shape (*lead, K)")
        expected = _scale_shape(self.granularity, self.group_size, tuple(self.codes.shape))
        scales = self.scales
        if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32 or tuple(scales.shape) != expected:
            raise ValueError(f"scales must be a float32 tensor of shape {expected}, got {_describe(self.scales)}")
        if (self.scale_dtype == "float8e4m3") != (self.global_scale is not None):
            raise ValueError("global_scale is required with float8e4m3 scales and must be None otherwise")
        glob = self.global_scale
        if glob is not None and (glob.dtype != torch.float32 or glob.dim() != 0):
            raise ValueError(f"global_scale must be a 0-dim float32 tensor, got {_describe(self.global_scale)}")


def quantize_activation(
    a: torch.Tensor,
    element: str,
    granularity: ActivationGranularity | str,
    *,
    group_size: int | None = None,
    scale_dtype: str = "float32",
    static_scale: torch.Tensor | float | None = None,
    global_scale: torch.Tensor | float | None = None,
) -> QuantizedActivation:
    """Quantize activations ``a`` (floating, (*lead, K), finite, any device).

    ``group_size`` (GROUP only) must divide K. ``static_scale`` (TENSOR only) fixes the per-tensor
    scale instead of deriving it from amax; it is rounded to ``scale_dtype``. ``global_scale``
    (float8e4m3 scales only) fixes the second-level scale instead of deriving it from amax.
    """
    granularity = ActivationGranularity(granularity)
    _check_recipe(element, granularity, group_size, scale_dtype)
    if not isinstance(a, torch.Tensor) or not a.is_floating_point() or a.dim() < 1 or a.numel() == 0:
        raise ValueError(f"a must be a non-empty floating point tensor of shape (*lead, K), got {_describe(a)}")
    scale_shape = _scale_shape(granularity, group_size, tuple(a.shape))
    if static_scale is not None and granularity is not ActivationGranularity.TENSOR:
        raise ValueError(
            f"a static scale is one per-tensor scale, but granularity is {granularity.value}: use TENSOR"
        )
    if global_scale is not None and scale_dtype != "float8e4m3":
        raise ValueError(
            f"global_scale is the second level of float8e4m3 scales (NVFP4), not of {scale_dtype} scales"
        )
    elem, scale_fmt = formats.get(element), formats.get(scale_dtype)
    k = a.shape[-1]
    x = a.to(torch.float32).reshape(-1, k)
    _scaling.check_finite(x, "the activation")
    rows, cols = {
        ActivationGranularity.TENSOR: (x.shape[0], k),
        ActivationGranularity.TOKEN: (1, k),
        ActivationGranularity.GROUP: (1, group_size),
    }[granularity]
    amax = _scaling.tile_reduce(x.abs(), rows, cols, torch.amax)
    glob = None
    if scale_dtype == "float8e4m3":
        if global_scale is None:
            glob = _scaling.dynamic_global_scale(amax, elem, scale_fmt)
        else:
            glob = _as_scale(global_scale, "global_scale", x.device)
    if static_scale is not None:
        given = _as_scale(static_scale, "static_scale", x.device).reshape(1, 1)
        grid = _scaling.to_scale_format(given, torch.ones_like(given, dtype=torch.bool), scale_fmt)
    else:
        # vLLM's symmetric integer activations: amax maps to the largest positive code.
        grid = _scaling.symmetric_scales(amax, elem, scale_fmt, int_denominator=elem.max_value, global_scale=glob)
    divisor = grid if glob is None else grid * glob
    quotients = x / _scaling.tile_expand(divisor, rows, cols, *x.shape)
    if elem.is_float:
        # Saturating, as vLLM's (x / s).clamp(-max, max) and the kernels' cvt.satfinite: a quotient
        # past float32 (a small static scale) is +-inf, which an IEEE-like element (float8e5m2)
        # would keep; finite ones past the largest value saturate in encode already.
        quotients = quotients.clamp(-elem.max_value, elem.max_value)
    codes = elem.encode(quotients)
    return QuantizedActivation(
        element=element, granularity=granularity, group_size=group_size, scale_dtype=scale_dtype,
        codes=codes.reshape(a.shape), scales=grid.reshape(scale_shape), global_scale=glob,
    )


def dequantize_activation(qa: QuantizedActivation) -> torch.Tensor:
    """float32 (*lead, K): ``decode(codes) * scale [* global_scale]``, float32, in that order."""
    if not isinstance(qa, QuantizedActivation):
        raise ValueError(f"dequantize_activation expects a QuantizedActivation, got {type(qa).__name__}")
    k = qa.codes.shape[-1]
    values = formats.get(qa.element).decode(qa.codes).reshape(-1, k)
    rows = values.shape[0]
    if qa.granularity is ActivationGranularity.TENSOR:
        per_element = qa.scales
    elif qa.granularity is ActivationGranularity.TOKEN:
        per_element = qa.scales.reshape(rows, 1)
    else:
        per_element = _scaling.tile_expand(qa.scales.reshape(rows, -1), 1, qa.group_size, rows, k)
    values = values * per_element
    if qa.global_scale is not None:
        values = values * qa.global_scale
    return values.reshape(qa.codes.shape)


def _check_recipe(
    element: str, granularity: ActivationGranularity, group_size: int | None, scale_dtype: str
) -> None:
    elem = formats.get(element)
    if elem.bits > 8 or not elem.is_signed or (elem.is_integer and elem.bits < 2):
        raise ValueError(
            f"activation element {element!r} is not supported: use a signed format of 2 to 8 bits "
            "(int8, int4, float8e4m3, float8e5m2, float4e2m1, ...)"
        )
    if not isinstance(granularity, ActivationGranularity):
        raise ValueError(f"granularity must be an ActivationGranularity, got {granularity!r}")
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale dtype {scale_dtype!r} is not supported; choose one of {', '.join(SCALE_DTYPES)}")
    is_group = granularity is ActivationGranularity.GROUP
    if is_group and (type(group_size) is not int or group_size < 1):
        raise ValueError(f"GROUP activation scales need a positive integer group_size, got {group_size!r}")
    if not is_group and group_size is not None:
        raise ValueError(f"group_size={group_size} means nothing for {granularity.value} scales: leave it None")
    if scale_dtype == "float8e4m3" and granularity is ActivationGranularity.TENSOR:
        raise ValueError(
            "float8e4m3 scales come with a global scale per tensor; one per-tensor scale needs no "
            "second level: use float32"
        )


def _scale_shape(
    granularity: ActivationGranularity, group_size: int | None, shape: tuple[int, ...]
) -> tuple[int, ...]:
    *lead, k = shape
    if granularity is ActivationGranularity.TENSOR:
        return (1,)
    if granularity is ActivationGranularity.TOKEN:
        return (*lead, 1)
    if k % group_size:
        raise ValueError(
            f"K={k} is not a multiple of the activation group size {group_size}: pad K with zeros to "
            f"{-(-k // group_size) * group_size}, or choose a group size that divides K"
        )
    return (*lead, k // group_size)


def _as_scale(value: torch.Tensor | float, name: str, device: torch.device) -> torch.Tensor:
    try:
        if isinstance(value, (str, bytes, bool)):
            raise TypeError(type(value).__name__)
        scale = torch.as_tensor(value, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a positive number or a one-element tensor, got {type(value).__name__} "
                         f"{value!r}") from None
    if scale.numel() != 1:
        raise ValueError(f"{name} must be one number, got shape {tuple(scale.shape)}")
    scale = scale.reshape(())
    if not (bool(torch.isfinite(scale)) and float(scale) > 0):
        raise ValueError(f"{name} must be positive and finite, got {float(scale)}")
    return scale


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
