"""vLLM fused_moe's indexed MoE GEMM for experts with 8-bit activations (W4A8, W8A8):
``gemm_indexed_a8`` takes ``align_block_size``'s layout as it is and computes, on the 8-bit
codes and their scales, what ``expert_loop.gemm_indexed`` defines for 16-bit activations: out
(M * top_k, N), row t (a routed slot) = decode(qa)[t // a_rows_per_token] @ W[expert of t's
block]^T, times topk_weights.flat[t] when given (rounded once from float32); slots of no block
are zeros. Three steps, as ``moe.gemm_indexed_kernel``: the routed rows' codes and scales gathered
(padding rows: zero codes and scales), the grouped GEMM on the routing's expert offsets
(``gemm_grouped_a8_kernel`` on a GPU with ``kernels=True``, else the loop ``gemm_grouped_a8``),
and the scatter to the slots with the routing weights. The 8-bit kernels have no block-aligned
form, so the routing must hold the experts' offsets (``align_block_size`` with no expert_map);
with an expert_map, route with ``moe.group_rows`` on the local ids instead."""
from __future__ import annotations

import torch

from humming_aot.moe import a8
from humming_aot.moe import routing as routing_module
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation


def gemm_indexed_a8(qa: QuantizedActivation, experts, routing, *, a_rows_per_token: int,
                    topk_weights: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                    kernels: bool | None = None, expected_m: int | None = None) -> torch.Tensor:
    """See the module docstring. qa: (M, K) codes, one row per token (a_rows_per_token = top_k: the
    first GEMM) or (M * top_k, K), one per slot (a_rows_per_token = 1: the second), with a float32
    scale per row (or per tensor; block-scaled W8A8: per row and 128 of K). kernels: None runs the
    grouped kernel on a CUDA device and the loop elsewhere; True / False force. expected_m: the
    rows an expert is expected to hold (picks the kernel's tile); default the slots over the
    experts, rounded up. No host round trip with the kernel (CUDA-graph capturable)."""
    what = "gemm_indexed_a8"
    routing_module.check_indexed_arguments(what, routing, a_rows_per_token, "qa")
    a8._check_pairing(qa, experts, what, 2)
    slots = routing.num_tokens * routing.top_k
    if qa.codes.shape[0] * a_rows_per_token != slots:
        raise ValueError(f"{what}: qa must hold {slots // a_rows_per_token} rows for {routing.num_tokens} tokens of "
                         f"top-{routing.top_k} and a_rows_per_token={a_rows_per_token}, got {qa.codes.shape[0]}")
    device = qa.codes.device
    routing_module.check_topk_weights(what, routing, topk_weights, device)
    offsets = routing.expert_offsets
    if not isinstance(offsets, torch.Tensor) or offsets.shape != (experts.experts + 1,):
        raise ValueError(f"{what}: the routing holds no offsets of these {experts.experts} experts (an expert_map's "
                         "routing, or another E): the 8-bit kernels run the grouped GEMM on expert offsets only; "
                         "align with moe.align_block_size(..., expert_map=None) or group the rows with "
                         "moe.group_rows")
    kernels = device.type == "cuda" if kernels is None else kernels
    rows = routing.sorted_token_ids.shape[0]
    block = routing.block_size
    if routing.expert_ids.shape[0] * block < rows:
        raise ValueError(f"{what}: the routing's expert_ids ({routing.expert_ids.shape[0]}) do not cover its "
                         f"{rows} rows in blocks of {block}")
    if slots == 0 or rows == 0:
        return torch.zeros(slots, experts.out_features, dtype=out_dtype, device=device)
    slot = routing.sorted_token_ids.to(device=device, dtype=torch.int64)
    real = (slot >= 0) & (slot < slots)
    expert = routing.expert_ids.to(device=device, dtype=torch.int32).unsqueeze(1).expand(-1, block).reshape(-1)[:rows]
    real &= (expert >= 0) & (expert < experts.experts)
    slot = torch.where(real, slot, -1)
    scales = qa.scales.reshape(1, 1).expand(qa.codes.shape[0], 1) if qa.granularity is ActivationGranularity.TENSOR \
        else qa.scales.reshape(qa.codes.shape[0], -1)
    granularity = ActivationGranularity.TOKEN if qa.granularity is ActivationGranularity.TENSOR else qa.granularity
    gathered = QuantizedActivation(
        element=qa.element, granularity=granularity, group_size=qa.group_size if granularity is not
        ActivationGranularity.TOKEN else None, scale_dtype=qa.scale_dtype,
        codes=routing_module.gather_rows(qa.codes, slot, a_rows_per_token),
        scales=routing_module.gather_rows(scales.contiguous(), slot, a_rows_per_token))
    offsets = offsets.to(device=device)
    if kernels:
        if expected_m is None:
            expected_m = max(1, -(-slots // experts.experts))
        y = a8.gemm_grouped_a8_kernel(gathered, experts, offsets.to(torch.int32), expected_m=expected_m,
                                      out_dtype=out_dtype)
    else:
        y = a8.gemm_grouped_a8(gathered, experts, offsets.to(torch.int64), out_dtype=out_dtype)
    if topk_weights is not None:
        weight = topk_weights.reshape(-1).float().index_select(0, torch.where(real, slot, 0))
        y = (y.float() * weight.unsqueeze(1)).to(out_dtype)
    # every row of no slot goes to one extra row, dropped: the real rows' slots are distinct
    wide = torch.zeros(slots + 1, experts.out_features, dtype=out_dtype, device=device)
    wide.index_copy_(0, torch.where(real, slot, slots), y.contiguous())
    return wide[:slots]
