"""Whether this installation can run a checkpoint layer on an arch: the support matrix
(support.py), the layer's shape rules, and the installed catalog (else the JIT)."""
from __future__ import annotations

import torch

from humming_aot.checkpoints.layer import CheckpointLayer

__all__ = ["layer_spec", "serving_status", "w8a8_serving_status"]


def layer_spec(layer: CheckpointLayer):
    """(GemmSpec, packed weight) of the dense GEMM this layer runs (``QuantizedLinear
    .from_checkpoint``'s; for stacked MoE experts, each expert's in ``QuantizedMoE``'s expert loop,
    and the packed weight is expert 0's: is_stacked(layer) says which), or (None, why) when it has
    none."""
    from humming_aot import ops
    from humming_aot.moe.packing import expert_weight
    from humming_aot.packing import pack

    qw = layer.weight
    if qw.codes.dim() == 3:
        if qw.codes.shape[0] == 0:
            return None, "the stacked MoE weight holds no expert"
        qw = expert_weight(qw, 0)  # every expert shares the format and the shape
    elif qw.codes.dim() != 2:
        return None, f"a weight of shape {tuple(qw.codes.shape)} is neither (N, K) nor stacked experts (E, N, K)"
    act_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(qw.format.scale_dtype, torch.bfloat16)
    try:
        packed = pack(qw, act_dtype=act_dtype)
    except ValueError as err:
        return None, str(err)
    return ops.gemm_spec(packed), packed


def is_stacked(layer: CheckpointLayer) -> bool:
    """Whether the layer holds stacked MoE experts (E, N, K), which also run the grouped MoE GEMMs."""
    return layer.weight.codes.dim() == 3


def serving_status(layer: CheckpointLayer, arch: str, catalog) -> str:
    """One line: ``catalog`` (a precompiled kernel of the layer's spec exists for ``arch``), ``JIT``
    (supported, but compiled at run time), or ``no: <why>``."""
    from humming_aot import support
    from humming_aot.spec import KernelKey

    spec, packed = layer_spec(layer)
    if spec is None:
        return f"no: {packed}"
    errors = support.problem_errors(spec, arch, 1, packed.n, packed.k, packed.group_size)
    if errors:
        return "no: " + "; ".join(e for e in errors if e)
    if catalog is not None and arch in catalog.archs:
        if any(KernelKey.from_name(name).spec == spec for name in catalog.keys_for(arch)):
            return "catalog"
    return "JIT (no precompiled kernel of this spec in the installed catalog)"


def w8a8_serving_status(layer: CheckpointLayer, arch: str, catalog) -> str | None:
    """One line for the W8A8 (or, for int4, uint4 and MXFP4 weights, W4A8; int4 with int4 activations, W4A4) path of a layer
    whose checkpoint quantizes its activations
    (``from_checkpoint(..., activations="checkpoint")``; for stacked MoE experts, the masked MoE
    GEMMs of QuantizedMoE.from_checkpoint's A8MoE): ``catalog``, ``JIT ...`` or ``no: <why>``;
    None for a weight-only layer."""
    from humming_aot import support, w4a8, w8a8
    from humming_aot.quant import ActivationFormat
    from humming_aot.quant.activation import ActivationGranularity
    from humming_aot.spec import KernelKey

    scheme = layer.activations
    if scheme is None:
        return None
    if scheme.format is None:
        return f"no: no kernel takes {scheme.description} activations"
    weight = layer.weight
    stacked = weight.codes.dim() == 3  # MoE experts: QuantizedMoE.from_checkpoint(..., activations=...)
    if stacked:
        from humming_aot.moe.packing import expert_weight

        weight = expert_weight(weight, 0)  # (the pack checks hold for every expert of one format and shape)
    fmt = ActivationFormat.parse(scheme.format)
    element = weight.format.element
    w4a4 = element == w8a8.INT4 and fmt.element == w8a8.INT4  # (int4 x int4: w8a8's, as nn.W8A8Linear packs it)
    if element in ("int4", "uint4", w4a8.MXFP4_ELEMENT) and not w4a4:  # W4A8 (nn.W8A8Linear packs it with w4a8)
        try:
            packed = w4a8.pack(weight)
        except ValueError as err:
            return f"no: {err}"
        elements = (w4a8.ACT_ELEMENT,) if packed.element == w4a8.MXFP4_ELEMENT else w4a8.ACT_ELEMENTS
        if fmt.element not in elements or fmt.granularity not in (ActivationGranularity.TOKEN,
                                                                   ActivationGranularity.TENSOR):
            return f"no: {scheme.format} activations do not suit a {packed.format} weight"
        spec = w4a8.gemm_spec(torch.bfloat16, fmt.element, packed.element)
    else:
        try:
            packed = w8a8.pack(weight)
        except ValueError as err:
            return f"no: {err}"
        wanted = ActivationGranularity.GROUP if packed.blocks else ActivationGranularity.TOKEN
        if fmt.element != packed.element or fmt.granularity not in (wanted, ActivationGranularity.TENSOR) \
                or (packed.blocks and (fmt.granularity is not wanted or fmt.group_size != 128)):
            return f"no: {scheme.format} activations do not suit a {packed.format} weight"
        spec = w8a8.gemm_spec(torch.bfloat16, packed.blocks, packed.element)
    if stacked:  # the grouped masked type and its offsets form (what A8MoE runs)
        import dataclasses

        from humming_aot.spec import GemmType

        spec = dataclasses.replace(spec, gemm_type=GemmType.MASKED)
    why = support.why_unsupported(spec, arch)
    if why is not None:
        return f"no: {why}"
    if catalog is not None and arch in catalog.archs:
        if any(KernelKey.from_name(name).spec == spec for name in catalog.keys_for(arch)):
            return "catalog"
    return "JIT (no precompiled kernel of this 8-bit-activation pairing in the installed catalog)"
