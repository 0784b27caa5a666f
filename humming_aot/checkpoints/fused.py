"""Fused siblings: q/k/v (or gate/up) loaded as one layer whose N is the concatenation of theirs.

Siblings must share the format and the activation step (act-order permutation, pre_quant_scale):
they read the same input. Per-tensor scales that differ become per-channel scales (exact: each
row keeps its value). NVFP4 global scales must be equal, which compressed-tensors and ModelOpt
guarantee for siblings; unequal ones would have to be folded into the float8e4m3 group scales,
which rounds, so they are refused.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import ScaleGranularity

__all__ = ["fuse_layers"]


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _tensor_to_channel(qw: QuantizedWeight) -> QuantizedWeight:
    fmt = dataclasses.replace(qw.format, granularity=ScaleGranularity.CHANNEL)
    return dataclasses.replace(qw, format=fmt, scales=qw.scales.reshape(1, 1).expand(qw.shape[0], 1).contiguous())


def fuse_layers(layers: list[CheckpointLayer], where: str) -> CheckpointLayer:
    """One CheckpointLayer with the siblings' rows stacked in the given order."""
    first = layers[0]
    weights = [layer.weight for layer in layers]
    for layer in layers[1:]:
        for field in ("input_perm", "input_scale"):
            if not _same(getattr(first, field), getattr(layer, field)):
                raise CheckpointError(f"{where}: {layer.prefix!r} and {first.prefix!r} differ in {field}; siblings "
                                      "fused into one GEMM must read the same activations: load them separately")
        if layer.weight.codes.dim() != 2:
            raise CheckpointError(f"{where}: {layer.prefix!r} is a stacked MoE weight; fuse (N, K) layers only")
    activations = _fused_activations(layers, where)
    if len({w.format.granularity for w in weights}) == 1 and weights[0].format.granularity is ScaleGranularity.TENSOR \
            and len({float(w.scales.reshape(())) for w in weights}) > 1:
        weights = [_tensor_to_channel(w) for w in weights]
    formats = {str(w.format) for w in weights}
    if len(formats) != 1:
        raise CheckpointError(f"{where}: siblings {[layer.prefix for layer in layers]} have formats {sorted(formats)}; one "
                              "GEMM needs one format: load them separately")
    if len({w.shape[-1] for w in weights}) != 1:
        raise CheckpointError(f"{where}: siblings {[layer.prefix for layer in layers]} have different K")
    global_scale = weights[0].global_scale
    if global_scale is not None and any(not torch.equal(w.global_scale, global_scale) for w in weights):
        raise CheckpointError(f"{where}: siblings {[layer.prefix for layer in layers]} have different global scales "
                              f"({[float(w.global_scale) for w in weights]}); folding them into the float8e4m3 group "
                              "scales would round: load them separately")
    cat = lambda name: None if getattr(weights[0], name) is None else torch.cat(  # noqa: E731
        [getattr(w, name) for w in weights], dim=0)
    scales = weights[0].scales if weights[0].format.granularity is ScaleGranularity.TENSOR else cat("scales")
    if weights[0].format.granularity is ScaleGranularity.BLOCK and any(
            w.shape[0] % weights[0].format.block_n for w in weights[:-1]):
        raise CheckpointError(f"{where}: a sibling's N is not a multiple of the block height; load them separately")
    fused = QuantizedWeight(format=weights[0].format, codes=cat("codes"), scales=scales,
                            zero_points=cat("zero_points"), global_scale=global_scale)
    biases = [layer.bias for layer in layers]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else torch.zeros(layer.weight.shape[0], dtype=torch.float32)
                          for b, layer in zip(biases, layers)]).to(torch.float32)
    return CheckpointLayer(prefix="+".join(layer.prefix for layer in layers), schema=first.schema, weight=fused,
                           input_perm=first.input_perm, input_scale=first.input_scale, bias=bias,
                           activations=activations)


def _fused_activations(layers: list[CheckpointLayer], where: str):
    """The siblings' common activation scheme; static per-tensor scales calibrated apart become
    their largest (every sibling reads the same input, and the largest scale clips none of them)."""
    schemes = [layer.activations for layer in layers]
    if all(s is None for s in schemes):
        return None
    if any(s is None for s in schemes) or len({(s.description, s.format) for s in schemes}) != 1:
        raise CheckpointError(f"{where}: siblings {[layer.prefix for layer in layers]} quantize their activations "
                              f"differently ({[None if s is None else s.description for s in schemes]}); one GEMM "
                              "reads one quantized input: load them separately")
    scales = [s.static_scale for s in schemes]
    if scales[0] is None:
        return schemes[0]
    return dataclasses.replace(schemes[0], static_scale=torch.stack(scales).max())
