"""HQQ checkpoints (``quant_method: hqq``; the hqq package's HQQLinear state dict).

Grouping is on a flat view of the weight W (N, K): with ``axis = 1`` group j holds the g
consecutive elements W.flatten()[j g : (j + 1) g], i.e. g consecutive k of one row (the only axis
that maps onto scales along K). Per layer::

    W_q    uint8 (R / 2, g) for 4 bits, R = N K / g rows of the grouped view: the first half of
           the rows in the high nibbles, the second half in the low nibbles ("4bit_u8")
    scale  (R, 1) float, a multiplier (hqq stores the inverse of its quantizer's factor)
    zero   (R, 1) float zero point
    nbits, group_size, axis, shape: integer metadata tensors
    W[n, k] = (W_q - zero) * scale
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import FLOAT_SCALE_DTYPES, check_scales_positive, optional_bias
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKER", "load_layer"]

MARKER = ".W_q"


def _meta_int(reader: CheckpointReader, prefix: str, key: str) -> list[int]:
    name = f"{prefix}.{key}"
    return [int(v) for v in reader.tensor(name, ("I64", "I32", "I16", "I8", "U8"), None, f"HQQ meta {key}")
            .flatten().tolist()]


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    for key in ("zero_q", "scale_q", "meta_zero", "meta_scale"):
        if reader.has(f"{prefix}.{key}"):
            raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.{key!s} is present: the zero "
                                  "point / scale are themselves quantized (quant_zero / quant_scale), which humming_aot "
                                  "does not load; re-quantize with quant_zero=False, quant_scale=False")
    for flag in ("quant_zero", "quant_scale"):
        if reader.has(f"{prefix}.{flag}") and any(_meta_int(reader, prefix, flag)):
            raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.{flag} is set: the zero point "
                                  "/ scale are themselves quantized, which humming_aot does not load; re-quantize "
                                  "with quant_zero=False, quant_scale=False")
    if reader.has(f"{prefix}.packing"):
        raw = reader.tensor(f"{prefix}.packing", ("U8",), None, "HQQ packing name")
        packing = bytes(raw.tolist()).decode("ascii", "replace")
        if packing != "4bit_u8":
            raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.packing is {packing!r}; "
                                  "humming_aot loads HQQ's '4bit_u8' packing")
    (bits,) = _meta_int(reader, prefix, "nbits")
    (group,) = _meta_int(reader, prefix, "group_size")
    (axis,) = _meta_int(reader, prefix, "axis")
    shape = _meta_int(reader, prefix, "shape")
    if bits != 4:
        raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.nbits is {bits}; humming_aot "
                              "loads 4-bit HQQ ('4bit_u8' packing)")
    if axis != 1:
        raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.axis is {axis}; only axis=1 "
                              "groups run along K (re-quantize with axis=1)")
    if len(shape) != 2 or shape[1] % group:
        raise CheckpointError(f"{reader.file_of(prefix + MARKER)}: tensor {prefix}.shape is {shape}; expected "
                              f"[N, K] with K a multiple of group_size {group}")
    n, k = shape
    rows = n * k // group
    wq = reader.tensor(prefix + MARKER, ("U8",), (rows // 2, group), "HQQ 4bit_u8 W_q (rows / 2, group)")
    codes = torch.cat((wq >> 4, wq & 0x0F), dim=0).reshape(n, k)
    scale_name, zero_name = f"{prefix}.scale", f"{prefix}.zero"
    scale = reader.tensor(scale_name, tuple(FLOAT_SCALE_DTYPES), (rows, 1), "HQQ scale (rows, 1)")
    zero = reader.tensor(zero_name, tuple(FLOAT_SCALE_DTYPES), (rows, 1), "HQQ zero (rows, 1)")
    if reader.dtype_name(scale_name) != reader.dtype_name(zero_name):
        raise CheckpointError(f"{reader.file_of(zero_name)}: tensor {zero_name!r} is {reader.dtype_name(zero_name)} "
                              f"but {scale_name!r} is {reader.dtype_name(scale_name)}; they share one dtype")
    scale32 = scale.to(torch.float32).reshape(n, k // group)
    check_scales_positive(reader, scale_name, scale32)
    dtype = FLOAT_SCALE_DTYPES[reader.dtype_name(scale_name)]
    qw = QuantizedWeight(format=WeightFormat.parse(f"uint4:g{group}:zpf:s={dtype}"), codes=codes,
                         scales=scale32, zero_points=zero.to(torch.float32).reshape(n, k // group))
    return CheckpointLayer(prefix=prefix, schema="hqq", weight=qw, bias=optional_bias(reader, prefix, n))
