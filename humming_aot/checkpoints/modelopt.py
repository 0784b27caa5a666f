"""NVIDIA ModelOpt checkpoints (``hf_quant_config.json``, ``quant_method: modelopt``). The
``quant_algo`` decides the layout (config.json may also carry a compressed-tensors-looking
``config_groups``, which is ignored). Every scale multiplies.

* ``FP8``: ``weight`` float8_e4m3fn (N, K), ``weight_scale`` float32 0-d (or (1,)).
* ``FP8_PER_CHANNEL_PER_TOKEN``: ``weight_scale`` float32 (N,) (or (N, 1)).
* ``FP8_PB_WO``: ``weight_scale`` float32 (N / 128, 1, K / 128, 1), one per 128 x 128 block.
* ``NVFP4`` / ``W4A16_NVFP4``: ``weight`` uint8 (N, K / 2), even k in the low nibble;
  ``weight_scale`` float8_e4m3fn (N, K / 16); ``weight_scale_2`` float32 0-d, the global scale.
* ``MXFP4``: ``weight`` uint8 (N, K / 2), ``weight_scale`` uint8 e8m0 (N, K / 32). ``MXFP8``:
  ``weight`` float8_e4m3fn (N, K), the same scales.
* ``W4A16_AWQ`` (INT4_AWQ): ``weight`` uint8 (N / 2, K): rows 2n and 2n + 1 in the low and high
  nibble, signed int4; ``weight_scale`` float32 (N, K / g); optional ``pre_quant_scale`` (K,):
  the layer computes ``(x * pre_quant_scale) @ W^T``.
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import (
    FLOAT_DTYPES,
    check_scales_positive,
    e8m0_scales,
    optional_bias,
    scalar_scale,
)
from humming_aot.checkpoints.activations import modelopt_scheme
from humming_aot.checkpoints.bitstream import unpack_nibbles
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKER", "load_layer"]

MARKER = ".weight_scale"
ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP4", "MXFP8", "W4A16_AWQ")


def _scalar(reader: CheckpointReader, name: str) -> torch.Tensor:
    return scalar_scale(reader, name, ("F32",), "a float32 scalar (0-d or (1,))")


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    algo = str(qc.config.get("quant_algo", "")).upper()
    if algo not in ALGOS:
        raise qc.key_error("quant_algo", f"is {qc.config.get('quant_algo')!r}; humming_aot loads {', '.join(ALGOS)}")
    w_name, s_name = f"{prefix}.weight", f"{prefix}.weight_scale"
    input_scale = None
    if algo.startswith("FP8") or algo == "MXFP8":
        data = reader.tensor(w_name, ("F8_E4M3",), (None, None), f"ModelOpt {algo} weight (N, K)")
        n, k = data.shape
        codes = data.view(torch.uint8)
        if algo == "FP8":
            qw = QuantizedWeight(format=WeightFormat.parse("float8e4m3:tensor"), codes=codes,
                                 scales=_scalar(reader, s_name).reshape(1))
        elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
            scales = reader.tensor(s_name, ("F32",), None, "per-channel weight_scale (N,)")
            if scales.numel() != n or scales.dim() > 2:
                raise CheckpointError(f"{reader.file_of(s_name)}: tensor {s_name!r} has shape {tuple(scales.shape)}, "
                                      f"expected ({n},) or ({n}, 1)")
            check_scales_positive(reader, s_name, scales)
            qw = QuantizedWeight(format=WeightFormat.parse("float8e4m3:channel"), codes=codes,
                                 scales=scales.reshape(n, 1))
        elif algo == "FP8_PB_WO":
            scales = reader.tensor(s_name, ("F32",), (-(-n // 128), 1, -(-k // 128), 1),
                                   "fp8_pb_wo block weight_scale (N / 128, 1, K / 128, 1)")
            check_scales_positive(reader, s_name, scales)
            qw = QuantizedWeight(format=WeightFormat.parse("float8e4m3:b128x128"), codes=codes,
                                 scales=scales.reshape(-(-n // 128), -(-k // 128)))
        else:
            qw = QuantizedWeight(format=WeightFormat.parse("mxfp8"), codes=codes,
                                 scales=e8m0_scales(reader, s_name, (n, k // 32), "MXFP8 weight_scale (N, K / 32)"))
    elif algo == "W4A16_AWQ":
        data = reader.tensor(w_name, ("U8",), (None, None), "INT4_AWQ weight (N / 2, K)")
        half, k = data.shape
        n = 2 * half
        codes = unpack_nibbles(data.t().contiguous()).t().contiguous()  # (N, K): row 2r low, 2r + 1 high
        scales = reader.tensor(s_name, ("F32", "F16", "BF16"), (n, None), "INT4_AWQ weight_scale (N, K / g)")
        group = k // scales.shape[1]
        if group * scales.shape[1] != k:
            raise CheckpointError(f"{reader.file_of(s_name)}: tensor {s_name!r} has {scales.shape[1]} groups, which "
                                  f"do not divide K={k}")
        scales = scales.to(torch.float32)
        check_scales_positive(reader, s_name, scales)
        qw = QuantizedWeight(format=WeightFormat.parse(f"int4:g{group}"), codes=codes, scales=scales)
        pq_name = f"{prefix}.pre_quant_scale"
        if reader.has(pq_name):
            input_scale = reader.tensor(pq_name, FLOAT_DTYPES, (k,), "pre_quant_scale (K,)")
    else:  # NVFP4, W4A16_NVFP4, MXFP4: two e2m1 codes per byte along K
        data = reader.tensor(w_name, ("U8",), (None, None), f"ModelOpt {algo} weight (N, K / 2)")
        n, k = data.shape[0], data.shape[1] * 2
        codes = unpack_nibbles(data)
        if algo == "MXFP4":
            qw = QuantizedWeight(format=WeightFormat.parse("mxfp4"), codes=codes,
                                 scales=e8m0_scales(reader, s_name, (n, k // 32), "MXFP4 weight_scale (N, K / 32)"))
        else:
            scales = reader.tensor(s_name, ("F8_E4M3",), (n, k // 16), "NVFP4 weight_scale (N, K / 16)")
            scales = scales.to(torch.float32)
            check_scales_positive(reader, s_name, scales)
            qw = QuantizedWeight(format=WeightFormat.parse("nvfp4"), codes=codes, scales=scales,
                                 global_scale=_scalar(reader, f"{prefix}.weight_scale_2"))
    return CheckpointLayer(prefix=prefix, schema="modelopt", weight=qw, input_scale=input_scale,
                           bias=optional_bias(reader, prefix, qw.shape[-2]),
                           activations=modelopt_scheme(reader, algo, prefix))
