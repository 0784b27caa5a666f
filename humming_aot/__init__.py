"""humming_aot: quantized-inference GEMM kernels that ship precompiled.

``import humming_aot`` is cheap: submodules load on first use, so the CLI and a first GEMM pay only
for what they touch.
"""
from __future__ import annotations

import importlib

from humming_aot._version import __version__

_LAZY_ATTRS = {
    "quantize": ("humming_aot.quant", "quantize"),
    "dequantize": ("humming_aot.quant", "dequantize"),
    "WeightFormat": ("humming_aot.quant", "WeightFormat"),
    "QuantizedWeight": ("humming_aot.quant", "QuantizedWeight"),
    "pack": ("humming_aot.packing", "pack"),
    "unpack": ("humming_aot.packing", "unpack"),
    "PackedWeight": ("humming_aot.packing", "PackedWeight"),
}
_LAZY_MODULES = {"formats", "quant", "ops", "nn", "moe", "packing", "spec", "support", "catalog", "heuristics", "testing"}

__all__ = ["__version__", *_LAZY_ATTRS, *sorted(_LAZY_MODULES)]


def __getattr__(name: str):
    if name in _LAZY_ATTRS:
        module, attr = _LAZY_ATTRS[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(f"humming_aot.{name}")
    else:
        raise AttributeError(f"module 'humming_aot' has no attribute {name!r}")
    globals()[name] = value
    return value
