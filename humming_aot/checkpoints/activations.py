"""The activation quantization a checkpoint's producer calibrated its layers for (W8A8, W4A8 ...):
read from the config (and a static scale from the tensors) into an ActivationScheme, so that a
layer can run the W8A8 kernels on the inputs the checkpoint expects
(``QuantizedLinear.from_checkpoint(..., activations="checkpoint")``).

* compressed-tensors: a config group's ``input_activations`` (num_bits, type int / float,
  strategy token / tensor / group, dynamic, symmetric, group_size); a static per-tensor scale is
  ``<prefix>.input_scale``.
* fp8 (DeepSeek, FineGrainedFP8, AutoFP8): ``activation_scheme`` dynamic or static; dynamic with
  ``weight_block_size`` [bn, bk] quantizes each token per bk of K (DeepSeek-V3's 1 x 128 groups),
  dynamic without it per tensor; static reads ``<prefix>.input_scale``.
* ModelOpt: ``FP8`` calibrates a static per-tensor ``input_scale``; ``FP8_PER_CHANNEL_PER_TOKEN``
  quantizes per token on the fly; ``NVFP4`` quantizes to NVFP4 (no kernel for it yet); the
  weight-only algorithms quantize no activations.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.checkpoints._common import scalar_scale
from humming_aot.checkpoints.reader import CheckpointReader

__all__ = ["ActivationScheme", "compressed_tensors_scheme", "fp8_scheme", "modelopt_scheme"]

_STATIC_SCALE_DTYPES = ("F32", "BF16", "F16")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ActivationScheme:
    """How a checkpoint's producer quantized a layer's inputs.

    description:  the producer's scheme in words ("8-bit int per token, dynamic, symmetric")
    format:       the ActivationFormat string humming_aot quantizes with ("int8:token"), or None
                  when it has no such format (asymmetric, 4-bit ...): the layer still runs with
                  16-bit activations
    static_scale: float32 0-d, the calibrated per-tensor scale of a static scheme, else None
    """

    description: str
    format: str | None
    static_scale: torch.Tensor | None = None


def _static_scale(reader: CheckpointReader, prefix: str) -> torch.Tensor:
    name = f"{prefix}.input_scale"
    return scalar_scale(reader, name, _STATIC_SCALE_DTYPES, "a static per-tensor input_scale",
                        "a static activation scheme calibrates one scale per layer").reshape(()).to(torch.float32)


def compressed_tensors_scheme(reader: CheckpointReader, args: dict | None, prefix: str) -> ActivationScheme | None:
    """A compressed-tensors config group's ``input_activations`` (None: 16-bit inputs)."""
    if not args:
        return None
    bits, kind, strategy = args.get("num_bits"), args.get("type"), args.get("strategy")
    dynamic, symmetric, group = args.get("dynamic"), args.get("symmetric", True), args.get("group_size")
    description = (f"{bits}-bit {kind} per {strategy}{f' of {group}' if group else ''}, "
                   f"{'dynamic' if dynamic else 'static'}, {'symmetric' if symmetric else 'asymmetric'}")
    # 8-bit float or int, or 4-bit int (W4A4 with int4 weights; other 4-bit kinds: no kernel yet)
    element = ({"float": "float8e4m3", "int": "int8"}.get(kind) if bits == 8
               else "int4" if bits == 4 and kind == "int" else None)
    if element is None or not symmetric:
        return ActivationScheme(description=description, format=None)
    if strategy == "token" and dynamic:
        return ActivationScheme(description=description, format=f"{element}:token")
    if strategy == "tensor":
        scale = None if dynamic else _static_scale(reader, prefix)
        return ActivationScheme(description=description, format=f"{element}:tensor", static_scale=scale)
    if strategy == "group" and dynamic and isinstance(group, int) and group > 0:
        return ActivationScheme(description=description, format=f"{element}:g{group}")
    return ActivationScheme(description=description, format=None)


def fp8_scheme(reader: CheckpointReader, config: dict, prefix: str) -> ActivationScheme | None:
    """The fp8 schema's ``activation_scheme`` (None: the config names none)."""
    scheme = config.get("activation_scheme")
    if scheme is None:
        return None
    block = config.get("weight_block_size")
    if scheme == "dynamic":
        if block:
            return ActivationScheme(description=f"float8 e4m3 per token per {block[1]} of K, dynamic",
                                    format=f"float8e4m3:g{block[1]}")
        return ActivationScheme(description="float8 e4m3 per tensor, dynamic", format="float8e4m3:tensor")
    if scheme == "static":
        return ActivationScheme(description="float8 e4m3 per tensor, static", format="float8e4m3:tensor",
                                static_scale=_static_scale(reader, prefix))
    return ActivationScheme(description=f"activation_scheme {scheme!r}", format=None)


def modelopt_scheme(reader: CheckpointReader, algo: str, prefix: str) -> ActivationScheme | None:
    """ModelOpt's ``quant_algo`` (None: a weight-only algorithm)."""
    if algo == "FP8":
        return ActivationScheme(description="float8 e4m3 per tensor, static", format="float8e4m3:tensor",
                                static_scale=_static_scale(reader, prefix))
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return ActivationScheme(description="float8 e4m3 per token, dynamic", format="float8e4m3:token")
    if algo == "NVFP4":
        return ActivationScheme(description="NVFP4 (e2m1 per 16 with e4m3 scales, static global scale)", format=None)
    if algo in ("MXFP8", "MXFP4"):
        element = "e4m3" if algo == "MXFP8" else "e2m1"
        return ActivationScheme(description=f"{algo} ({element} per 32 with e8m0 scales), dynamic", format=None)
    return None
