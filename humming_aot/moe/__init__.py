"""Mixture-of-experts weights and layouts: stacked expert packing (``pack_experts``), the routing
steps (``align_block_size``, ``group_rows``, ``permute`` / ``unpermute``, activations,
``weighted_sum``, ``combine``; on a GPU as humming_aot's own kernels, moe/cuda_steps.py) and the
three GEMM types as a loop of dense GEMMs (``gemm_indexed``, ``gemm_grouped``, ``gemm_masked``),
which define what the grouped kernels must compute, and the grouped kernels,
``gemm_masked_kernel`` and ``gemm_grouped_kernel`` (persistent schedules around the dense bodies;
moe/kernels.py), with ``gemm_indexed_kernel`` (fused_moe's layout) on the latter. Experts with
8-bit activations (W4A8: int4, uint4 with zero points or MXFP4 experts; W8A8: float8 per channel
or per 128 x 128 block, int8): ``pack_w4a8_experts`` / ``pack_w8a8_experts``, the loops
``gemm_grouped_a8`` / ``gemm_masked_a8`` and their kernels (moe/a8.py), and fused_moe's indexed
layout on them (``gemm_indexed_a8``, moe/indexed_a8.py).
``humming_aot.nn.QuantizedMoE`` is the layer built on them."""
from __future__ import annotations

from humming_aot.moe.a8 import (
    PackedW4A8Experts,
    PackedW8A8Experts,
    gemm_grouped_a8,
    gemm_grouped_a8_kernel,
    gemm_masked_a8,
    gemm_masked_a8_kernel,
    grouped_a8_block_m,
    pack_a8_experts,
    pack_w4a8_experts,
    pack_w8a8_experts,
)
from humming_aot.moe.expert_loop import gemm_grouped, gemm_indexed, gemm_masked
from humming_aot.moe.indexed import gemm_indexed_kernel
from humming_aot.moe.indexed_a8 import gemm_indexed_a8
from humming_aot.moe.kernels import gemm_grouped_kernel, gemm_masked_kernel, grouped_block_m
from humming_aot.moe.packing import PackedExperts, expert_weight, pack_experts
from humming_aot.moe.routing import (
    AlignedGrouping,
    GroupedRouting,
    IndexedRouting,
    align_block_size,
    align_groups,
    align_offsets,
    combine,
    group_rows,
    permute,
    permute_aligned,
    silu_and_mul,
    swiglu_oai,
    unpermute,
    unpermute_aligned,
    weighted_sum,
)

__all__ = [
    "AlignedGrouping", "GroupedRouting", "IndexedRouting", "PackedExperts", "PackedW4A8Experts",
    "PackedW8A8Experts", "align_block_size",
    "align_groups", "align_offsets", "combine", "expert_weight", "gemm_grouped", "gemm_grouped_kernel",
    "gemm_grouped_a8", "gemm_grouped_a8_kernel", "gemm_indexed", "gemm_indexed_a8",
    "gemm_indexed_kernel", "gemm_masked",
    "gemm_masked_kernel", "gemm_masked_a8", "gemm_masked_a8_kernel", "group_rows", "grouped_a8_block_m", "grouped_block_m",
    "pack_a8_experts", "pack_experts", "pack_w4a8_experts", "pack_w8a8_experts", "permute", "permute_aligned",
    "silu_and_mul", "swiglu_oai", "unpermute", "unpermute_aligned", "weighted_sum",
]
