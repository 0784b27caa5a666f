"""The three MoE GEMM types computed as a loop of dense GEMMs, one per expert that has rows
(``ops.gemm`` on ``PackedExperts.expert(e)``): the definition of what each layout computes, the
reference the grouped kernels are tested against, and the path ``QuantizedMoE`` runs on until they
exist. On a CUDA device each expert's GEMM is a catalog kernel; the loop itself costs one host
round trip per expert (the row counts are read back), so it is neither graph-capturable nor fast
at small token counts: that is the grouped kernels' job.

Rows a layout leaves without an expert (indexed: padding and skipped blocks; grouped: rows whose
expert index is -1; masked: rows past an expert's count) are written as zeros.
"""
from __future__ import annotations

import torch

from humming_aot import ops
from humming_aot.moe.packing import PackedExperts
from humming_aot.moe.routing import IndexedRouting, check_indexed_arguments, check_topk_weights


def _check_activations(a: torch.Tensor, experts: PackedExperts, what: str) -> None:
    if a.dtype != experts.act_dtype or a.shape[-1] != experts.in_features or a.device != experts.device:
        raise ValueError(f"{what}: activations must be (..., {experts.in_features}) {experts.act_dtype} on {experts.device}, "
                         f"got {tuple(a.shape)} {a.dtype} on {a.device}")


def gemm_indexed(a: torch.Tensor, experts: PackedExperts, routing: IndexedRouting, *, a_rows_per_token: int,
                 topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """fused_moe's indexed GEMM: out (M * top_k, N), row t (a routed slot) = a[t // a_rows_per_token]
    @ W[expert of t's block]^T, times topk_weights.flat[t] when given. a_rows_per_token is top_k
    when `a` holds one row per token (the first GEMM), 1 when it holds one row per slot (the
    second)."""
    _check_activations(a, experts, "gemm_indexed")
    check_indexed_arguments("gemm_indexed", routing, a_rows_per_token)
    check_topk_weights("gemm_indexed", routing, topk_weights, a.device)
    slots = routing.num_tokens * routing.top_k
    if a.dim() != 2 or a.shape[0] * a_rows_per_token != slots:
        raise ValueError(f"gemm_indexed: a must have {slots} // a_rows_per_token={a_rows_per_token} rows, "
                         f"got {tuple(a.shape)}")
    out = torch.zeros(slots, experts.out_features, dtype=a.dtype, device=a.device)
    total = int(routing.num_tokens_post_padded[0])
    ids = routing.sorted_token_ids[:total].long().reshape(-1, routing.block_size)
    block_expert = routing.expert_ids[: ids.shape[0]].long()
    for e in torch.unique(block_expert).tolist():
        if e < 0:
            continue
        rows = ids[block_expert == e].reshape(-1)
        rows = rows[rows < slots]
        if rows.numel() == 0:
            continue
        y = ops.gemm(a.index_select(0, rows // a_rows_per_token), experts.expert(e))
        if topk_weights is not None:
            y = (y.float() * topk_weights.reshape(-1)[rows].float().unsqueeze(1)).to(a.dtype)
        out[rows] = y
    return out


def _bias(bias: torch.Tensor | None, experts: PackedExperts, e: int) -> torch.Tensor | None:
    return None if bias is None else bias[e]


def gemm_grouped(a: torch.Tensor, experts: PackedExperts, *, offsets: torch.Tensor | None = None,
                 row_expert: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped contiguous: a (R, K) rows expert after expert; out (R, N), row r = a[r] @ W[e]^T (+
    bias[e]) for its expert e. The experts come as prefix offsets (E + 1,) (expert e owns rows
    offsets[e] to offsets[e + 1]) or as a per-row expert index (R,) (-1: a padding row, written as
    zeros). bias: (E, N) in the activation dtype, or None."""
    _check_activations(a, experts, "gemm_grouped")
    if a.dim() != 2:
        raise ValueError(f"gemm_grouped: a must be (R, {experts.in_features}), the rows expert after expert, got "
                         f"{tuple(a.shape)}")
    if (offsets is not None and (not isinstance(offsets, torch.Tensor) or offsets.dtype.is_floating_point)) or (
            row_expert is not None and (not isinstance(row_expert, torch.Tensor) or row_expert.dtype.is_floating_point)):
        raise ValueError("gemm_grouped: offsets and row_expert must be integer tensors")
    if bias is not None and (bias.shape != (experts.experts, experts.out_features) or bias.dtype != a.dtype):
        raise ValueError(f"gemm_grouped: bias must be ({experts.experts}, {experts.out_features}) {a.dtype}, "
                         f"got {tuple(bias.shape)} {bias.dtype}")
    if (offsets is None) == (row_expert is None):
        raise ValueError("gemm_grouped: give the experts' rows as offsets (E + 1,) or row_expert (R,), one of them")
    out = torch.zeros(a.shape[0], experts.out_features, dtype=a.dtype, device=a.device)
    if offsets is not None:
        if offsets.shape != (experts.experts + 1,):
            raise ValueError(f"gemm_grouped: offsets must be ({experts.experts + 1},), got {tuple(offsets.shape)}")
        bounds = offsets.tolist()
        if bounds[0] < 0 or bounds[-1] > a.shape[0] or any(x > y for x, y in zip(bounds, bounds[1:])):
            raise ValueError(f"gemm_grouped: offsets must rise from >= 0 to <= {a.shape[0]} rows, got {bounds}")
        for e in range(experts.experts):
            if bounds[e + 1] > bounds[e]:
                out[bounds[e]:bounds[e + 1]] = ops.gemm(a[bounds[e]:bounds[e + 1]], experts.expert(e),
                                                        _bias(bias, experts, e))
        return out
    if row_expert.shape != (a.shape[0],):
        raise ValueError(f"gemm_grouped: row_expert must be ({a.shape[0]},), got {tuple(row_expert.shape)}")
    index = row_expert.long()
    if index.numel() and (int(index.min()) < -1 or int(index.max()) >= experts.experts):
        raise ValueError(f"gemm_grouped: row_expert holds ids outside [-1, {experts.experts - 1}]")
    for e in torch.unique(index).tolist():
        if e >= 0:
            rows = torch.nonzero(index == e).reshape(-1)
            out[rows] = ops.gemm(a.index_select(0, rows), experts.expert(e), _bias(bias, experts, e))
    return out


def gemm_masked(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor) -> torch.Tensor:
    """Grouped masked: a (E, max_m, K); out (E, max_m, N), out[e, :masked_m[e]] = a[e, :masked_m[e]]
    @ W[e]^T, the rows past each count zeros."""
    _check_activations(a, experts, "gemm_masked")
    if a.dim() != 3 or a.shape[0] != experts.experts or masked_m.shape != (experts.experts,):
        raise ValueError(f"gemm_masked: a must be ({experts.experts}, max_m, {experts.in_features}) and masked_m "
                         f"({experts.experts},), got {tuple(a.shape)} and {tuple(masked_m.shape)}")
    counts = masked_m.tolist()
    if any(c < 0 or c > a.shape[1] for c in counts):
        raise ValueError(f"gemm_masked: counts must lie in [0, {a.shape[1]}], got {counts}")
    out = torch.zeros(*a.shape[:2], experts.out_features, dtype=a.dtype, device=a.device)
    for e, count in enumerate(counts):
        if count:
            out[e, :count] = ops.gemm(a[e, :count], experts.expert(e))
    return out
