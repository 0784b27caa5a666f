"""Canonical quantized weights -> the layout the mma.sync kernels read (and back).

Packing runs once at load, on whatever device the weight is on (on a GPU it is a handful of torch
kernels: views, permutes and shifts). ``reference_pack_codes`` is an independent element-by-element
statement of the same layout for the tests; ``unpack`` inverts ``pack``.

Layout (read by csrc/include/humming_aot/kernel/dense_mma_sync.cuh and
numerics/int_dequantizer.cuh): the weight is cut into 16 (k) x 64 (n) units. In each unit, lane
``l`` of a warp (g = l // 4, t = l % 4) owns, for each of the four 16-column tiles j, the 8 values
it feeds to two m16n8k16 B fragments: columns n = 16 j + 8 h + g (h = 0, 1) and rows
k = 2 t + p + 8 q (p, q = 0, 1).

- 4-bit codes: one int32 word per (lane, j); nibble i = 4 p + 2 h + q.
- 8-bit codes: two int32 words per (lane, j), word h; byte i = 2 q + p.

The packed tensor is ``(K / 16, N * bits / 2)`` int32: row = 16-row K step, then units along N,
then 32 lanes, then ``bits`` words. Scales and zero points are ``(K / group, N)`` in the activation
dtype, with the columns of each 64-column unit reordered to ``g * 8 + 2 j + h`` so that one 16-byte
load gives a lane the scales of its 8 columns.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.spec import ZeroPoint

# Packed-layout constants (mirrored by the C++ headers named above).
UNIT_N = 64
UNIT_K = 16
_KERNEL_WEIGHT_FORMATS = {"int4": 4, "uint4": 4, "int8": 8}
_ACT_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True, eq=False)
class PackedWeight:
    """A weight in kernel layout, on one device.

    w:            (K / 16, N * bits / 2) int32, packed offset codes (see the module docstring)
    w_scale:      (K / group_size, N) act_dtype, unit-permuted
    w_zero_point: (K / group_size, N) act_dtype, unit-permuted, or None (symmetric)
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    w_zero_point: torch.Tensor | None
    n: int
    k: int
    group_size: int
    w_dtype: str  # "int4" (symmetric), "uint4" (with zero point) or "int8" (symmetric)
    act_dtype: torch.dtype
    format: str  # the WeightFormat string it was packed from

    @property
    def bits(self) -> int:
        return _KERNEL_WEIGHT_FORMATS[self.w_dtype]

    @property
    def zero_point(self) -> ZeroPoint:
        return ZeroPoint.NONE if self.w_zero_point is None else ZeroPoint.INTEGER

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
        """(N, K) act_dtype: exactly the weight the kernel multiplies with, (q - z) * s rounded once.

        Computed by the reference ``humming_aot.dequantize`` of the packed codes with the
        act-dtype scales the kernel reads, so the format semantics live in one place.
        """
        return _reference_dequantize(self).to(self.act_dtype)

    def as_quantized_weight(self):
        """The canonical QuantizedWeight of exactly what the kernel reads (act-dtype scales)."""
        from humming_aot.quant import QuantizedWeight, ScaleGranularity, WeightFormat, ZeroPointKind

        codes, scales, zeros = unpack(self)
        bits = self.bits
        if self.w_zero_point is None:  # offset code u -> two's complement code of u - 2^(b-1)
            codes = (codes - (1 << (bits - 1))) & ((1 << bits) - 1)
        fmt = WeightFormat(
            element=self.w_dtype,
            granularity=ScaleGranularity.GROUP,
            group_size=self.group_size,
            zero_point=ZeroPointKind.NONE if self.w_zero_point is None else ZeroPointKind.INTEGER,
        )
        return QuantizedWeight(
            format=fmt,
            codes=codes.to(torch.uint8),
            scales=scales.float().contiguous(),
            zero_points=None if self.w_zero_point is None else zeros.to(torch.uint8).contiguous(),
        )


def _reference_dequantize(packed: PackedWeight) -> torch.Tensor:
    from humming_aot.quant import dequantize

    return dequantize(packed.as_quantized_weight())


def _offset_codes(qw) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(N, K) unsigned codes u and (N, G) integer zero points for the kernel's (u - z) * s.

    Symmetric signed codes become offset codes u = c + 2^(b-1) with the implicit zero point
    2^(b-1), which is how GPTQ checkpoints store them.
    """
    fmt = qw.format
    element = fmt.element
    if element not in _KERNEL_WEIGHT_FORMATS:
        raise ValueError(
            f"pack: weight format {str(fmt)!r} has element {element!r}; the mma.sync kernels take "
            f"{sorted(_KERNEL_WEIGHT_FORMATS)} (more formats: issue #5)"
        )
    bits = _KERNEL_WEIGHT_FORMATS[element]
    codes = qw.codes.to(torch.int32)
    has_zero_point = qw.zero_points is not None
    if element.startswith("int"):
        if has_zero_point:
            raise ValueError(f"pack: signed {element} with a zero point is not packed; use uint{bits}:...:zp")
        return (codes + (1 << (bits - 1))) & ((1 << bits) - 1), None, element
    if not has_zero_point:
        raise ValueError(
            f"pack: {element} without a zero point has no kernel; quantize as 'int{bits}:...' "
            f"(symmetric) or 'uint{bits}:...:zp'"
        )
    return codes, qw.zero_points.to(torch.int32), element


def _group_size(qw, k: int) -> int:
    from humming_aot.quant import ScaleGranularity

    gran = qw.format.granularity
    if gran is ScaleGranularity.CHANNEL:
        return k
    if gran is ScaleGranularity.GROUP:
        return int(qw.format.group_size)
    raise ValueError(
        f"pack: scale granularity {gran.value!r} of {str(qw.format)!r} has no mma.sync kernel; "
        "use per-group ('g128') or per-channel ('channel') scales"
    )


def check_packable(n: int, k: int, group_size: int) -> None:
    """The alignment rule of the mma.sync kernels, as clear errors (also used by ops)."""
    from humming_aot.support import PREDICATES, ProblemShape

    problem = ProblemShape(m=1, n=n, k=k, group_size=group_size)
    errors = [msg for check in PREDICATES.values() if (msg := check(problem))]
    if errors:
        raise ValueError("cannot pack this weight for the mma.sync kernels: " + "; ".join(errors))


def pack(qw, act_dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> PackedWeight:
    """Repack a canonical ``QuantizedWeight`` (N x K) into kernel layout for `act_dtype` activations.

    Scales (and zero points) are converted to `act_dtype` (round to nearest); ``dequantized()``
    returns the exact operand the kernel then uses.
    """
    if act_dtype not in _ACT_DTYPES:
        raise ValueError(f"pack: act_dtype={act_dtype} is not supported; use torch.float16 or torch.bfloat16")
    if qw.codes.dim() != 2:
        raise ValueError(f"pack: expected a dense (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    group_size = _group_size(qw, k)
    check_packable(n, k, group_size)
    target = torch.device(device) if device is not None else qw.codes.device
    codes, zeros, element = _offset_codes(qw)
    codes = codes.to(target)
    scales = qw.scales.to(target, torch.float32).reshape(n, k // group_size)
    if not torch.isfinite(scales).all():
        raise ValueError("pack: the weight scales contain NaN or Inf")
    bits = _KERNEL_WEIGHT_FORMATS[element]
    w = pack_codes(codes, bits)
    w_scale = permute_unit_columns(scales.to(act_dtype).t().contiguous())
    w_zero_point = None
    if zeros is not None:
        w_zero_point = permute_unit_columns(zeros.to(target).reshape(n, -1).to(act_dtype).t().contiguous())
    return PackedWeight(
        w=w, w_scale=w_scale, w_zero_point=w_zero_point, n=n, k=k, group_size=group_size,
        w_dtype=element, act_dtype=act_dtype, format=str(qw.format),
    )


def _unit_view(u: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (unit, j, h, g, kstep, q, t, p) with n = 64 unit + 16 j + 8 h + g, k = 16 kstep + 8 q + 2 t + p."""
    n, k = u.shape
    return u.reshape(n // 64, 4, 2, 8, k // 16, 2, 4, 2)


def pack_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, K) unsigned codes (< 2^bits) -> (K / 16, N * bits / 2) int32 packed words."""
    n, k = u.shape
    v = _unit_view(u.to(torch.int64))
    if bits == 4:
        # -> (kstep, unit, g, t, j, p, h, q): lane = 4 g + t, word j, nibble 4 p + 2 h + q
        v = v.permute(4, 0, 3, 6, 1, 7, 2, 5).reshape(k // 16, n // 64, 32, 4, 8)
        shifts = torch.arange(0, 32, 4, device=u.device, dtype=torch.int64)
    elif bits == 8:
        # -> (kstep, unit, g, t, j, h, q, p): lane = 4 g + t, word 2 j + h, byte 2 q + p
        v = v.permute(4, 0, 3, 6, 1, 2, 5, 7).reshape(k // 16, n // 64, 32, 8, 4)
        shifts = torch.arange(0, 32, 8, device=u.device, dtype=torch.int64)
    else:
        raise ValueError(f"pack_codes: {bits}-bit codes are not packed by the mma.sync layout")
    words = (v << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(k // 16, n * bits // 2)


def unpack_codes(w: torch.Tensor, n: int, k: int, bits: int) -> torch.Tensor:
    """Inverse of ``pack_codes``: (K / 16, N * bits / 2) int32 -> (N, K) int32 codes."""
    words = w.to(torch.int64) & 0xFFFFFFFF
    mask = (1 << bits) - 1
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, device=w.device, dtype=torch.int64)
    if bits == 4:
        v = ((words.reshape(k // 16, n // 64, 32, 4, 1) >> shifts) & mask).reshape(k // 16, n // 64, 8, 4, 4, 2, 2, 2)
        # (kstep, unit, g, t, j, p, h, q) -> (unit, j, h, g, kstep, q, t, p)
        v = v.permute(1, 4, 6, 2, 0, 7, 3, 5)
    elif bits == 8:
        v = ((words.reshape(k // 16, n // 64, 32, 8, 1) >> shifts) & mask).reshape(k // 16, n // 64, 8, 4, 4, 2, 2, 2)
        # (kstep, unit, g, t, j, h, q, p) -> (unit, j, h, g, kstep, q, t, p)
        v = v.permute(1, 4, 5, 2, 0, 6, 3, 7)
    else:
        raise ValueError(f"unpack_codes: {bits}-bit codes are not packed by the mma.sync layout")
    del per_word
    return v.reshape(n, k).to(torch.int32)


def permute_unit_columns(x: torch.Tensor) -> torch.Tensor:
    """(G, N): within each 64-column unit, column 16 j + 8 h + g moves to g * 8 + 2 j + h."""
    rows, n = x.shape
    return x.reshape(rows, n // 64, 4, 2, 8).permute(0, 1, 4, 2, 3).reshape(rows, n)


def unpermute_unit_columns(x: torch.Tensor) -> torch.Tensor:
    rows, n = x.shape
    return x.reshape(rows, n // 64, 8, 4, 2).permute(0, 1, 3, 4, 2).reshape(rows, n)


def unpack(packed: PackedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes (N, K) int32 offset codes, scales (N, G) act dtype, zero points (N, G)).

    For symmetric formats the zero point is the implicit 2^(bits-1).
    """
    n, k = packed.n, packed.k
    codes = unpack_codes(packed.w, n, k, packed.bits)
    scales = unpermute_unit_columns(packed.w_scale).t()
    if packed.w_zero_point is None:
        zeros = torch.full_like(scales, float(1 << (packed.bits - 1)))
    else:
        zeros = unpermute_unit_columns(packed.w_zero_point).t()
    return codes, scales, zeros


def reference_pack_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Element-by-element statement of the packed layout (CPU, for tests): each code is OR-ed into
    the word and bit position the module docstring gives for it."""
    n, k = u.shape
    per_lane = bits  # words per lane per unit
    out = torch.zeros(k // 16, n // 64 * 32 * per_lane, dtype=torch.int64)
    nn_, kk_ = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    unit, within = nn_ // 64, nn_ % 64
    j, h, g = within // 16, (within % 16) // 8, within % 8
    kstep, kin = kk_ // 16, kk_ % 16
    q, t, p = kin // 8, (kin % 8) // 2, kin % 2
    lane = 4 * g + t
    if bits == 4:
        word, shift = j, 4 * (4 * p + 2 * h + q)
    elif bits == 8:
        word, shift = 2 * j + h, 8 * (2 * q + p)
    else:
        raise ValueError(f"{bits}-bit codes are not packed by the mma.sync layout")
    col = (unit * 32 + lane) * per_lane + word
    values = u.to(torch.int64) << shift
    flat = out.view(-1)
    flat.index_put_(((kstep * out.shape[1] + col).reshape(-1),), values.reshape(-1), accumulate=True)
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32)
