"""Canonical quantized weights -> PackedWeight, the operands the kernels read (and back).

Packing runs once at load, on whatever device the weight is on (on a GPU it is a handful of torch
kernels: views, permutes and shifts). The bit layout of the packed words is
humming_aot/packed_layout.py; this module prepares what goes into it: the codes the kernel
decodes (offset integers or float bits), scales in the activation dtype (with a power of two
moved into the fp32 global scale where that keeps them in range), zero points, and the exact
operand the kernel multiplies with (``PackedWeight.dequantized()``). ``unpack`` inverts ``pack``.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from humming_aot.formats import round_to
from humming_aot.packed_layout import (
    check_layout_version,
    layout_version,
    pack_codes,
    permute_unit_columns,
    unpack_codes,
    unpermute_unit_columns,
)
from humming_aot.spec import FLOAT_WEIGHT_DTYPES, INT_WEIGHT_DTYPES, ZeroPoint, code_bits

_FLOAT_WEIGHT_FORMATS = frozenset(FLOAT_WEIGHT_DTYPES)
_KERNEL_WEIGHT_FORMATS = {name: code_bits(name) for name in INT_WEIGHT_DTYPES + FLOAT_WEIGHT_DTYPES}
_ACT_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_ACT_EXPONENT_BITS = {torch.float16: 5, torch.bfloat16: 8}


class PaddedShape:
    """The kernel's N x K (``n``, ``k``: multiples of 64) and the weight's own (``n_valid``,
    ``k_valid``: None where pack did not pad), for PackedWeight and moe.PackedExperts. An instance
    unpickled from before n_valid / k_valid existed reads the class default, None."""

    n: int
    k: int
    n_valid: int | None
    k_valid: int | None

    @property
    def out_features(self) -> int:
        """The weight's N (n, or n_valid where pack padded it)."""
        return self.n if self.n_valid is None else self.n_valid

    @property
    def in_features(self) -> int:
        """The weight's K (k, or k_valid where pack padded it)."""
        return self.k if self.k_valid is None else self.k_valid

    @property
    def padded(self) -> bool:
        """Whether pack padded N or K up to the kernels' multiple of 64."""
        return self.n_valid is not None or self.k_valid is not None

    def unpadded_view(self):
        """The same tensors with the kernel's N x K as their own (n_valid, k_valid None): what a
        launch sees once the activations are padded. Made once per (frozen) instance, so that what
        a GEMM keeps on the view (ops.gemm's bound launches) lasts as long as the weight."""
        view = self.__dict__.get("_unpadded_view")
        if view is None:
            view = self.__dict__["_unpadded_view"] = dataclasses.replace(self, n_valid=None, k_valid=None)
        return view

    def __getstate__(self) -> dict:
        """The fields only: what the instance keeps for the GEMMs (its unpadded view, ops.gemm's
        bound launches: pointers into this process's device memory) is not copied or pickled."""
        return {name: value for name, value in self.__dict__.items() if not name.startswith("_")}


@dataclasses.dataclass(frozen=True, eq=False)
class PackedWeight(PaddedShape):
    """A weight in kernel layout, on one device.

    w:            (K / 16, N * bits / 2) int32, packed codes (humming_aot/packed_layout.py): offset
                  integer codes, or the sign / exponent / mantissa bits of float codes
    w_scale:      (K / group_size, N) act_dtype, unit-permuted
    w_zero_point: (K / group_size, N) act_dtype, unit-permuted, or None (symmetric)
    float_zero_point: w_zero_point holds float (HQQ-style) zero points, applied as
                  round(round(q - z) * s) in act_dtype, instead of integer ones
    global_scale: fp32 factor the kernel applies to every output before the bias (the NVFP4
                  global scale, or a per-tensor scale; 1.0 when the format has none)
    n, k:         the kernel's output and input channels, multiples of 64
    n_valid, k_valid: the weight's own N and K where pack padded them up to n and k (zero codes,
                  unit scales; ops.gemm pads the activations' K with zeros and drops the padded
                  output columns), else None: ``out_features`` / ``in_features`` say which
    layout_version: packed_layout.layout_version(bits) of the humming_aot that packed it (set
                  when not given; None on a PackedWeight unpickled from before versions were
                  recorded). The GEMM refuses other versions (check_layout()).
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    w_zero_point: torch.Tensor | None
    n: int
    k: int
    group_size: int
    w_dtype: str  # "int1".."int8" (symmetric), "uint1".."uint8" (with a zero point), "float4e2m1", ...
    act_dtype: torch.dtype
    format: str  # the WeightFormat string it was packed from
    global_scale: float = 1.0
    float_zero_point: bool = False
    layout_version: int | None = None
    n_valid: int | None = None
    k_valid: int | None = None

    def __post_init__(self) -> None:
        if self.layout_version is None:
            object.__setattr__(self, "layout_version", layout_version(self.bits))

    def check_layout(self) -> None:
        """Raise a ValueError unless the words are in the packed layout this humming_aot reads."""
        # getattr: a PackedWeight unpickled from before the field existed has no such attribute
        # of its own, and the class default (None) reads as "not recorded"
        version = getattr(self, "layout_version", None)
        if version != layout_version(self.bits):  # every GEMM asks: build the message only to raise it
            check_layout_version(version, self.bits, f"this {self.w_dtype} PackedWeight")

    @property
    def bits(self) -> int:
        return _KERNEL_WEIGHT_FORMATS[self.w_dtype]

    @property
    def is_float(self) -> bool:
        return self.w_dtype in _FLOAT_WEIGHT_FORMATS

    @property
    def zero_point(self) -> ZeroPoint:
        if self.w_zero_point is None:
            return ZeroPoint.NONE
        return ZeroPoint.FLOAT if self.float_zero_point else ZeroPoint.INTEGER

    @property
    def device(self) -> torch.device:
        return self.w.device

    @property
    def nbytes(self) -> int:
        """Bytes of weight, scales and zero points the kernel reads once per GEMM."""
        total = self.w.numel() * 4 + self.w_scale.numel() * self.w_scale.element_size()
        if self.w_zero_point is not None:
            total += self.w_zero_point.numel() * self.w_zero_point.element_size()
        return total

    def to(self, device: torch.device | str) -> "PackedWeight":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return dataclasses.replace(
            self, w=move(self.w), w_scale=move(self.w_scale), w_zero_point=move(self.w_zero_point)
        )

    def dequantized(self) -> torch.Tensor:
        """(N, K) act_dtype: exactly the weight the kernel multiplies with, (q - z) * s or
        decode(code) * s rounded once (the global scale is not in it: see effective_weight).

        Computed by the reference ``humming_aot.dequantize`` of the packed codes with the
        act-dtype scales the kernel reads, so the format semantics live in one place. Float zero
        points round twice, as the kernel does: round(round(q - z) * s).
        """
        if self.float_zero_point:
            codes, scales, zeros = unpack(self)
            idx = torch.arange(self.in_features, device=codes.device) // self.group_size
            shifted = round_to(codes.double() - zeros.double()[:, idx], self.act_dtype)
            return round_to(shifted.double() * scales.double()[:, idx], self.act_dtype)
        return _reference_dequantize(self).to(self.act_dtype)

    def effective_weight(self, *, scales_in_fp32: bool = False) -> torch.Tensor:
        """(N, K) float64: the weight a kernel multiplies with, times the global scale, so that a
        float64 ``a @ W^T`` with it is exactly what the kernel computes before its fp32 rounding.

        By default that is dequantized(): (q - z) * s (or decode(code) * s) rounded once to
        act_dtype. A kernel whose ``KernelKey.scales_in_fp32`` is true multiplies the exact q - z
        and applies s to its fp32 sums: ``scales_in_fp32=True`` gives its weight, (q - z) * s
        unrounded (integer codes without float zero points only). ``humming_aot.ops
        .effective_weight`` picks the right one for a GEMM of m rows.
        """
        if scales_in_fp32:
            if self.is_float or self.float_zero_point:
                raise ValueError(
                    f"scales_in_fp32: no kernel applies the scales of {self.w_dtype} weights"
                    f"{' with float zero points' if self.float_zero_point else ''} to fp32 sums (only integer "
                    "codes without float zero points); use the default, rounded weight"
                )
            return _reference_dequantize(self).to(torch.float64) * self.global_scale  # exact in float32
        return self.dequantized().to(torch.float64) * self.global_scale

    def as_quantized_weight(self):
        """The canonical QuantizedWeight of exactly what the kernel multiplies with (act-dtype
        scales; the global scale is left out, as in dequantized())."""
        from humming_aot.quant import QuantizedWeight, ScaleGranularity, WeightFormat, ZeroPointKind

        codes, scales, zeros = unpack(self)
        bits = self.bits
        if not self.is_float and self.w_zero_point is None:  # offset code u -> two's complement code of u - 2^(b-1)
            codes = (codes - (1 << (bits - 1))) & ((1 << bits) - 1)
        kind = {ZeroPoint.NONE: ZeroPointKind.NONE, ZeroPoint.INTEGER: ZeroPointKind.INTEGER,
                ZeroPoint.FLOAT: ZeroPointKind.FLOAT}[self.zero_point]
        fmt = WeightFormat(
            element=self.w_dtype,
            granularity=ScaleGranularity.GROUP,
            # one group over the padded K is one over the weight's own K
            group_size=self.in_features if self.group_size == self.k else self.group_size,
            zero_point=kind,
            scale_dtype=_ACT_DTYPES[self.act_dtype] if kind is ZeroPointKind.FLOAT else "float32",
        )
        if kind is ZeroPointKind.NONE:
            zero_points = None
        else:
            zero_points = zeros.float() if kind is ZeroPointKind.FLOAT else zeros.to(torch.uint8)
            zero_points = zero_points.contiguous()
        return QuantizedWeight(format=fmt, codes=codes.to(torch.uint8), scales=scales.float().contiguous(),
                               zero_points=zero_points)


def _reference_dequantize(packed: PackedWeight) -> torch.Tensor:
    from humming_aot.quant import dequantize

    return dequantize(packed.as_quantized_weight())


def _kernel_codes(qw, act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(N, K) codes as the kernel reads them and (N, G) zero points (int32 or float32; or None).

    Symmetric signed integer codes become offset codes u = c + 2^(b-1) with the implicit zero
    point 2^(b-1), which is how GPTQ checkpoints store them. Float codes stay as they are.
    """
    fmt = qw.format
    element = fmt.element
    if element not in _KERNEL_WEIGHT_FORMATS:
        raise ValueError(
            f"pack: weight format {str(fmt)!r} has element {element!r}, which no kernel reads: use "
            "int1..int8, uint1..uint8 (with :zp) or a signed float float{B}e{E}m{M} of at most 8 bits"
        )
    bits = _KERNEL_WEIGHT_FORMATS[element]
    qw.check_codes()
    codes = qw.codes.to(torch.int32)
    has_zero_point = qw.zero_points is not None
    if element in _FLOAT_WEIGHT_FORMATS:
        _check_float_fits(element, act_dtype)
        return codes, None, element
    if element.startswith("int"):
        if has_zero_point:
            raise ValueError(f"pack: signed {element} with a zero point is not packed; use uint{bits}:...:zp")
        return (codes + (1 << (bits - 1))) & ((1 << bits) - 1), None, element
    if not has_zero_point:
        raise ValueError(
            f"pack: {element} without a zero point has no kernel; quantize as 'int{bits}:...' "
            f"(symmetric) or 'uint{bits}:...:zp'"
        )
    if qw.format.zero_point.value == "float":  # HQQ-style (quant.ZeroPointKind.FLOAT)
        return codes, qw.zero_points.to(torch.float32), element
    return codes, qw.zero_points.to(torch.int32), element


def _check_float_fits(element: str, act_dtype: torch.dtype) -> None:
    """Float weights are decoded into the activation dtype, which must hold every code exactly."""
    from humming_aot import formats

    elem = formats.get(element)
    act_exp = _ACT_EXPONENT_BITS[act_dtype]
    name = _ACT_DTYPES[act_dtype]
    if elem.exponent_bits > act_exp or (elem.exponent_bits == act_exp and not elem.has_inf):
        raise ValueError(
            f"pack: {element} values do not all fit {name} (its {act_exp} exponent bits"
            f"{'' if elem.exponent_bits > act_exp else ' hold inf/NaN in the top binade'}): "
            "pack for bfloat16 activations, or use a format with fewer exponent bits"
        )


def _scale_compensation(element: str, act_dtype: torch.dtype) -> int:
    """The power of two the float dequantizer multiplies scales by before using them
    (csrc/include/humming_aot/numerics/float_codes.cuh, kCompensation); 0 for E = 0 codes."""
    from humming_aot import formats

    elem = formats.get(element)
    if elem.exponent_bits == 0:
        return 0
    target_bias = 127 if act_dtype == torch.bfloat16 else 15
    return target_bias - elem.exponent_bias


def _kernel_scales(qw, n: int, k: int) -> tuple[torch.Tensor, int, float]:
    """(N, K / group) float32 scales the kernel applies per group, the group size, and the global
    scale it applies to the fp32 sums.

    Channel and group scales are used as they are; block scales are repeated over the block's
    channels; a tensor scale becomes the global scale (over unit group scales, so that no rounding
    to the activation dtype touches it); GROUP_WITH_GLOBAL keeps its global scale global.
    """
    from humming_aot.quant import ScaleGranularity

    fmt = qw.format
    gran = fmt.granularity
    scales = qw.scales.to(torch.float32)
    if gran is ScaleGranularity.CHANNEL:
        return scales.reshape(n, 1), k, 1.0
    if gran is ScaleGranularity.GROUP:
        return scales.reshape(n, k // fmt.group_size), int(fmt.group_size), 1.0
    if gran is ScaleGranularity.GROUP_WITH_GLOBAL:
        return scales.reshape(n, k // fmt.group_size), int(fmt.group_size), float(qw.global_scale.reshape(()))
    if gran is ScaleGranularity.TENSOR:
        if qw.zero_points is not None:
            raise ValueError("pack: a tensor scale with zero points has no kernel; use channel or group scales")
        return torch.ones((n, 1), dtype=torch.float32, device=scales.device), k, float(scales.reshape(()))
    if gran is ScaleGranularity.BLOCK:
        group = int(fmt.group_size)
        if k % group:
            raise ValueError(
                f"pack: K={k} is not a multiple of the block's K extent {group}: the kernels apply block "
                "scales as group scales, which need whole groups"
            )
        if qw.zero_points is not None:
            raise ValueError("pack: block scales with zero points have no kernel; use group scales")
        return scales.repeat_interleave(int(fmt.block_n), dim=0)[:n], group, 1.0
    raise ValueError(f"pack: scale granularity {gran.value!r} of {str(fmt)!r} has no kernel")


def check_packable(n: int, k: int, group_size: int) -> None:
    """The alignment rule of the kernels, as clear errors (also used by ops)."""
    from humming_aot.support import PREDICATES, ProblemShape

    problem = ProblemShape(m=1, n=n, k=k, group_size=group_size)
    errors = [msg for check in PREDICATES.values() if (msg := check(problem))]
    if errors:
        raise ValueError("cannot pack this weight for the kernels: " + "; ".join(errors))


def _act_scales(scales: torch.Tensor, act_dtype: torch.dtype, element: str) -> tuple[torch.Tensor, int]:
    """Scales in the activation dtype, times a power of two 2^j (the caller divides the global
    scale by it, which is exact): j keeps the dequantized weights and the float dequantizer's
    pre-multiplied scales finite, and lifts small scales out of the subnormal range where they
    would lose precision (float16 scales of fp8 weights, MX exponents below 2^-14). Rounding is
    to nearest; a scale that still overflows or flushes to zero is refused."""
    from humming_aot import formats

    name = _ACT_DTYPES[act_dtype]
    if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
        raise ValueError("pack: the weight scales must be positive and finite")
    finfo = torch.finfo(act_dtype)
    if element in _FLOAT_WEIGHT_FORMATS:
        elem = formats.get(element)
        largest = max(elem.max_value, 2.0 ** _scale_compensation(element, act_dtype))
        smallest = elem.smallest_positive
    else:
        largest, smallest = float((1 << _KERNEL_WEIGHT_FORMATS[element]) - 1), 1.0  # |q - z|
    s_max = float(scales.max()) if scales.numel() else 1.0
    s_min = float(scales.min()) if scales.numel() else 1.0
    # the largest j with s_max * 2^j * largest inside the range, and the j that makes the
    # smallest nonzero weight (and so every scale) normal
    j_max = math.floor(math.log2(finfo.max / (s_max * largest)))
    j_min = max(0, math.ceil(math.log2(finfo.tiny / (s_min * min(smallest, 1.0)))))
    shift = min(j_min, j_max)
    converted = (scales * 2.0**shift).to(act_dtype)
    if converted.numel() and float(converted.max()) * largest > finfo.max:  # rounded up past the edge
        shift -= 1
        converted = (scales * 2.0**shift).to(act_dtype)
    if not bool(torch.isfinite(converted).all()) or bool((converted == 0).any()):
        raise ValueError(
            f"pack: the weight scales span {s_min:g} to {s_max:g}, more than {name} (the dtype the kernel "
            "applies them in) holds at once: pack for bfloat16 activations, or rescale the weight"
        )
    return converted, shift


def pack(qw, act_dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> PackedWeight:
    """Repack a canonical ``QuantizedWeight`` (N x K) into kernel layout for `act_dtype` activations.

    Scales (and zero points) are converted to `act_dtype` (round to nearest: exact for float16,
    bfloat16, float8e4m3 and float8e8m0 scales), times a power of two that keeps them in its
    normal range (the global scale takes the inverse); block scales become group scales, a
    tensor or NVFP4 global scale becomes ``global_scale`` (applied in fp32 to the sums).
    ``dequantized()`` and ``effective_weight()`` return the exact operand the kernel then uses.
    """
    from humming_aot.quant import QuantizedWeight

    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"pack takes a humming_aot.quant.QuantizedWeight, got {type(qw).__name__}: quantize a float "
                        "weight first (humming_aot.quantize(w, 'int4:g128')) or load one from a checkpoint")
    if act_dtype not in _ACT_DTYPES:
        raise ValueError(f"pack: act_dtype={act_dtype} is not supported; use torch.float16 or torch.bfloat16")
    if qw.codes.dim() != 2:
        raise ValueError(f"pack: expected a dense (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    codes, zeros, element = _kernel_codes(qw, act_dtype)
    scales, group_size, global_scale = _kernel_scales(qw, n, k)
    n_valid = k_valid = None
    if n % 64 or k % 64:
        codes, scales, zeros, group_size, n_valid, k_valid = _pad_to_kernel(codes, scales, zeros, group_size, n, k)
        n, k = codes.shape
    check_packable(n, k, group_size)
    if not math.isfinite(global_scale) or global_scale <= 0:
        raise ValueError(f"pack: the global scale must be positive and finite, got {global_scale}")
    target = torch.device(device) if device is not None else qw.codes.device
    codes = codes.to(target)
    scales, shift = _act_scales(scales.to(target), act_dtype, element)
    global_scale = global_scale * 2.0**-shift
    bits = _KERNEL_WEIGHT_FORMATS[element]
    w = pack_codes(codes, bits)
    w_scale = permute_unit_columns(scales.t().contiguous())
    w_zero_point = None
    float_zero_point = zeros is not None and zeros.dtype == torch.float32
    if zeros is not None:
        zeros = zeros.to(target).reshape(n, -1)
        if float_zero_point and not bool(torch.isfinite(zeros.to(act_dtype)).all()):
            raise ValueError(f"pack: float zero points overflow {_ACT_DTYPES[act_dtype]}; pack for bfloat16 activations")
        w_zero_point = permute_unit_columns(zeros.to(act_dtype).t().contiguous())
    return PackedWeight(
        w=w, w_scale=w_scale, w_zero_point=w_zero_point, n=n, k=k, group_size=group_size,
        w_dtype=element, act_dtype=act_dtype, format=str(qw.format), global_scale=global_scale,
        float_zero_point=float_zero_point, n_valid=n_valid, k_valid=k_valid,
    )


def _pad_to_kernel(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int, n: int,
                   k: int) -> tuple:
    """(codes, scales, zeros, group_size, n_valid, k_valid) with N and K padded up to multiples of
    64 (tensor-parallel shards such as Qwen3-30B-A3B's K = 96 at TP8): zero codes, unit scales and
    zero zero points in the padding (any finite weight: the padded K meets zero activations, the
    padded N's outputs are dropped). One scale group over K stays one group over the padded K;
    groups that do not tile the padded K are refused with the padding the caller would need."""
    n_pad, k_pad = -(-n // 64) * 64, -(-k // 64) * 64
    if group_size == k:
        group_size = k_pad
    elif k_pad % group_size:
        raise ValueError(
            f"cannot pack this weight for the kernels: K={k} pads to {k_pad} (a multiple of 64), which groups "
            f"of {group_size} do not tile: quantize with a group size that divides {k_pad}, or pad K to a "
            f"multiple of {math.lcm(64, group_size)} before quantizing"
        )
    groups = k_pad // group_size
    codes = torch.nn.functional.pad(codes, (0, k_pad - k, 0, n_pad - n))
    scales = torch.nn.functional.pad(scales, (0, groups - scales.shape[1], 0, n_pad - n), value=1.0)
    if zeros is not None:
        zeros = zeros.reshape(n, -1)
        zeros = torch.nn.functional.pad(zeros, (0, groups - zeros.shape[1], 0, n_pad - n))
    return codes, scales, zeros, group_size, (n if n_pad != n else None), (k if k_pad != k else None)


def unpack(packed: PackedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes (N, K) int32 as the kernel reads them, scales (N, G) act dtype, zero points (N, G)),
    of the weight's own N x K (out_features x in_features: pack's padding left out).

    Integer codes are offset codes, and for symmetric formats the zero point is the implicit
    2^(bits-1); float codes have no zero point (None). Refuses a weight of another packed-layout
    version (PackedWeight.check_layout), whose words would unpack to other codes.
    """
    packed.check_layout()
    n, k = packed.n, packed.k
    codes = unpack_codes(packed.w, n, k, packed.bits)
    scales = unpermute_unit_columns(packed.w_scale).t()
    if packed.is_float:
        zeros = None
    elif packed.w_zero_point is None:
        zeros = torch.full_like(scales, float(1 << (packed.bits - 1)))
    else:
        zeros = unpermute_unit_columns(packed.w_zero_point).t()
    if packed.padded:  # the weight's own N x K, without the padding pack added
        n_valid, k_valid = packed.out_features, packed.in_features
        groups = 1 if packed.group_size == k else -(-k_valid // packed.group_size)
        codes, scales = codes[:n_valid, :k_valid], scales[:n_valid, :groups]
        zeros = None if zeros is None else zeros[:n_valid, :groups]
    return codes, scales, zeros
