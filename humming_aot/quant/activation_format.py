"""ActivationFormat: how a GEMM's activations are quantized (element format, scale sharing, scale
dtype), with a short string form that round-trips: ``ActivationFormat.parse(str(f)) == f``. The
activation side of a pairing, as WeightFormat is the weight side (``int4:g128`` weights with
``float8e4m3:token`` activations is W4A8).

Grammar (canonical form first; ``parse`` takes nothing else)::

    format      := preset | element ":" granularity [":s=" scale_dtype]
    element     := a signed humming_aot.formats name of 2 to 8 bits (float8e4m3, int8, int4, ...)
    granularity := "tensor"     one scale for the whole activation: dynamic (its amax) or static
                                (a calibrated input scale given when quantizing)
                 | "token"      one scale per row (token), dynamic
                 | "g" G        one scale per row per G consecutive K elements, dynamic
    scale_dtype := float32 (the default, left out of the canonical form) | bfloat16 | float16
                 | float8e4m3 (two levels: times one float32 global scale per tensor) | float8e8m0

Presets (``str`` prints the preset name whenever a format equals one):

    mxfp4  = float4e2m1:g32:s=float8e8m0    (OCP MX)
    mxfp8  = float8e4m3:g32:s=float8e8m0    (OCP MX)
    nvfp4  = float4e2m1:g16:s=float8e4m3    (NVIDIA; with its per-tensor global scale)

Examples: ``float8e4m3:token`` (FP8 W8A8 per token), ``float8e4m3:tensor`` (per tensor, static or
dynamic), ``float8e4m3:g128`` (DeepSeek-V3's 1 x 128), ``int8:token`` (SmoothQuant-style W8A8).

The recipes themselves are humming_aot.quant.activation's (``quantize`` calls it): the exact
references the activation-quantization kernels are held to.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from humming_aot.quant.activation import (
    ActivationGranularity,
    QuantizedActivation,
    _check_recipe,
    quantize_activation,
)

__all__ = ["ACTIVATION_PRESETS", "ActivationFormat"]

DEFAULT_SCALE_DTYPE = "float32"
_GROUP_RE = re.compile(r"^g([1-9]\d*)$")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ActivationFormat:
    """The quantization recipe of a GEMM's activations. ``group_size`` is the K extent of a scale
    (GROUP only, None otherwise)."""

    element: str
    granularity: ActivationGranularity
    group_size: int | None = None
    scale_dtype: str = DEFAULT_SCALE_DTYPE

    def __post_init__(self) -> None:
        if not isinstance(self.granularity, ActivationGranularity):
            try:
                object.__setattr__(self, "granularity", ActivationGranularity(self.granularity))
            except ValueError:
                raise ValueError(
                    f"granularity {self.granularity!r} is not one of "
                    f"{', '.join(g.value for g in ActivationGranularity)}"
                ) from None
        _check_recipe(self.element, self.granularity, self.group_size, self.scale_dtype)

    @property
    def has_global_scale(self) -> bool:
        """Whether the scales have a second level: one float32 global scale per tensor (NVFP4)."""
        return self.scale_dtype == "float8e4m3"

    def quantize(self, a: torch.Tensor, *, static_scale: torch.Tensor | float | None = None,
                 global_scale: torch.Tensor | float | None = None) -> QuantizedActivation:
        """Quantize ``a`` ((*lead, K), floating, finite) by this recipe, with the references of
        humming_aot.quant.activation (any device; exact). ``static_scale``: a per-tensor format's
        calibrated scale instead of the amax; ``global_scale``: a two-level format's second level
        instead of the one derived from the amax."""
        return quantize_activation(a, self.element, self.granularity, group_size=self.group_size,
                                   scale_dtype=self.scale_dtype, static_scale=static_scale,
                                   global_scale=global_scale)

    def __str__(self) -> str:
        for name, preset in ACTIVATION_PRESETS.items():
            if preset == self:
                return name
        gran = f"g{self.group_size}" if self.granularity is ActivationGranularity.GROUP else self.granularity.value
        parts = [self.element, gran]
        if self.scale_dtype != DEFAULT_SCALE_DTYPE:
            parts.append(f"s={self.scale_dtype}")
        return ":".join(parts)

    @classmethod
    def parse(cls, text: str | ActivationFormat) -> ActivationFormat:
        """The format written as ``text`` (see the module docstring; an ActivationFormat passes
        through unchanged); ValueError saying what is malformed otherwise."""
        if isinstance(text, ActivationFormat):
            return text
        if not isinstance(text, str):
            raise ValueError(f"an activation format is a str like 'float8e4m3:token', got {type(text).__name__}")
        if text in ACTIVATION_PRESETS:
            return ACTIVATION_PRESETS[text]
        element, *rest = text.split(":")
        if element in ACTIVATION_PRESETS:
            raise ValueError(_syntax_error(text, f"the preset {element!r} takes no fields: write it alone"))
        if not rest:
            raise ValueError(_syntax_error(text, "it has no granularity field"))
        token = rest[0]
        if token in ("tensor", "token"):
            fields: dict = {"granularity": ActivationGranularity(token)}
        elif m := _GROUP_RE.match(token):
            fields = {"granularity": ActivationGranularity.GROUP, "group_size": int(m.group(1))}
        else:
            raise ValueError(_syntax_error(text, f"{token!r} is not a granularity"))
        for option in rest[1:]:
            if not option.startswith("s=") or "scale_dtype" in fields:
                raise ValueError(_syntax_error(text, f"{option!r} is not an option (or repeats one)"))
            fields["scale_dtype"] = option[2:]
        try:
            return cls(element=element, **fields)
        except ValueError as err:
            raise ValueError(f"activation format {text!r}: {err}") from None


def _syntax_error(text: str, why: str) -> str:
    return (
        f"cannot parse activation format {text!r}: {why}. Expected element:granularity[:s=dtype] with "
        f"granularity tensor, token or g<size> (e.g. float8e4m3:token, int8:token, float8e4m3:g128), or a "
        f"preset: {', '.join(ACTIVATION_PRESETS)}"
    )


ACTIVATION_PRESETS = {
    "mxfp4": ActivationFormat(element="float4e2m1", granularity=ActivationGranularity.GROUP, group_size=32,
                              scale_dtype="float8e8m0"),
    "mxfp8": ActivationFormat(element="float8e4m3", granularity=ActivationGranularity.GROUP, group_size=32,
                              scale_dtype="float8e8m0"),
    "nvfp4": ActivationFormat(element="float4e2m1", granularity=ActivationGranularity.GROUP, group_size=16,
                              scale_dtype="float8e4m3"),
}
