"""WeightFormat: how a weight is quantized (element format, scale sharing, scale dtype, zero point),
with a short string form that round-trips: ``WeightFormat.parse(str(f)) == f``.

Grammar (canonical form first; ``parse`` also takes the options in any order)::

    format      := preset | element ":" granularity [":" zero_point] [":s=" scale_dtype]
    preset      := "mxfp4" | "mxfp6e2m3" | "mxfp6e3m2" | "mxfp8" | "nvfp4"
    element     := a humming_aot.formats name of at most 8 bits (int4, uint4, float8e4m3, ...)
    granularity := "tensor"              one scale for the whole weight (per expert)
                 | "channel"             one scale per output channel (row n)
                 | "g" G                 one scale per row per G consecutive K elements
                 | "g" G "+global"       the same, times one float32 scale per tensor
                 | "b" BN "x" BK         one scale per BN x BK tile of (N, K)
    zero_point  := "zp"                  integer zero point per scale (uint elements, AWQ)
                 | "zpf"                 float zero point per scale (uint elements)
    scale_dtype := float32 (the default, left out of the canonical form) | bfloat16 | float16
                 | float8e4m3 | float8e8m0

Presets (``str`` prints the preset name whenever a format equals one):

    mxfp4      = float4e2m1:g32:s=float8e8m0          (OCP MX)
    mxfp6e2m3  = float6e2m3:g32:s=float8e8m0          (OCP MX)
    mxfp6e3m2  = float6e3m2:g32:s=float8e8m0          (OCP MX)
    mxfp8      = float8e4m3:g32:s=float8e8m0          (OCP MX)
    nvfp4      = float4e2m1:g16+global:s=float8e4m3   (NVIDIA)

Examples: ``int4:g128`` (GPTQ), ``uint4:g128:zp`` (AWQ), ``int8:channel``, ``float8e4m3:tensor``,
``float8e4m3:b128x128`` (DeepSeek-V3), ``int4:g128:s=bfloat16``.
"""
from __future__ import annotations

import dataclasses
import re
from enum import Enum

from humming_aot import formats

__all__ = ["PRESETS", "SCALE_DTYPES", "ScaleGranularity", "WeightFormat", "ZeroPointKind"]

SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8e4m3", "float8e8m0")
DEFAULT_SCALE_DTYPE = "float32"

_GROUP_RE = re.compile(r"^g([1-9]\d*)(\+global)?$")
_BLOCK_RE = re.compile(r"^b([1-9]\d*)x([1-9]\d*)$")


class ScaleGranularity(str, Enum):
    """Which weight elements share one scale."""

    TENSOR = "tensor"
    """One scale per weight (per expert for stacked MoE weights); scales shape (*lead, 1)."""
    CHANNEL = "channel"
    """One scale per output channel; scales shape (*lead, N, 1)."""
    GROUP = "group"
    """One scale per output channel per group_size consecutive elements of K (which group_size must
    divide); scales shape (*lead, N, K / group_size)."""
    BLOCK = "block"
    """One scale per block_n x group_size tile of (N, K); edge tiles may be partial (as in
    DeepSeek-V3 checkpoints); scales shape (*lead, ceil(N / block_n), ceil(K / group_size))."""
    GROUP_WITH_GLOBAL = "group_with_global"
    """GROUP scales times one float32 global scale per weight (NVFP4); global_scale shape (*lead,)."""


class ZeroPointKind(str, Enum):
    """How a group's zero is offset; only unsigned integer elements take a zero point."""

    NONE = "none"
    """Symmetric: value = decode(code) * scale."""
    INTEGER = "integer"
    """value = (code - z) * scale with an integer z in [0, 2^b - 1] per scale (AWQ), stored uint8."""
    FLOAT = "float"
    """value = (code - z) * scale with a float z per scale, representable in the scale dtype."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WeightFormat:
    """The quantization recipe of one weight. ``group_size`` is the K extent of a scale (GROUP,
    GROUP_WITH_GLOBAL, BLOCK) and ``block_n`` its N extent (BLOCK only); both None otherwise."""

    element: str
    granularity: ScaleGranularity
    group_size: int | None = None
    block_n: int | None = None
    scale_dtype: str = DEFAULT_SCALE_DTYPE
    zero_point: ZeroPointKind = ZeroPointKind.NONE

    def __post_init__(self) -> None:
        elem = formats.get(self.element)
        if elem.bits > 8 or elem.kind is formats.FormatKind.EXPONENT:
            raise ValueError(
                f"weight element {self.element!r} is not an element format: use an integer or float "
                "format of at most 8 bits (int4, uint4, float4e2m1, float8e4m3, ...)"
            )
        if not isinstance(self.granularity, ScaleGranularity):
            raise ValueError(f"granularity must be a ScaleGranularity, got {self.granularity!r}")
        if not isinstance(self.zero_point, ZeroPointKind):
            raise ValueError(f"zero_point must be a ZeroPointKind, got {self.zero_point!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(
                f"scale dtype {self.scale_dtype!r} is not supported; choose one of {', '.join(SCALE_DTYPES)}"
            )
        self._check_extents()
        if self.granularity is ScaleGranularity.GROUP_WITH_GLOBAL and self.scale_dtype != "float8e4m3":
            raise ValueError(
                f"a global scale widens the range of narrow float8e4m3 group scales (NVFP4); with "
                f"{self.scale_dtype} scales it has no use: write s=float8e4m3, or drop +global"
            )
        self._check_zero_point(elem)

    def _check_extents(self) -> None:
        gran = self.granularity
        wants_group = gran in (ScaleGranularity.GROUP, ScaleGranularity.GROUP_WITH_GLOBAL, ScaleGranularity.BLOCK)
        for field, value, wanted in (("group_size", self.group_size, wants_group),
                                     ("block_n", self.block_n, gran is ScaleGranularity.BLOCK)):
            if wanted and (type(value) is not int or value < 1):
                raise ValueError(f"{gran.value} scales need a positive integer {field}, got {value!r}")
            if not wanted and value is not None:
                raise ValueError(f"{field}={value!r} means nothing for {gran.value} scales: leave it None")

    def _check_zero_point(self, elem: formats.ElementFormat) -> None:
        if self.zero_point is ZeroPointKind.NONE:
            if elem.is_integer and not elem.is_signed:
                raise ValueError(
                    f"{self.element} without a zero point can only hold non-negative weights: use "
                    f"int{elem.bits} for symmetric (GPTQ-style) weights, or add a zero point (:zp, as AWQ)"
                )
            return
        if not (elem.is_integer and not elem.is_signed):
            raise ValueError(
                f"zero points need unsigned integer elements, got {self.element}: use uint{elem.bits} "
                f"with a zero point, or {self.element} without one"
            )
        if self.granularity is ScaleGranularity.GROUP_WITH_GLOBAL:
            raise ValueError("zero points do not combine with a global scale: use plain group scales (g<size>)")
        if self.zero_point is ZeroPointKind.FLOAT and self.scale_dtype == "float8e8m0":
            raise ValueError(
                "float zero points are stored in the scale dtype, and float8e8m0 cannot hold 0: choose another s="
            )

    # ------------------------------------------------------------------------------- shapes
    def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ``scales`` (and zero points) for a weight of shape (*lead, N, K); raises
        ValueError when K is not a multiple of the group size (GROUP, GROUP_WITH_GLOBAL)."""
        weight_shape = tuple(weight_shape)
        if len(weight_shape) < 2:
            raise ValueError(f"weights have shape (N, K) or (E, N, K), got {weight_shape}")
        *lead, n, k = weight_shape
        gran = self.granularity
        if gran is ScaleGranularity.TENSOR:
            return (*lead, 1)
        if gran is ScaleGranularity.CHANNEL:
            return (*lead, n, 1)
        if gran is ScaleGranularity.BLOCK:
            return (*lead, -(-n // self.block_n), -(-k // self.group_size))
        if k % self.group_size:
            raise ValueError(
                f"K={k} is not a multiple of the group size {self.group_size} of {self}: pad K with "
                f"zero weights up to {-(-k // self.group_size) * self.group_size}, or choose a group size "
                "that divides K"
            )
        return (*lead, n, k // self.group_size)

    def tile_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        """(rows, columns) of (N, K) that share one scale."""
        n, k = weight_shape[-2:]
        gran = self.granularity
        if gran is ScaleGranularity.TENSOR:
            return n, k
        if gran is ScaleGranularity.CHANNEL:
            return 1, k
        if gran is ScaleGranularity.BLOCK:
            return self.block_n, self.group_size
        return 1, self.group_size

    # ------------------------------------------------------------------------------ strings
    def __str__(self) -> str:
        for name, preset in PRESETS.items():
            if preset == self:
                return name
        parts = [self.element, self._granularity_token()]
        if self.zero_point is not ZeroPointKind.NONE:
            parts.append(_ZERO_POINT_TOKENS[self.zero_point])
        if self.scale_dtype != DEFAULT_SCALE_DTYPE:
            parts.append(f"s={self.scale_dtype}")
        return ":".join(parts)

    def _granularity_token(self) -> str:
        gran = self.granularity
        if gran in (ScaleGranularity.TENSOR, ScaleGranularity.CHANNEL):
            return gran.value
        if gran is ScaleGranularity.BLOCK:
            return f"b{self.block_n}x{self.group_size}"
        return f"g{self.group_size}" + ("+global" if gran is ScaleGranularity.GROUP_WITH_GLOBAL else "")

    @classmethod
    def parse(cls, text: str) -> WeightFormat:
        """The format written as ``text`` (see the module docstring; a WeightFormat passes through
        unchanged); ValueError saying what is malformed otherwise."""
        if isinstance(text, WeightFormat):
            return text
        if not isinstance(text, str):
            raise ValueError(f"a weight format is a str like 'int4:g128', got {type(text).__name__}")
        if text in PRESETS:
            return PRESETS[text]
        element, *rest = text.split(":")
        if element in PRESETS:
            why = (
                f"the preset {element!r} takes no fields: write it alone, or spell it out as "
                f"{_spelled_out(PRESETS[element])}"
            )
            raise ValueError(_syntax_error(text, why))
        if not rest:
            raise ValueError(_syntax_error(text, "it has no granularity field"))
        try:
            formats.get(element)
        except ValueError as err:
            raise ValueError(_syntax_error(text, str(err))) from None
        fields = {"element": element, **_parse_granularity(text, rest[0])}
        for option in rest[1:]:
            key, value = _parse_option(text, option)
            if key in fields:
                raise ValueError(_syntax_error(text, f"option {option!r} repeats an earlier one"))
            fields[key] = value
        try:
            return cls(**fields)
        except ValueError as err:
            raise ValueError(f"weight format {text!r}: {err}") from None


_ZERO_POINT_TOKENS = {ZeroPointKind.INTEGER: "zp", ZeroPointKind.FLOAT: "zpf"}


def _parse_granularity(text: str, token: str) -> dict:
    if token in ("tensor", "channel"):
        return {"granularity": ScaleGranularity(token)}
    if m := _GROUP_RE.match(token):
        gran = ScaleGranularity.GROUP_WITH_GLOBAL if m.group(2) else ScaleGranularity.GROUP
        return {"granularity": gran, "group_size": int(m.group(1))}
    if m := _BLOCK_RE.match(token):
        return {"granularity": ScaleGranularity.BLOCK, "block_n": int(m.group(1)), "group_size": int(m.group(2))}
    raise ValueError(_syntax_error(text, f"{token!r} is not a granularity"))


def _parse_option(text: str, option: str) -> tuple[str, object]:
    for kind, token in _ZERO_POINT_TOKENS.items():
        if option == token:
            return "zero_point", kind
    if option.startswith("s="):
        return "scale_dtype", option[2:]
    raise ValueError(_syntax_error(text, f"{option!r} is not an option"))


def _syntax_error(text: str, why: str) -> str:
    return (
        f"cannot parse weight format {text!r}: {why}. Expected element:granularity[:zp|:zpf][:s=dtype] "
        f"with granularity tensor, channel, g<size>, g<size>+global or b<n>x<k> (e.g. int4:g128, "
        f"uint4:g128:zp, float8e4m3:b128x128), or a preset: {', '.join(PRESETS)}"
    )


def _spelled_out(fmt: WeightFormat) -> str:
    return f"{fmt.element}:{fmt._granularity_token()}:s={fmt.scale_dtype}"


def _mx(element: str) -> WeightFormat:
    return WeightFormat(
        element=element, granularity=ScaleGranularity.GROUP, group_size=32, scale_dtype="float8e8m0"
    )


PRESETS: dict[str, WeightFormat] = {
    "mxfp4": _mx("float4e2m1"),
    "mxfp6e2m3": _mx("float6e2m3"),
    "mxfp6e3m2": _mx("float6e3m2"),
    "mxfp8": _mx("float8e4m3"),
    "nvfp4": WeightFormat(
        element="float4e2m1",
        granularity=ScaleGranularity.GROUP_WITH_GLOBAL,
        group_size=16,
        scale_dtype="float8e4m3",
    ),
}
