"""Save and load a QuantizedWeight as a safetensors file.

Layout: tensors ``codes``, ``scales`` and, where the format has them, ``zero_points`` and
``global_scale``; metadata ``humming_aot.weight_format`` (the WeightFormat string, e.g.
``uint4:g128:zp``) and ``humming_aot.layout`` (``quantized_weight.v1``).
"""
from __future__ import annotations

import os

import torch

from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["FORMAT_KEY", "LAYOUT", "LAYOUT_KEY", "load_quantized", "save_quantized"]

FORMAT_KEY = "humming_aot.weight_format"
LAYOUT_KEY = "humming_aot.layout"
LAYOUT = "quantized_weight.v1"
_OPTIONAL = ("zero_points", "global_scale")


def save_quantized(qw: QuantizedWeight, path: str | os.PathLike) -> None:
    """Write ``qw`` (any device; copied to the CPU) to the safetensors file ``path``."""
    from safetensors.torch import save_file

    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"save_quantized expects a QuantizedWeight, got {type(qw).__name__}")
    tensors = {"codes": qw.codes, "scales": qw.scales}
    for name in _OPTIONAL:
        if getattr(qw, name) is not None:
            tensors[name] = getattr(qw, name)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    save_file(tensors, os.fspath(path), metadata={FORMAT_KEY: str(qw.format), LAYOUT_KEY: LAYOUT})


def load_quantized(path: str | os.PathLike, *, device: torch.device | str = "cpu") -> QuantizedWeight:
    """Read a file written by :func:`save_quantized`, check it (``QuantizedWeight.validate``) and
    place it on ``device``. ValueError names the file and what is wrong with it."""
    from safetensors import safe_open

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file: pass the path that save_quantized wrote")
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from err
    if metadata.get(LAYOUT_KEY) != LAYOUT or FORMAT_KEY not in metadata:
        raise ValueError(
            f"{path}: metadata {LAYOUT_KEY}={metadata.get(LAYOUT_KEY)!r} and {FORMAT_KEY}="
            f"{metadata.get(FORMAT_KEY)!r}; expected {LAYOUT!r} and a weight format: this file was not "
            "written by humming_aot.quant.save_quantized"
        )
    try:
        fmt = WeightFormat.parse(metadata[FORMAT_KEY])
    except ValueError as err:
        raise ValueError(f"{path}: bad {FORMAT_KEY} metadata: {err}") from None
    for name in ("codes", "scales"):
        if name not in tensors:
            raise ValueError(
                f"{path}: tensor {name!r} is missing (found {sorted(tensors)}); the file is incomplete"
            )
    unknown = set(tensors) - {"codes", "scales", *_OPTIONAL}
    if unknown:
        raise ValueError(
            f"{path}: unexpected tensors {sorted(unknown)}; a quantized weight holds codes, scales, "
            f"{', '.join(_OPTIONAL)}"
        )
    try:
        qw = QuantizedWeight(format=fmt, **tensors)
        qw.validate()
    except ValueError as err:
        raise ValueError(f"{path} (format {fmt}): {err}") from None
    return qw.to(device)
