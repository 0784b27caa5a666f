"""vLLM fused_moe's indexed MoE GEMM on the grouped kernel: ``gemm_indexed_kernel`` takes
``align_block_size``'s layout as it is and computes what ``expert_loop.gemm_indexed`` defines, as
three launches with no host round trip: the gather of the routed rows, the grouped contiguous
kernel (moe/kernels.py) on them (its offsets form, the masked schedule, where the routing holds
the experts' offsets; else the block-aligned form), and the scatter to the flat top-k rows with
the routing weights. A loader that gathers through sorted_token_ids and a writer that scatters
would save the two copies; they are not built yet."""
from __future__ import annotations

import torch

from humming_aot.moe import kernels
from humming_aot.moe import routing as routing_module
from humming_aot.moe.packing import PackedExperts
from humming_aot.spec import TileConfig


def gemm_indexed_kernel(a: torch.Tensor, experts: PackedExperts, routing, *, a_rows_per_token: int,
                        topk_weights: torch.Tensor | None = None, expected_m: int | None = None,
                        tile: TileConfig | str | None = None) -> torch.Tensor:
    """fused_moe's indexed GEMM on the grouped kernel: out (M * top_k, N), row t (a routed slot) =
    a[t // a_rows_per_token] @ W[expert of t's block]^T, times topk_weights.flat[t] when given
    (the product rounded once from float32, as ``expert_loop.gemm_indexed``); slots of no block
    (ids a kernel-made routing dropped) are zeros. No host round trip (CUDA-graph capturable):
    the routing's arrays are read on the device only. num_tokens_post_padded is not read: every
    entry of sorted_token_ids past it must be the pad value M * top_k (as align_block_size and
    vLLM's moe_align_block_size leave them), which makes those rows padding.

    a:                (M, K) one row per token (a_rows_per_token = top_k: the first GEMM) or
                      (M * top_k, K) one per slot (a_rows_per_token = 1: the second), the
                      experts' activation dtype, on their CUDA device
    routing:          an ``IndexedRouting`` (``align_block_size``); its expert_ids are local
                      expert indices, and a block of -1 (another rank's expert) or of an index
                      outside [0, E) is skipped (its slots zeros). Where it holds the experts'
                      offsets (``expert_offsets``: align_block_size with no expert_map) any
                      block_size runs, on the offsets form of the grouped kernel; otherwise
                      block_size must be a multiple of ``grouped_block_m(experts, expected_m)``
                      (the tile rows of the block-aligned form)
    topk_weights:     (M, top_k) floating, or None
    expected_m:       the rows an expert is expected to hold (picks the tile); default the slots
                      over the experts, rounded up
    tile:             a forced tile (tuning, benchmarks): of the masked schedule's bodies with
                      the experts' offsets, else one whose block_m divides block_size

    Three launches: the routed rows gathered (moe_gather), ``gemm_grouped_kernel`` on them (the
    padding rows of an expert's blocks are zero rows), and the rows scattered to their slots; the
    gather and scatter are memory-bound copies of the activations and outputs that a loader and
    writer indexed through sorted_token_ids would save."""
    what = "gemm_indexed_kernel"
    routing_module.check_indexed_arguments(what, routing, a_rows_per_token)
    slots = routing.num_tokens * routing.top_k
    if (not isinstance(a, torch.Tensor) or a.dim() != 2 or a.shape[0] * a_rows_per_token != slots
            or a.shape[1] != experts.in_features or a.dtype != experts.act_dtype):
        raise ValueError(f"{what}: a must be ({slots // a_rows_per_token}, {experts.in_features}) "
                         f"{experts.act_dtype} for {routing.num_tokens} tokens of top-{routing.top_k} and "
                         f"a_rows_per_token={a_rows_per_token}, got {kernels._describe(a)}")
    routing_module.check_topk_weights(what, routing, topk_weights, a.device)
    if not a.is_cuda or a.device != experts.device:
        raise ValueError(f"{what}: a ({a.device}) and the experts ({experts.device}) must be on one CUDA device; "
                         "on the CPU, humming_aot.moe.gemm_indexed computes the same")
    rows = routing.sorted_token_ids.shape[0]
    block = routing.block_size
    if routing.expert_ids.shape[0] * block < rows:
        raise ValueError(f"{what}: the routing's expert_ids ({routing.expert_ids.shape[0]}) do not cover its "
                         f"{rows} rows in blocks of {block}")
    if expected_m is None:
        expected_m = max(1, -(-slots // experts.experts))
    offsets = routing.expert_offsets
    if offsets is not None and (not isinstance(offsets, torch.Tensor) or offsets.shape != (experts.experts + 1,)):
        offsets = None  # (not these experts' offsets: the block-aligned form, which checks the blocks' ids)
    if offsets is not None:  # the offsets form: any block, the masked schedule's tiles (wgmma-ws on sm90a)
        if tile is not None:
            tile = kernels.forced_tile(tile, experts, what, masked=True)
    else:
        if tile is not None:
            tile = kernels.forced_tile(tile, experts, what)
            block_m = tile.block_m
        else:
            block_m = kernels.grouped_block_m(experts, expected_m, a.device)
        if block % block_m:
            raise ValueError(f"{what}: the routing's block_size {block} is not a multiple of the kernel's {block_m} "
                             f"rows: align with moe.align_block_size(..., block_size=grouped_block_m(experts, "
                             f"{expected_m})) or a multiple of it")
    if slots == 0 or rows == 0:
        return torch.zeros(slots, experts.out_features, dtype=a.dtype, device=a.device)
    slot = routing.sorted_token_ids.to(device=a.device, dtype=torch.int64)
    real = (slot >= 0) & (slot < slots)
    # each block's expert on its rows (expand + reshape: no host round trip in any torch version)
    expert = routing.expert_ids.to(device=a.device, dtype=torch.int32).unsqueeze(1).expand(-1, block).reshape(-1)[:rows]
    real &= (expert >= 0) & (expert < experts.experts)
    slot = torch.where(real, slot, -1)
    gathered = routing_module.gather_rows(a, slot, a_rows_per_token)
    # (no zero-fill: the rows the kernel leaves, of no expert or blocks of padding only, go to the
    # dropped row)
    out = torch.empty(rows, experts.out_features, dtype=a.dtype, device=a.device)
    if offsets is not None:
        y = kernels.gemm_grouped_kernel(gathered, experts, offsets=offsets.to(device=a.device, dtype=torch.int32),
                                        expected_m=expected_m, tile=tile, out=out, routed_rows=min(slots, rows))
    else:
        row_expert = torch.where(real, expert, -1)
        y = kernels.gemm_grouped_kernel(gathered, experts, row_expert, expected_m=expected_m, tile=tile, out=out)
    if topk_weights is not None:
        weight = topk_weights.reshape(-1).float().index_select(0, torch.where(real, slot, 0))
        y = (y.float() * weight.unsqueeze(1)).to(a.dtype)
    # every row of no slot goes to one extra row, dropped: the real rows' slots are distinct
    wide = torch.zeros(slots + 1, experts.out_features, dtype=a.dtype, device=a.device)
    wide.index_copy_(0, torch.where(real, slot, slots), y)
    return wide[:slots]
