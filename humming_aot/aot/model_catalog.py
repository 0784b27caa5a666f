"""A catalog of exactly the kernels a quantized checkpoint's layers need (``humming-aot build
--model MODEL_DIR``): one [[family]] per (arch, GEMM spec) of its layers, with the arch's whole
tile table, so every M bucket has its kernel; MoE experts (stacked, or one layer per expert)
add a family of the grouped masked and contiguous GEMMs of their spec. Written as a catalog .toml that the ordinary build
compiles, so nothing else in the build changes."""
from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["model_catalog_toml", "write_model_catalog"]

# a layer of one expert, as DeepSeek, Qwen and Mixtral exports name them (model.layers.3.mlp.experts.7.up_proj)
_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def model_catalog_toml(model_dir: str | os.PathLike, archs: list[str]) -> str:
    """The catalog text; ValueError (CheckpointError) naming the layer when one has no kernel on
    an arch."""
    from humming_aot import checkpoints, support
    from humming_aot.checkpoints.serving import is_stacked, layer_spec
    from humming_aot.spec import GemmType

    specs, stacked = {}, set()
    for prefix in checkpoints.quantized_layers(model_dir):
        layer = checkpoints.load_layer(model_dir, prefix)
        spec, packed = layer_spec(layer)
        if spec is None:
            raise checkpoints.CheckpointError(f"{model_dir}: layer {prefix!r} has no GEMM: {packed}")
        specs.setdefault(spec, prefix)
        if is_stacked(layer) or _PER_EXPERT.search(prefix):
            stacked.add(spec)
    if not specs:
        raise checkpoints.CheckpointError(f"{model_dir}: no quantized layers, so no kernels to build")
    lines = [f"# Kernels for the quantized layers of {Path(model_dir).name} (humming-aot build --model)",
             "schema_version = 1", ""]
    for arch in archs:
        for spec, prefix in sorted(specs.items(), key=lambda item: support.describe_spec(item[0])):
            pairing = support.pairing_for(spec, arch)
            if pairing is None:
                raise checkpoints.CheckpointError(f"{model_dir}: layer {prefix!r} needs {support.describe_spec(spec)}"
                                                  f", which {arch} does not serve: {support.why_unsupported(spec, arch)}")
            lines += ["[[family]]", f"# first needed by {prefix}", f'pairing = "{pairing.name}"', f'archs = ["{arch}"]',
                      f'a_dtype = ["{spec.a_dtype}"]', f'w_dtype = ["{spec.w_dtype}"]', 'tiles = "table"', ""]
            moe_types = [t.value for t in (GemmType.MASKED, GemmType.GROUPED) if t in pairing.gemm_type]
            if spec in stacked and moe_types:  # stacked experts: the grouped MoE GEMMs too
                lines += ["[[family]]", "# the grouped MoE GEMMs of the experts of this spec", f'pairing = "{pairing.name}"',
                          f'archs = ["{arch}"]', "gemm_type = [" + ", ".join(f'"{t}"' for t in moe_types) + "]",
                          f'a_dtype = ["{spec.a_dtype}"]', f'w_dtype = ["{spec.w_dtype}"]', 'tiles = "table"', ""]
    return "\n".join(lines)


def write_model_catalog(model_dir: str | os.PathLike, archs: list[str], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model_catalog_toml(model_dir, archs))
    return path
