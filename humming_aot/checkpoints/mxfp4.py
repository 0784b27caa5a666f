"""gpt-oss MXFP4 checkpoints (``quant_method: mxfp4``; OpenAI's gpt-oss release).

Only the MoE experts are MXFP4. For a layer prefix such as
``model.layers.0.mlp.experts.gate_up_proj``::

    <prefix>_blocks  uint8 (E, N, K / 32, 16)  the 32 K-elements of one block in 16 bytes, the even
                                               element in the low nibble (e2m1 codes)
    <prefix>_scales  uint8 (E, N, K / 32)      e8m0 exponents: the block's scale is 2^(s - 127)
    <prefix>_bias    (E, N), optional

gate_up_proj interleaves its rows (even rows gate, odd rows up); the rows are kept in file order.
The weight is (E, N, K): (out, in) per expert, as the blocks are stored.
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import FLOAT_DTYPES, e8m0_scales
from humming_aot.checkpoints.bitstream import unpack_nibbles
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKER", "decode_blocks", "load_layer"]

MARKER = "_blocks"


def decode_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 (..., K / 32, 16) -> uint8 e2m1 codes (..., K)."""
    *lead, groups, width = blocks.shape
    return unpack_nibbles(blocks.reshape(*lead, groups * width))


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    bname, sname = prefix + MARKER, prefix + "_scales"
    shape = reader.shape(bname) if reader.has(bname) else None
    blocks = reader.tensor(bname, ("U8",), (None, None, None, 16) if shape and len(shape) == 4 else (None, None, 16),
                           "mxfp4 blocks (E, N, K / 32, 16)")
    *lead, groups, _ = blocks.shape
    scales = e8m0_scales(reader, sname, (*lead, groups), "mxfp4 scales (E, N, K / 32)")
    qw = QuantizedWeight(format=WeightFormat.parse("mxfp4"), codes=decode_blocks(blocks), scales=scales)
    bias = None
    if reader.has(prefix + "_bias"):
        bias = reader.tensor(prefix + "_bias", FLOAT_DTYPES, tuple(lead), "mxfp4 expert bias (E, N)")
    if qw.codes.dim() not in (2, 3):
        raise CheckpointError(f"{reader.file_of(bname)}: tensor {bname!r} has shape {shape}; expected "
                              "(E, N, K / 32, 16) or (N, K / 32, 16)")
    return CheckpointLayer(prefix=prefix, schema="mxfp4", weight=qw, bias=bias)
