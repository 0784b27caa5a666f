"""The MoE GEMMs on their kernels, on the GPU: humming_aot.moe.gemm_masked_kernel (the masked
schedule of kernel/grouped_masked.cuh) and gemm_grouped_kernel (the contiguous schedule of
kernel/grouped_contiguous.cuh), each around an mma.sync body from the catalog or the JIT, against
the float64 reference of each expert's exact operands (and so against the expert loop of
humming_aot.moe, which defines them): uniform, skewed and empty counts, every tile size the
expected rows pick, experts whose global scales differ, bias, NaN-poisoned outputs whose rows
past each count (or padding rows) must stay untouched, and a captured CUDA graph replayed with
new counts and activations."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import dispatch, heuristics, ops
from humming_aot.moe import gemm_masked, gemm_masked_kernel, pack_experts
from humming_aot.spec import GemmType, KernelKey
from humming_aot.testing.jit import why_no_jit
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm, with_every_code


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if torch.cuda.get_device_capability() < (8, 0):
        return "the masked schedule wraps the sm_80+ mma.sync bodies"
    return why_no_jit("no catalog holds the grouped masked kernels yet, only the JIT builds them", "to build them")


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

FORMATS = ("int4:g128", "uint4:g64:zp", "mxfp4", "nvfp4", "int8:channel", "uint4:g128:zpf")


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _key(experts, rows: int, gemm_type: GemmType = GemmType.MASKED) -> KernelKey:
    """The kernel gemm_masked_kernel / gemm_grouped_kernel launches for `rows` expected rows."""
    import dataclasses

    spec = dataclasses.replace(ops.gemm_spec(experts.expert(0)), gemm_type=gemm_type)
    info = dispatch.device_info(torch.cuda.current_device())
    tile = heuristics.select_masked_tile(info.arches[0], rows, experts.k, experts.group_size, spec.w_bits,
                                         masked=gemm_type is GemmType.MASKED,
                                         zero_point=experts.w_zero_point is not None)
    return dispatch.obtain(spec, torch.cuda.current_device(), rows, tile, experts.k, experts.group_size,
                           n=experts.n)[0]


def _forced_key(experts, rows: int, tile: str) -> KernelKey:
    """The masked kernel of a forced tile (whether it rounds the scales with the weights)."""
    import dataclasses

    from humming_aot.moe.kernels import forced_tile

    spec = dataclasses.replace(ops.gemm_spec(experts.expert(0)), gemm_type=GemmType.MASKED)
    return dispatch.obtain(spec, torch.cuda.current_device(), rows, forced_tile(tile, experts, "test", masked=True),
                           experts.k, experts.group_size, n=experts.n)[0]


def _check(out, a, experts, counts, bias, key, context):
    for e, count in enumerate(counts.tolist()):
        w_eff = experts.effective_weight(e, scales_in_fp32=key.scales_in_fp32)
        if count:
            b = None if bias is None else bias[e]
            assert_gemm_close(out[e, :count], reference_gemm(a[e, :count], w_eff, b), a=a[e, :count], w_eff=w_eff,
                              bias=b, context=f"{context} expert {e} of {count} rows")


@pytest.mark.parametrize("fmt", FORMATS)
def test_masked_kernel_matches_the_reference_under_uniform_skewed_and_empty_counts(fmt):
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 6, 192, 512
    w = torch.randn(e, n, k, device="cuda", generator=gen) * 0.05
    w[1] *= 100  # experts whose global scales differ (nvfp4's, and the power of two pack moves into it)
    experts = pack_experts(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=torch.bfloat16)
    for max_m, counts in ((8, [8, 8, 8, 8, 8, 8]), (40, [0, 40, 1, 17, 0, 39]), (16, [0] * 6), (130, [130, 0, 0, 0, 0, 3])):
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
        bias = (torch.randn(e, n, device="cuda", generator=gen) * 0.5).to(torch.bfloat16) if max_m == 40 else None
        for expected in (1, 16, max_m):
            key = _key(experts, min(expected, max_m))
            context = f"{key.name} fmt={fmt} max_m={max_m} counts={counts} seed={seed}"
            out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm_masked_kernel(a, experts, masked_m, expected_m=expected, bias=bias, out=out)
            _check(out, a, experts, masked_m, bias, key, context)
            for i, count in enumerate(counts):  # rows past each count are left as they were
                assert out[i, count:].isnan().all(), context
            fresh = gemm_masked_kernel(a, experts, masked_m, expected_m=expected, bias=bias)
            if bias is None:  # the expert loop zero-fills the rows past each count, and so does a new output
                loop = gemm_masked(a, experts, masked_m)
                assert torch.equal(fresh.isnan(), loop.isnan()) and not fresh.isnan().any(), context
                for i, count in enumerate(counts):
                    assert not fresh[i, count:].any(), context


def test_masked_kernel_replays_in_a_cuda_graph_with_new_counts():
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k, max_m = 4, 128, 256, 24
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
    masked_m = torch.tensor([3, 24, 0, 9], dtype=torch.int32, device="cuda")
    out = torch.zeros(e, max_m, n, device="cuda", dtype=torch.bfloat16)
    gemm_masked_kernel(a, experts, masked_m, expected_m=8, out=out)  # loads (or compiles) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm_masked_kernel(a, experts, masked_m, expected_m=8, out=out)
    key = _key(experts, 8)
    for counts in ([24, 0, 1, 7], [0, 0, 0, 24]):
        a.copy_(torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16))
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, a, experts, masked_m, None, key, f"graph replay counts={counts} seed={seed}")


# --- the grouped contiguous schedule (kernel/grouped_contiguous.cuh) ---------------------------------


def _aligned_rows(counts: list[int], block: int) -> list[int]:
    """Each expert's rows padded to whole blocks, after one block of padding only (rows an expert-
    parallel rank does not own): the row experts, -1 for padding."""
    row_expert = [-1] * block
    for e, count in enumerate(counts):
        row_expert += [e] * count + [-1] * (-count % block)
    return row_expert


@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_kernel_matches_the_reference_on_block_aligned_rows(fmt):
    from humming_aot.moe import gemm_grouped, gemm_grouped_kernel, grouped_block_m

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 5, 192, 512
    w = torch.randn(e, n, k, device="cuda", generator=gen) * 0.05
    w[2] *= 100  # experts whose global scales differ
    experts = pack_experts(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=torch.bfloat16)
    for expected, counts in ((1, [1, 0, 3, 1, 0]), (16, [16, 5, 0, 33, 2]), (64, [0, 130, 7, 0, 64])):
        block = grouped_block_m(experts, expected)
        row_expert_list = _aligned_rows(counts, block)
        rows = len(row_expert_list)
        row_expert = torch.tensor(row_expert_list, dtype=torch.int32, device="cuda")
        padding = row_expert == -1
        a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
        a[padding] = 0  # padding rows inside an expert's last block are computed: zero rows give the bias
        bias = (torch.randn(e, n, device="cuda", generator=gen) * 0.5).to(torch.bfloat16) if expected == 16 else None
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm_grouped_kernel(a, experts, row_expert, expected_m=expected, bias=bias, out=out)
        key = _key(experts, expected, GemmType.GROUPED)
        context = f"{key.name} fmt={fmt} counts={counts} block={block} seed={seed}"
        for start in range(0, rows, block):
            x = row_expert_list[start]
            block_rows = slice(start, min(start + block, rows))
            if x < 0:  # a block of padding only: left as it was
                assert out[block_rows].isnan().all(), f"{context} block at {start}"
                continue
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            b = None if bias is None else bias[x]
            assert_gemm_close(out[block_rows], reference_gemm(a[block_rows], w_eff, b), a=a[block_rows], w_eff=w_eff,
                              bias=b, context=f"{context} block at {start}, expert {x}")
        if bias is None:  # the expert loop defines the layout: padding rows zero there and here
            fresh = gemm_grouped_kernel(a, experts, row_expert, expected_m=expected)
            loop = gemm_grouped(a, experts, row_expert=row_expert)
            assert not fresh[padding].any() and not loop[padding].any(), context


def test_grouped_kernel_skips_blocks_whose_expert_lies_past_the_experts():
    """A block whose first row's id is E or more is padding to the kernel (the id lies outside the
    stacked weights): its NaN-poisoned rows are left, and every other block's bits equal those of
    the same layout with -1 there."""
    from humming_aot.moe import gemm_grouped_kernel, grouped_block_m

    gen = torch.Generator(device="cuda").manual_seed(_seed())
    e, n, k = 4, 128, 256
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    block = grouped_block_m(experts, 16)
    row_expert_list = _aligned_rows([16, 3, 0, 20], block)
    a = torch.randn(len(row_expert_list), k, device="cuda", generator=gen).to(torch.bfloat16)
    runs = []
    for bad in (-1, e, e + 1000):
        ids = torch.tensor(row_expert_list, dtype=torch.int32, device="cuda")
        ids[:block] = bad  # (the leading block, padding in the layout)
        out = torch.full((len(row_expert_list), n), float("nan"), device="cuda", dtype=torch.bfloat16)
        runs.append(gemm_grouped_kernel(a, experts, ids, expected_m=16, out=out))
    torch.cuda.synchronize()
    assert runs[0][:block].isnan().all() and not runs[0][block:].isnan().all()
    for run in runs[1:]:
        torch.testing.assert_close(run, runs[0], rtol=0, atol=0, equal_nan=True)


def test_grouped_kernel_on_a_routing_aligned_by_align_groups():
    """The whole contiguous path: a top-k routing aligned to the kernel's block (moe.align_groups,
    moe.permute_aligned), the kernel, and moe.unpermute_aligned back to slot order, against the
    float64 reference of each token's experts."""
    from humming_aot.moe import align_groups, gemm_grouped_kernel, grouped_block_m, permute_aligned, unpermute_aligned

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts_n, n, k, tokens, top_k = 8, 128, 256, 37, 2
    experts = pack_experts(humming_aot.quantize(torch.randn(experts_n, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    topk_ids = torch.randn(tokens, experts_n, device="cuda", generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
    expected = tokens * top_k // experts_n
    grouping = align_groups(topk_ids, experts_n, grouped_block_m(experts, expected))
    rows = permute_aligned(hidden, grouping)
    out = unpermute_aligned(gemm_grouped_kernel(rows, experts, grouping.row_expert, expected_m=expected), grouping,
                            tokens)
    key = _key(experts, expected, GemmType.GROUPED)
    for x in range(experts_n):
        token, slot = torch.nonzero(topk_ids == x, as_tuple=True)
        if token.numel():
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(out[token, slot], reference_gemm(hidden[token], w_eff), a=hidden[token], w_eff=w_eff,
                              context=f"{key.name} expert {x} seed={seed}")


def test_the_whole_contiguous_path_replays_in_a_cuda_graph_with_new_routings():
    """align_groups, permute_aligned, the grouped kernel and unpermute_aligned captured in one CUDA
    graph (no host round trip anywhere), replayed with new routings and tokens."""
    from humming_aot.moe import align_groups, gemm_grouped_kernel, grouped_block_m, permute_aligned, unpermute_aligned

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts_n, n, k, tokens, top_k = 6, 128, 256, 9, 2
    experts = pack_experts(humming_aot.quantize(torch.randn(experts_n, n, k, device="cuda", generator=gen) * 0.05,
                                                "uint4:g64:zp"), act_dtype=torch.bfloat16)
    expected = 4
    block = grouped_block_m(experts, expected)
    topk_ids = torch.randn(tokens, experts_n, device="cuda", generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)

    def step():
        grouping = align_groups(topk_ids, experts_n, block)
        rows = gemm_grouped_kernel(permute_aligned(hidden, grouping), experts, grouping.row_expert,
                                   expected_m=expected)
        return unpermute_aligned(rows, grouping, tokens)

    step()  # loads (or compiles) the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    key = _key(experts, expected, GemmType.GROUPED)
    for _ in range(2):
        topk_ids.copy_(torch.randn(tokens, experts_n, device="cuda", generator=gen).topk(top_k, dim=1).indices)
        hidden.copy_(torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        for x in range(experts_n):
            token, slot = torch.nonzero(topk_ids == x, as_tuple=True)
            if token.numel():
                w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
                assert_gemm_close(out[token, slot], reference_gemm(hidden[token], w_eff), a=hidden[token],
                                  w_eff=w_eff, context=f"graph replay expert {x} seed={seed}")


# --- the indexed (fused_moe) layout on the grouped kernel ---


def _indexed_reference_check(out, a_rows, topk_ids, experts, key, kept, context):
    """out (slots, N) against the float64 reference of each kept slot's row and expert; the
    slots not kept are zeros."""
    flat = topk_ids.reshape(-1)
    for x in range(experts.experts):
        slots = torch.nonzero((flat == x) & kept, as_tuple=True)[0]
        if slots.numel():
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(out[slots], reference_gemm(a_rows[slots], w_eff), a=a_rows[slots], w_eff=w_eff,
                              context=f"{context} expert {x}")
    assert bool((out[~kept] == 0).all()), f"{context}: slots of no block are not zeros"


@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g64:zp"))
@pytest.mark.parametrize("kind", ("uniform", "one", "ep"))
def test_indexed_kernel_matches_the_reference_in_both_gemms(fmt, kind):
    """gemm_indexed_kernel on moe.align_block_size's layout: the first GEMM (one row per token,
    a_rows_per_token = top_k) and the second (one row per slot, with the routing weights) against
    the float64 reference of each slot's operands; the weights applied as the expert loop applies
    them (bit for bit on the same rows); with expert parallelism (kind "ep": every other expert
    on another rank) those experts' slots are zeros."""
    from humming_aot.moe import align_block_size, gemm_indexed_kernel, grouped_block_m

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts_n, n, k, tokens, top_k = 8, 128, 256, 37, 2
    local_n = experts_n // 2 if kind == "ep" else experts_n
    experts = pack_experts(humming_aot.quantize(torch.randn(local_n, n, k, device="cuda", generator=gen) * 0.05,
                                                fmt), act_dtype=torch.bfloat16)
    scores = torch.randn(tokens, experts_n, device="cuda", generator=gen)
    if kind == "one":
        scores[:, 3] += 10.0  # every token's first choice is expert 3
    topk_ids = scores.topk(top_k, dim=1).indices
    expected = max(1, tokens * top_k // experts_n)
    block = 2 * grouped_block_m(experts, expected)  # a multiple of the kernel's rows
    expert_map = None
    global_ids = topk_ids
    if kind == "ep":  # this rank holds the even experts, as local ids 0, 1, ...
        expert_map = torch.where(torch.arange(experts_n) % 2 == 0, torch.arange(experts_n) // 2, -1).int().cuda()
    routing = align_block_size(topk_ids, experts_n, block, expert_map, check_range=False)
    kept = torch.ones(tokens * top_k, dtype=torch.bool, device="cuda")
    local_ids = global_ids
    if kind == "ep":
        kept = (global_ids.reshape(-1) % 2) == 0
        local_ids = torch.where(global_ids % 2 == 0, global_ids // 2, -1)
    hidden = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
    # no expert_map: the offsets form (the masked schedule's tile); with one, the block-aligned form
    key = _key(experts, expected, GemmType.GROUPED if routing.expert_offsets is None else GemmType.MASKED)
    first = gemm_indexed_kernel(hidden, experts, routing, a_rows_per_token=top_k, expected_m=expected)
    assert first.shape == (tokens * top_k, n) and first.dtype == torch.bfloat16
    _indexed_reference_check(first, hidden.repeat_interleave(top_k, 0), local_ids, experts, key, kept,
                             f"{fmt} {kind} gemm1 seed={seed}")
    per_slot = torch.randn(tokens * top_k, k, device="cuda", generator=gen).to(torch.bfloat16)
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    plain = gemm_indexed_kernel(per_slot, experts, routing, a_rows_per_token=1, expected_m=expected)
    _indexed_reference_check(plain, per_slot, local_ids, experts, key, kept, f"{fmt} {kind} gemm2 seed={seed}")
    weighted = gemm_indexed_kernel(per_slot, experts, routing, a_rows_per_token=1, topk_weights=weights,
                                   expected_m=expected)
    expect = (plain.float() * weights.reshape(-1, 1)).to(torch.bfloat16)
    assert torch.equal(weighted, torch.where(kept.unsqueeze(1), expect, torch.zeros_like(expect))), \
        f"{fmt} {kind}: the routing weights are not applied as the expert loop applies them (seed={seed})"


def test_indexed_kernel_replays_in_a_cuda_graph_and_refuses_a_block_it_cannot_tile():
    """align_block_size (check_range=False) and gemm_indexed_kernel captured in one CUDA graph (no
    host round trip), replayed with new routings; a block_size the kernel's tile rows do not divide
    runs on the offsets form (no expert_map) and is refused with the block to use on the
    block-aligned one (an expert_map)."""
    from humming_aot.moe import align_block_size, gemm_indexed_kernel, grouped_block_m

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts_n, n, k, tokens, top_k = 6, 128, 256, 9, 2
    experts = pack_experts(humming_aot.quantize(torch.randn(experts_n, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    expected = 4
    block = grouped_block_m(experts, expected)
    topk_ids = torch.randn(tokens, experts_n, device="cuda", generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)

    def step():
        routing = align_block_size(topk_ids, experts_n, block, check_range=False)
        return gemm_indexed_kernel(hidden, experts, routing, a_rows_per_token=top_k, expected_m=expected)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    key = _key(experts, expected, GemmType.MASKED)
    kept = torch.ones(tokens * top_k, dtype=torch.bool, device="cuda")
    for replay in range(2):
        topk_ids.copy_(torch.randn(tokens, experts_n, device="cuda", generator=gen).topk(top_k, dim=1).indices)
        hidden.copy_(torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _indexed_reference_check(out, hidden.repeat_interleave(top_k, 0), topk_ids, experts, key, kept,
                                 f"graph replay {replay} seed={seed}")
    odd = align_block_size(topk_ids, experts_n, block + 1)
    out = gemm_indexed_kernel(hidden, experts, odd, a_rows_per_token=top_k, expected_m=expected)
    _indexed_reference_check(out, hidden.repeat_interleave(top_k, 0), topk_ids, experts, key, kept,
                             f"block {block + 1} seed={seed}")
    if block > 1:
        mapped = align_block_size(topk_ids, experts_n, block + 1, torch.arange(experts_n, device="cuda").int())
        with pytest.raises(ValueError, match="not a multiple of the kernel's"):
            gemm_indexed_kernel(hidden, experts, mapped, a_rows_per_token=top_k, topk_weights=weights,
                                expected_m=expected)


# --- the persistent walk: many experts, many tiles per CTA, long runs of empty experts / padding ---


@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g64:zp"))
def test_persistent_schedules_walk_many_experts_and_long_padding(fmt):
    """300 experts (two of the masked walk's 256-expert windows): every expert full, so that each
    resident CTA runs many tiles in turn (14,400 tiles of 16 x 64); then a few experts at the
    windows' edges (0, 255, 256, 299) among empty ones; and the contiguous layout of the same sparse
    counts with 1,200 blocks of padding only before them (9,600 tiles of 8 x 128: more than 32 tiles
    of each resident CTA, so that its look-ahead takes several windows). Every real row against the
    float64 reference; rows past each count and padding blocks stay NaN."""
    from humming_aot.moe import gemm_grouped_kernel, grouped_block_m

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k, max_m = 300, 1024, 256, 48
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05, fmt),
                           act_dtype=torch.bfloat16)
    a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
    sparse = [0] * e
    for expert, count in ((0, 3), (255, 48), (256, 1), (299, 17), (128, 30)):
        sparse[expert] = count
    for expected, counts in ((16, [max_m] * e), (1, sparse)):
        key = _key(experts, expected)
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm_masked_kernel(a, experts, masked_m, expected_m=expected, out=out)
        context = f"{key.name} fmt={fmt} expected={expected} seed={seed}"
        _check(out, a, experts, masked_m, None, key, context)
        for i, count in enumerate(counts):
            assert out[i, count:].isnan().all(), f"{context} expert {i}"

    block = grouped_block_m(experts, 1)
    row_expert_list = [-1] * (1200 * block) + _aligned_rows(sparse, block)[block:]
    rows = len(row_expert_list)
    row_expert = torch.tensor(row_expert_list, dtype=torch.int32, device="cuda")
    flat = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    flat[row_expert == -1] = 0
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_grouped_kernel(flat, experts, row_expert, expected_m=1, out=out)
    key = _key(experts, 1, GemmType.GROUPED)
    context = f"{key.name} fmt={fmt} contiguous seed={seed}"
    for start in range(0, rows, block):
        x = row_expert_list[start]
        block_rows = slice(start, min(start + block, rows))
        if x < 0:
            assert out[block_rows].isnan().all(), f"{context} block at {start}"
            continue
        w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
        assert_gemm_close(out[block_rows], reference_gemm(flat[block_rows], w_eff), a=flat[block_rows], w_eff=w_eff,
                          context=f"{context} block at {start}, expert {x}")
