"""A random QuantizedMoE and the float64 reference of its MLP, for the CPU and GPU tests of
humming_aot.nn.QuantizedMoE."""
from __future__ import annotations

import torch


def moe_layer_reference(layer, hidden: torch.Tensor, topk_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(M, H) float64 on the CPU: for each token and slot, its expert's MLP over the layer's
    effective weights (exactly what the kernels multiply), rounded to the activation dtype where
    the layer rounds (after each GEMM and after the activation), times the routing weight, summed
    in slot order."""
    act = hidden.dtype
    w1 = [layer.gate_up.effective_weight(e).cpu() for e in range(layer.num_experts)]
    w2 = [layer.down.effective_weight(e).cpu() for e in range(layer.num_experts)]
    b1 = None if layer.gate_up_bias is None else layer.gate_up_bias.cpu().double()
    b2 = None if layer.down_bias is None else layer.down_bias.cpu().double()
    hidden, topk_ids, weights = hidden.cpu(), topk_ids.cpu(), weights.cpu()
    out = torch.zeros(hidden.shape[0], layer.hidden_size, dtype=torch.float64)
    for i in range(hidden.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[i, j])
            h = hidden[i].double() @ w1[e].T + (0 if b1 is None else b1[e])
            h = h.to(act).double()
            if layer.activation == "silu":
                g, u = h.chunk(2)
                h = torch.nn.functional.silu(g) * u
            else:  # swiglu_oai: interleaved, clamped, alpha 1.702
                g, u = h[0::2].clamp(max=7.0), h[1::2].clamp(-7.0, 7.0)
                h = (u + 1) * g * torch.sigmoid(1.702 * g)
            y = h.to(act).double() @ w2[e].T + (0 if b2 is None else b2[e])
            out[i] += y.to(act).double() * float(weights[i, j])
    return out


def random_moe_layer(experts: int, hidden_size: int, intermediate: int, fmt: str, activation: str,
                     gen: torch.Generator):
    """A QuantizedMoE of random weights (0.1 sigma) quantized with `fmt`, on the CPU; with random
    biases for swiglu_oai (gpt-oss has them)."""
    from humming_aot.nn import QuantizedMoE

    gate_up = torch.randn(experts, 2 * intermediate, hidden_size, generator=gen) * 0.1
    down = torch.randn(experts, hidden_size, intermediate, generator=gen) * 0.1
    biases = {}
    if activation == "swiglu_oai":
        biases = dict(gate_up_bias=(torch.randn(experts, 2 * intermediate, generator=gen) * 0.1).bfloat16(),
                      down_bias=(torch.randn(experts, hidden_size, generator=gen) * 0.1).bfloat16())
    return QuantizedMoE.from_experts(gate_up, down, fmt=fmt, activation=activation, **biases)
