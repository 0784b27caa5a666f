"""CheckpointLayer: one quantized layer read from a checkpoint, in canonical form."""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.checkpoints.activations import ActivationScheme
from humming_aot.quant.weight import QuantizedWeight

__all__ = ["CheckpointLayer"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class CheckpointLayer:
    """A layer ``y = f(x) @ W^T + bias`` as a checkpoint stores it.

    prefix:      module name in the checkpoint (``model.layers.0.self_attn.q_proj``)
    schema:      the loader that read it (``gptq``, ``awq``, ``compressed-tensors`` ...)
    weight:      the canonical QuantizedWeight, (N, K) or (E, N, K), bit-exact to the file's codes;
                 K in the order of ``input_perm`` when that is set
    input_perm:  int64 (K,) or None. GPTQ act-order: the weight's K axis was sorted by group at load
                 time, so the layer computes ``x[..., input_perm] @ W^T`` (one gather of the
                 activations per call)
    input_scale: (K,) float or None. ModelOpt INT4_AWQ's ``pre_quant_scale``: the layer computes
                 ``(x * input_scale) @ W^T``
    bias:        (N,) or None, in the file's dtype
    activations: the ActivationScheme the producer calibrated the layer's inputs for (W8A8 ...), or
                 None for 16-bit inputs (weight-only). The layer runs 16-bit activations unless
                 asked for this scheme (QuantizedLinear.from_checkpoint(..., activations="checkpoint"))
    """

    prefix: str
    schema: str
    weight: QuantizedWeight
    input_perm: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    activations: ActivationScheme | None = None

    def reference_weight(self) -> torch.Tensor:
        """float32 (N, K) in the checkpoint's original K order, with ``input_scale`` folded in: the
        float weight ``W_ref`` such that the layer computes ``x @ W_ref^T`` (for tests)."""
        from humming_aot.quant.weight import dequantize

        w = dequantize(self.weight)
        if self.input_perm is not None:
            restored = torch.empty_like(w)
            restored[..., self.input_perm] = w
            w = restored
        if self.input_scale is not None:
            w = w * self.input_scale.to(torch.float32)
        return w
