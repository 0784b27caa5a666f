"""AWQ GEMM checkpoints (``quant_method: awq``, ``version: gemm``; AutoAWQ, GPTQModel, auto-round's
``auto_round:auto_awq`` export).

Per layer with weight (N, K), 4 bits, group size g::

    qweight  int32 (K, N / 8)      codes along N; nibble i of word c holds column 8c + [0,2,4,6,1,3,5,7][i]
    qzeros   int32 (K / g, N / 8)  true (unsigned) zero points, the same interleave
    scales   float16 (K / g, N)    multipliers
    W[n, k] = (q[k, n] - z[k // g, n]) * scales[k // g, n]
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import check_scales_positive, float_scales, group_format, optional_bias
from humming_aot.checkpoints.bitstream import unpack_bitstream
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKER", "load_layer", "unpack_awq"]

MARKER = ".qweight"
# nibble i of a word holds column _NIBBLE_COLUMN[i] of its 8; reading nibbles in order and gathering
# with the inverse puts the columns back in order
_NIBBLE_COLUMN = (0, 2, 4, 6, 1, 3, 5, 7)
_UNINTERLEAVE = torch.tensor([_NIBBLE_COLUMN.index(c) for c in range(8)])  # [0, 4, 1, 5, 2, 6, 3, 7]


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """(R, N / 8) int32 -> (R, N) uint8 codes in column order."""
    rows, cols = words.shape
    nibbles = unpack_bitstream(words, 4, cols * 8).reshape(rows, cols, 8)
    return nibbles[..., _UNINTERLEAVE].reshape(rows, cols * 8)


def _settings(qc: QuantConfig) -> int:
    cfg = qc.config
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise qc.key_error("version", f"is {cfg.get('version')!r}; humming_aot loads AWQ 'gemm' checkpoints only "
                                      "(gemv / gemv_fast / marlin / exllama use other layouts)")
    bits = cfg.get("bits", cfg.get("w_bit", 4))
    if bits != 4:
        raise qc.key_error("bits", f"is {bits!r}; AWQ GEMM checkpoints hold 4-bit codes")
    if cfg.get("zero_point", True) is not True:
        raise qc.key_error("zero_point", "is false; AWQ GEMM always stores zero points (no producer writes "
                                         "zero_point=false), so this config does not match its tensors")
    group = cfg.get("group_size", cfg.get("q_group_size", 128))
    if not isinstance(group, int) or (group < 1 and group != -1):
        raise qc.key_error("group_size", f"is {group!r}; expected a positive integer or -1")
    return group


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    group = _settings(qc)
    qweight_name = prefix + MARKER
    shape = reader.shape(qweight_name)
    if len(shape) != 2:
        raise CheckpointError(f"{reader.file_of(qweight_name)}: tensor {qweight_name!r} has shape {shape}, "
                              "expected (K, N / 8) for AWQ GEMM")
    k, n = shape[0], shape[1] * 8
    g = k if group == -1 else group
    if k % g:
        raise qc.key_error("group_size", f"is {group} but does not divide K={k} of {qweight_name!r}")
    words = reader.tensor(qweight_name, ("I32",), (k, n // 8), "AWQ qweight (K, N / 8)")
    zeros_name, scales_name = f"{prefix}.qzeros", f"{prefix}.scales"
    zeros = reader.tensor(zeros_name, ("I32",), (k // g, n // 8), "AWQ qzeros (K / group, N / 8)")
    scales, scale_dtype = float_scales(reader, scales_name, (k // g, n), "AWQ scales (K / group, N)")
    check_scales_positive(reader, scales_name, scales)
    fmt = WeightFormat.parse(group_format("uint4", k, group, scale_dtype, "zp"))
    qw = QuantizedWeight(format=fmt, codes=unpack_awq(words).t().contiguous(),
                         scales=scales.t().contiguous(), zero_points=unpack_awq(zeros).t().contiguous())
    return CheckpointLayer(prefix=prefix, schema="awq", weight=qw, bias=optional_bias(reader, prefix, n))
