"""Weights whose N or K is not a multiple of 64 (tensor-parallel shards: Qwen3-30B-A3B's K = 96 at
TP8), which pack pads for the kernels, on the GPU: ops.gemm and QuantizedLinear (the general path:
the eager fast path is for aligned weights), and the grouped MoE kernels (masked and contiguous,
with and without a NaN-poisoned output of the caller), each against the float64 reference of the
weight's own operands."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import ops
from humming_aot.moe import gemm_grouped_kernel, gemm_masked_kernel, grouped_block_m, pack_experts
from humming_aot.nn import QuantizedLinear
from humming_aot.testing.jit import why_no_jit
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

SHAPES = [(100, 128, "int4:g128"), (192, 96, "mxfp4"), (96, 96, "uint4:g32:zp"), (130, 80, "float4e2m1:g16")]


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


@pytest.mark.parametrize("n,k,fmt", SHAPES)
def test_dense_gemm_of_a_padded_weight_matches_the_reference(n, k, fmt):
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, fmt),
                              act_dtype=torch.bfloat16)
    assert packed.padded and (packed.out_features, packed.in_features) == (n, k)
    a = torch.randn(7, k, device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    out = ops.gemm(a, packed, bias)
    assert out.shape == (7, n)
    w_eff = ops.effective_weight(packed, 7)
    assert_gemm_close(out, reference_gemm(a, w_eff, bias), a=a, w_eff=w_eff, bias=bias,
                      context=f"{fmt} {n}x{k} seed={seed}")
    assert torch.equal(QuantizedLinear(packed, bias)(a), out)


@pytest.mark.skipif(why_no_jit("the MoE kernels come from the JIT", "to build them") is not None,
                    reason=why_no_jit("the MoE kernels come from the JIT", "to build them") or "")
@pytest.mark.parametrize("n,k,fmt", SHAPES)
def test_moe_kernels_of_padded_experts_match_the_reference(n, k, fmt):
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, max_m = 3, 20
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05, fmt),
                           act_dtype=torch.bfloat16)
    assert experts.padded
    a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
    counts = [20, 0, 7]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    bias = torch.randn(e, n, device="cuda", generator=gen).to(torch.bfloat16)
    poisoned = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fresh = gemm_masked_kernel(a, experts, masked_m, expected_m=8, bias=bias)
    gemm_masked_kernel(a, experts, masked_m, expected_m=8, bias=bias, out=poisoned)
    for x, count in enumerate(counts):
        w_eff = ops.effective_weight(experts.expert(x), 8)
        ref = reference_gemm(a[x, :count], w_eff, bias[x])
        for out in (fresh, poisoned):
            assert out.shape == (e, max_m, n)
            assert_gemm_close(out[x, :count], ref, a=a[x, :count], w_eff=w_eff, bias=bias[x],
                              context=f"masked {fmt} {n}x{k} expert {x} seed={seed}")
        assert poisoned[x, count:].isnan().all() and not fresh[x, count:].any()
    block = grouped_block_m(experts, 8)
    row_expert = [0] * 9 + [-1] * (-9 % block) + [2] * block
    rows = torch.randn(len(row_expert), k, device="cuda", generator=gen).to(torch.bfloat16)
    rows[torch.tensor(row_expert, device="cuda") == -1] = 0
    grouped = gemm_grouped_kernel(rows, experts, torch.tensor(row_expert, dtype=torch.int32, device="cuda"),
                                  expected_m=8)
    assert grouped.shape == (len(row_expert), n)
    for x, start, stop in ((0, 0, 9), (2, len(row_expert) - block, len(row_expert))):
        w_eff = ops.effective_weight(experts.expert(x), 8)
        assert_gemm_close(grouped[start:stop], reference_gemm(rows[start:stop], w_eff), a=rows[start:stop],
                          w_eff=w_eff, context=f"grouped {fmt} {n}x{k} expert {x} seed={seed}")
