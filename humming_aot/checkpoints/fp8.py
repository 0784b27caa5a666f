"""DeepSeek-V3-style fp8 checkpoints (``quant_method: fp8``; DeepSeek releases, transformers'
FineGrainedFP8, older AutoFP8).

Per layer with weight (N, K)::

    weight            float8_e4m3fn (N, K)
    weight_scale_inv  float32 or float8_e8m0fnu / uint8 e8m0 (ceil(N / bn), ceil(K / bk))
                      with [bn, bk] = weight_block_size (128 x 128); despite its name it MULTIPLIES:
                      W = weight * weight_scale_inv (the "inverse" is the quantizer's divisor)
    weight_scale      float32 (1,) instead, when there is no weight_block_size (per tensor)
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import E8M0_DTYPES, check_scales_positive, e8m0_scales, optional_bias, scalar_scale
from humming_aot.checkpoints.activations import fp8_scheme
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKERS", "load_layer"]

MARKERS = (".weight_scale_inv", ".weight_scale")


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    cfg = qc.config
    fmt = str(cfg.get("fmt", "e4m3"))
    if fmt != "e4m3":
        raise qc.key_error("fmt", f"is {fmt!r}; humming_aot loads float8_e4m3fn weights")
    name = f"{prefix}.weight"
    data = reader.tensor(name, ("F8_E4M3",), (None, None), "fp8 weight (N, K)")
    n, k = data.shape
    block = cfg.get("weight_block_size")
    if block is None:
        sname = f"{prefix}.weight_scale"
        scale = scalar_scale(reader, sname, ("F32", "BF16", "F16"), "a per-tensor weight_scale",
                             "without weight_block_size the scale is per tensor (one value)")
        qw = QuantizedWeight(format=WeightFormat.parse("float8e4m3:tensor"), codes=data.view(torch.uint8),
                             scales=scale.reshape(1))
    else:
        if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0
                                                                           for b in block)):
            raise qc.key_error("weight_block_size", f"is {block!r}; expected [rows, columns], e.g. [128, 128]")
        bn, bk = block
        sname = f"{prefix}.weight_scale_inv"
        shape = (-(-n // bn), -(-k // bk))
        if reader.has(sname) and reader.dtype_name(sname) in E8M0_DTYPES:
            scales, dtype = e8m0_scales(reader, sname, shape, "ue8m0 block scales"), "float8e8m0"
        else:
            scales = reader.tensor(sname, ("F32",), shape, f"{bn}x{bk} block weight_scale_inv").to(torch.float32)
            dtype = "float32"
        check_scales_positive(reader, sname, scales)
        qw = QuantizedWeight(format=WeightFormat.parse(f"float8e4m3:b{bn}x{bk}:s={dtype}"),
                             codes=data.view(torch.uint8), scales=scales)
    return CheckpointLayer(prefix=prefix, schema="fp8", weight=qw, bias=optional_bias(reader, prefix, n),
                           activations=fp8_scheme(reader, cfg, prefix))
