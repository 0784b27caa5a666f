"""Reference quantization: the canonical unpacked QuantizedWeight, the producers' recipes
(GPTQ, AWQ, MX, NVFP4, FP8 channel/tensor/block), activation quantization and safetensors I/O.

Pure PyTorch: every function works on CPU and GPU tensors. Kernel packing is a separate step.
"""
from __future__ import annotations

from humming_aot.quant.activation import (
    ActivationGranularity,
    QuantizedActivation,
    dequantize_activation,
    quantize_activation,
)
from humming_aot.quant.activation_format import ACTIVATION_PRESETS, ActivationFormat
from humming_aot.quant.io import load_quantized, save_quantized
from humming_aot.quant.weight import QuantizedWeight, dequantize, quantize
from humming_aot.quant.weight_format import PRESETS, SCALE_DTYPES, ScaleGranularity, WeightFormat, ZeroPointKind

__all__ = [
    "ACTIVATION_PRESETS",
    "PRESETS",
    "SCALE_DTYPES",
    "ActivationFormat",
    "ActivationGranularity",
    "QuantizedActivation",
    "QuantizedWeight",
    "ScaleGranularity",
    "WeightFormat",
    "ZeroPointKind",
    "dequantize",
    "dequantize_activation",
    "load_quantized",
    "quantize",
    "quantize_activation",
    "save_quantized",
]
