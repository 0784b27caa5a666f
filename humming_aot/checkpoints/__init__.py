"""Loaders for published quantized checkpoints: GPTQ (v1 and v2, act-order), AWQ GEMM,
compressed-tensors, DeepSeek fp8, NVIDIA ModelOpt, gpt-oss MXFP4, auto-round and HQQ.

Each schema module converts a layer's tensors into the canonical ``QuantizedWeight`` bit for bit
(codes are unpacked with integer arithmetic, never through a float). The schema is chosen from the
checkpoint's config (see ``config.py``); safetensors files are read lazily, one tensor at a time.
docs/CHECKPOINTS.md describes each layout.

    layer = humming_aot.checkpoints.load_layer("model_dir", "model.layers.0.self_attn.q_proj")
    qw = humming_aot.checkpoints.load("model_dir", "model.layers.0.mlp.down_proj")
    for row in humming_aot.checkpoints.inspect("model_dir"): ...
"""
from __future__ import annotations

import dataclasses
import os

from humming_aot.checkpoints import awq, compressed_tensors, fp8, gptq, hqq, modelopt, mxfp4
from humming_aot.checkpoints.config import QuantConfig, read_quant_config
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight

__all__ = ["CheckpointError", "CheckpointLayer", "LayerInfo", "inspect", "load", "load_fused", "load_layer",
           "quantized_layers"]

_LOADERS = {
    "gptq": gptq.load_layer, "awq": awq.load_layer, "compressed-tensors": compressed_tensors.load_layer,
    "fp8": fp8.load_layer, "modelopt": modelopt.load_layer, "mxfp4": mxfp4.load_layer, "hqq": hqq.load_layer,
}
# tensor-name suffixes that mark a quantized layer, per schema (the prefix is the name without it)
_MARKERS = {
    "gptq": (gptq.MARKER,), "awq": (awq.MARKER,), "compressed-tensors": (".weight_packed", ".weight_scale"),
    "fp8": fp8.MARKERS, "modelopt": (modelopt.MARKER,), "mxfp4": (mxfp4.MARKER,), "hqq": (hqq.MARKER,),
}


def _open(model_dir: str | os.PathLike | CheckpointReader) -> tuple[CheckpointReader, QuantConfig | None]:
    reader = model_dir if isinstance(model_dir, CheckpointReader) else CheckpointReader(model_dir)
    return reader, read_quant_config(reader)


def quantized_layers(model_dir: str | os.PathLike | CheckpointReader) -> list[str]:
    """The prefixes of the layers the checkpoint stores quantized (excluded layers left out)."""
    reader, qc = _open(model_dir)
    if qc is None:
        return []
    prefixes = set()
    for name in reader.names():
        for marker in _MARKERS[qc.schema]:
            if name.endswith(marker):
                prefixes.add(name[: -len(marker)])
                break
    return sorted(p for p in prefixes if not qc.is_excluded(p))


def load_layer(model_dir: str | os.PathLike | CheckpointReader, prefix: str) -> CheckpointLayer:
    """The quantized layer ``prefix`` (e.g. ``model.layers.0.self_attn.q_proj``) of ``model_dir``.

    CheckpointError when the checkpoint has no quantization config, when its config leaves that
    layer unquantized (ignore / modules_to_not_convert / exclude_modules / GPTQ dynamic ``-:``), or
    when a tensor is missing or malformed: the message names the file and the tensor or key."""
    reader, qc = _open(model_dir)
    if qc is None:
        raise CheckpointError(f"{reader.model_dir}/config.json has no quantization_config: the model is not "
                              "quantized; load it with torch (or quantize it with humming_aot.quantize)")
    if qc.is_excluded(prefix):
        raise CheckpointError(f"{qc.source}: layer {prefix!r} is excluded from quantization by its config "
                              "(ignore / modules_to_not_convert / exclude_modules / dynamic); load its float "
                              f"'{prefix}.weight' as a plain nn.Linear")
    return _LOADERS[qc.schema](reader, qc, prefix)


def load_fused(model_dir: str | os.PathLike, prefixes: list[str] | tuple[str, ...]) -> CheckpointLayer:
    """Siblings that read the same input (q/k/v, gate/up) as one layer, rows stacked in the order
    given (see fused.py for what may differ between them)."""
    from humming_aot.checkpoints.fused import fuse_layers

    reader = CheckpointReader(model_dir)
    if not prefixes:
        raise CheckpointError(f"{reader.model_dir}: load_fused needs at least one layer prefix")
    return fuse_layers([load_layer(reader, p) for p in prefixes], str(reader.model_dir))


def load(model_dir: str | os.PathLike, prefix: str | list[str] | tuple[str, ...]):
    """The canonical QuantizedWeight of layer ``prefix``, or a dict {prefix: QuantizedWeight} for a
    list of prefixes (fused siblings such as q/k/v). A layer that also needs its activations
    gathered (GPTQ act-order) or scaled (ModelOpt pre_quant_scale) raises CheckpointError: use
    :func:`load_layer` or ``QuantizedLinear.from_checkpoint``, which carry that step."""
    if not isinstance(prefix, str):
        reader = CheckpointReader(model_dir)
        return {p: _bare_weight(reader, p) for p in prefix}
    return _bare_weight(CheckpointReader(model_dir), prefix)


def _bare_weight(reader: CheckpointReader, prefix: str) -> QuantizedWeight:
    layer = load_layer(reader, prefix)
    if layer.input_perm is not None or layer.input_scale is not None:
        what = "gathers its activations (act-order)" if layer.input_perm is not None else \
            "scales its activations (pre_quant_scale)"
        raise CheckpointError(f"{reader.model_dir}: layer {prefix!r} {what}, which a bare QuantizedWeight cannot "
                              "express; use humming_aot.checkpoints.load_layer or QuantizedLinear.from_checkpoint")
    return layer.weight


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LayerInfo:
    """One row of :func:`inspect`: a quantized layer and the canonical format it loads as."""

    prefix: str
    schema: str
    format: str
    n: int
    k: int
    experts: int | None
    activation_step: str | None  # "gather" (act-order), "scale" (pre_quant_scale) or None
    error: str | None = None     # why the layer cannot be loaded, when it cannot
    served: str | None = None    # inspect(arch=...): "catalog", "JIT ..." or "no: why"
    # the producer's activation quantization: its ActivationFormat ("float8e4m3:token"), or its
    # description with "(no kernel)"; None for 16-bit inputs
    activations: str | None = None
    served_w8a8: str | None = None  # inspect(arch=...), with activations: the W8A8 path's serving_status


def inspect(model_dir: str | os.PathLike, arch: str | None = None) -> list[LayerInfo]:
    """Every quantized layer of ``model_dir``: schema, canonical format and N x K (each layer is
    loaded and dropped in turn, so the whole model is never in memory). A layer whose tensors are
    malformed is listed with its error rather than stopping the listing. With ``arch`` (e.g.
    ``sm90a``), ``served`` says whether the installed catalog (or the JIT) runs it there."""
    from humming_aot.checkpoints.serving import serving_status, w8a8_serving_status

    catalog = None
    if arch is not None:
        from humming_aot.catalog import installed_catalog

        catalog = installed_catalog()
    reader, qc = _open(model_dir)
    rows = []
    for prefix in quantized_layers(reader):
        try:
            layer = load_layer(reader, prefix)
        except CheckpointError as err:
            rows.append(LayerInfo(prefix=prefix, schema=qc.schema, format="?", n=0, k=0, experts=None,
                                  activation_step=None, error=str(err)))
            continue
        *lead, n, k = layer.weight.shape
        step = "gather" if layer.input_perm is not None else "scale" if layer.input_scale is not None else None
        served = None if arch is None else serving_status(layer, arch, catalog)
        served_w8a8 = None if arch is None else w8a8_serving_status(layer, arch, catalog)
        scheme = layer.activations
        activations = None if scheme is None else scheme.format or f"{scheme.description} (no kernel)"
        rows.append(LayerInfo(prefix=prefix, schema=qc.schema, format=str(layer.weight.format), n=n, k=k,
                              experts=lead[0] if lead else None, activation_step=step, served=served,
                              activations=activations, served_w8a8=served_w8a8))
    return rows
