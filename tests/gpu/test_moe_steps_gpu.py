"""The MoE steps around the GEMMs as helper kernels (humming_aot.moe.cuda_steps) against their
torch operations, bit for bit: routing into the three layouts (uniform, skewed, empty and
dropped-id routing; int32 and int64 ids; 1 to 1024 experts; one chunk and many), the gather of
the routed rows, the two activations and the weighted combine (fp32 and 16-bit weights, 16-byte and 4-byte paths, strided
rows), and all of them replayed in a CUDA graph. The torch reference runs on the same GPU with
HUMMING_AOT_HELPERS=0, so both sides use the GPU's expf."""
from __future__ import annotations

import os

import pytest
import torch

from humming_aot import helper_kernels, moe
from humming_aot.moe import cuda_steps
from humming_aot.testing.jit import why_no_jit

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def launched(monkeypatch):
    """The helper kernels switched on and loadable (from a catalog or the JIT), and the symbols
    launched during the test (a test that means the kernels checks that they ran)."""
    monkeypatch.setenv("HUMMING_AOT_HELPERS", "1")
    if not helper_kernels.available("moe", torch.cuda.current_device()):
        why = why_no_jit("the helper kernels come from a catalog or the JIT", "to build them")
        pytest.skip(why or "the moe helper unit cannot be loaded here (see the warning logged)")
    symbols = []
    launch = cuda_steps._launch

    def spy(device, symbol, *args):
        symbols.append(symbol)
        return launch(device, symbol, *args)

    monkeypatch.setattr(cuda_steps, "_launch", spy)
    return symbols


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _reference(monkeypatch, fn, *args, **kwargs):
    monkeypatch.setenv("HUMMING_AOT_HELPERS", "0")
    try:
        return fn(*args, **kwargs)
    finally:
        monkeypatch.setenv("HUMMING_AOT_HELPERS", "1")


def _topk(tokens: int, experts: int, top_k: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    scores = torch.rand(tokens, experts, generator=gen)
    if kind == "skewed":
        scores[:, : max(1, experts // 16)] += 4.0
    elif kind == "empty":
        scores[:, experts // 2:] -= 10.0
    elif kind == "one":  # every token's first choice is expert 0
        scores[:, 0] += 10.0
    return scores.topk(top_k, dim=1).indices


CASES = [  # tokens, experts, top_k
    (1, 256, 8), (3, 8, 2), (37, 128, 8), (256, 256, 8), (300, 1024, 4), (1000, 64, 6), (4096, 256, 8),
    (4096, 1024, 8), (0, 16, 2), (17, 1, 1),
    # around the segments kernel's range: 513 slots, 512 slots, more than 256 experts
    (65, 256, 8), (100, 128, 8), (129, 16, 4), (600, 1, 1), (171, 64, 3), (64, 256, 8), (65, 257, 8),
]


def _route_kernel(slots: int, experts: int) -> str:
    """The routing kernel cuda_steps.route launches for this many slots and experts."""
    if (cuda_steps.ROUTE_SEGMENTS_MIN_SLOTS <= slots <= cuda_steps.ROUTE_SEGMENTS_MAX_SLOTS
            and experts <= cuda_steps.ROUTE_SEGMENTS_MAX_EXPERTS):
        return "segments"
    return "single" if slots <= cuda_steps.ROUTE_CHUNK else "place"


@pytest.mark.parametrize("tokens,experts,top_k", CASES)
@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty", "one"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_routing_kernels_match_the_torch_layouts(monkeypatch, launched, tokens, experts, top_k, kind, dtype):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    ids = _topk(tokens, experts, min(top_k, experts), kind, gen).to(dtype).cuda()
    got = moe.group_rows(ids, experts, check_range=False)
    ref = _reference(monkeypatch, moe.group_rows, ids, experts, check_range=False)
    for field in ("slot_of_row", "offsets", "row_expert", "row_of_slot", "offsets_int32"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), f"group_rows {field} seed={seed}"
    for block in (1, 8, 16, 64):
        got = moe.align_groups(ids, experts, block)
        ref = _reference(monkeypatch, moe.align_groups, ids, experts, block)
        for field in ("slot_of_row", "row_expert", "row_of_slot"):
            assert torch.equal(getattr(got, field), getattr(ref, field)), f"align_groups {field} {block} seed={seed}"
        emap = None
        if block == 16:  # expert parallelism: every other expert on another rank
            emap = torch.where(torch.arange(experts) % 2 == 0, torch.arange(experts) // 2, -1).int().cuda()
        got = moe.align_block_size(ids, experts, block, emap, check_range=False)
        ref = _reference(monkeypatch, moe.align_block_size, ids, experts, block, emap)
        for field in ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"):
            assert torch.equal(getattr(got, field), getattr(ref, field)), f"align_block_size {field} {block} seed={seed}"
        if emap is None:  # the experts' offsets (the offsets form of gemm_indexed_kernel); none with a map
            assert torch.equal(got.expert_offsets, ref.expert_offsets), f"align_block_size offsets {block} seed={seed}"
        else:
            assert got.expert_offsets is None and ref.expert_offsets is None
    kernel = _route_kernel(tokens * min(top_k, experts), experts)
    assert f"moe_route_{kernel}_{'i32' if dtype == torch.int32 else 'i64'}" in launched


@pytest.mark.parametrize("tokens", [5, 100, 700])  # one chunk (single, segments), and three
def test_routing_kernels_drop_ids_out_of_range_in_every_layout(monkeypatch, launched, tokens):
    """Ids outside [0, E) get no row in any layout; the other slots are laid out as the torch
    path lays them out when every dropped id is sent to an extra last expert, whose rows are then
    the padding."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    experts, top_k = 64, 8
    ids = _topk(tokens, experts, top_k, "uniform", gen)
    drop = torch.rand(ids.shape, generator=gen) < 0.2
    ids = torch.where(drop, torch.where(torch.rand(ids.shape, generator=gen) < 0.5, -1, experts + 3), ids).cuda()
    virtual = torch.where(drop.cuda(), experts, ids)  # the dropped ids on an extra expert E
    kept = int((~drop).sum())
    got = moe.group_rows(ids, experts, check_range=False)
    ref = _reference(monkeypatch, moe.group_rows, virtual, experts + 1)
    assert torch.equal(got.offsets, ref.offsets[:-1]) and int(got.offsets[-1]) == kept
    assert torch.equal(got.slot_of_row[:kept], ref.slot_of_row[:kept]) and bool((got.slot_of_row[kept:] == -1).all())
    assert torch.equal(got.row_of_slot, torch.where(drop.reshape(-1).cuda(), -1, ref.row_of_slot))
    for block in (1, 16):
        got = moe.align_groups(ids, experts, block)
        ref = _reference(monkeypatch, moe.align_groups, virtual, experts + 1, block)
        ref_slots = torch.where(ref.row_expert == experts, -1, ref.slot_of_row)[: got.slot_of_row.shape[0]]
        assert torch.equal(got.slot_of_row, ref_slots), f"align_groups {block} seed={seed}"
        got = moe.align_block_size(ids, experts, block, check_range=False)
        ref = _reference(monkeypatch, moe.align_block_size, virtual, experts + 1, block)
        size = got.sorted_token_ids.shape[0]
        total = int(got.num_tokens_post_padded)
        assert torch.equal(got.sorted_token_ids[:total], ref.sorted_token_ids[:total])
        assert bool((got.sorted_token_ids[total:] == tokens * top_k).all()) and size == tokens * top_k + experts * (block - 1)
        assert torch.equal(got.expert_ids[: total // block], ref.expert_ids[: total // block])
        assert bool((got.expert_ids[total // block:] == -1).all())
    assert f"moe_route_{_route_kernel(tokens * top_k, experts)}_i64" in launched  # the kernel this size takes


def test_routing_kernel_drops_ids_out_of_range():
    """An id outside [0, E) (expert parallelism's -1) gets no row: its slot's row is -1 and the
    other slots keep the layout they would have without it."""
    ids = torch.tensor([[0, -1], [3, 1], [7, 0], [2, 9]], dtype=torch.int32).cuda()  # E = 8: -1 and 9 drop
    r = moe.group_rows(ids, 8, check_range=False)
    flat = ids.reshape(-1).cpu()
    kept = [(int(e), s) for s, e in enumerate(flat.tolist()) if 0 <= e < 8]
    order = [s for _, s in sorted(kept)]
    assert r.slot_of_row.cpu().tolist() == order + [-1, -1]
    assert r.offsets.cpu().tolist() == [0, 2, 3, 4, 5, 5, 5, 5, 6]
    assert r.row_of_slot.cpu().tolist() == [0, -1, 4, 2, 5, 1, 3, -1]
    y = torch.randn(8, 16, dtype=torch.bfloat16).cuda()
    w = torch.rand(4, 2).cuda()
    expect = torch.zeros(4, 16)
    for s, row in enumerate(r.row_of_slot.cpu().tolist()):
        if row >= 0:
            expect[s // 2] += y[row].float().cpu() * w.reshape(-1)[s].cpu()
    assert torch.equal(moe.combine(y, r, w).cpu(), expect.bfloat16())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [7168, 2048, 2880, 6])
def test_gather_kernel_matches_index_select(monkeypatch, launched, dtype, k):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for tokens, experts, top_k in ((1, 256, 8), (37, 16, 4), (513, 128, 8)):
        ids = _topk(tokens, experts, top_k, "uniform", gen).int().cuda()
        hidden = torch.randn(tokens, k + 2, generator=gen).to(dtype).cuda()[:, :k]  # strided rows
        routing = moe.group_rows(ids, experts, check_range=False)
        got = moe.permute(hidden, routing)
        assert torch.equal(got, _reference(monkeypatch, moe.permute, hidden, routing)), f"permute seed={seed}"
        assert torch.equal(got, hidden.index_select(0, routing.slot_of_row // top_k))
        grouping = moe.align_groups(ids, experts, 16)
        got = moe.permute_aligned(hidden.contiguous(), grouping)
        ref = _reference(monkeypatch, moe.permute_aligned, hidden.contiguous(), grouping)
        assert torch.equal(got, ref), f"permute_aligned seed={seed}"
    empty = moe.align_groups(torch.zeros(0, 2, dtype=torch.int32).cuda(), 4, 8)
    rows = moe.permute_aligned(torch.zeros(0, k, dtype=dtype).cuda(), empty)
    assert rows.shape == (4 * 7, k) and not rows.any()
    assert f"moe_gather_v{4 if k % 8 == 0 else 1}" in launched


@pytest.mark.parametrize("dtype,k", [(torch.uint8, 7168), (torch.float8_e4m3fn, 2048), (torch.int8, 4),
                                     (torch.float32, 1), (torch.float32, 56)])
def test_gather_kernel_carries_8_bit_codes_and_float32_scales(monkeypatch, launched, dtype, k):
    """The A8 layer's gather of activation codes and their scales: the 16-bit copy kernel over the
    rows' bytes, bit for bit the torch path (NaN codes and scales included); rows whose bytes are
    not whole words stay on the torch path."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for tokens, experts, top_k in ((1, 256, 8), (37, 16, 4), (513, 128, 8)):
        ids = _topk(tokens, experts, top_k, "uniform", gen).int().cuda()
        bits = torch.randint(0, 256, (tokens, (k + 4) * torch.empty(0, dtype=dtype).element_size()), generator=gen,
                             dtype=torch.uint8)
        hidden = bits.view(dtype).cuda()[:, :k]  # (strided rows; every bit pattern, NaNs among them)
        routing = moe.group_rows(ids, experts, check_range=False)
        launched.clear()
        got = moe.permute(hidden, routing)
        # (the reference gathers the same bytes with torch operations: uint8 takes every one of them)
        ref = _reference(monkeypatch, moe.permute, hidden.view(torch.uint8), routing)
        assert got.dtype == dtype and torch.equal(got.view(torch.uint8), ref), f"seed={seed}"
        assert any(name.startswith("moe_gather_v") for name in launched)
        grouping = moe.align_groups(ids, experts, 16)
        got = moe.permute_aligned(hidden.contiguous(), grouping)
        ref = _reference(monkeypatch, moe.permute_aligned, hidden.contiguous().view(torch.uint8), grouping)
        assert torch.equal(got.view(torch.uint8), ref), f"permute_aligned seed={seed}"
    odd = torch.zeros(5, 6, dtype=torch.uint8).cuda()  # (3 words a row: the kernel copies pairs of them)
    routing = moe.group_rows(_topk(5, 4, 2, "uniform", gen).int().cuda(), 4, check_range=False)
    launched.clear()
    assert torch.equal(moe.permute(odd, routing), odd.index_select(0, routing.slot_of_row // 2)) and not launched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("inter", [256, 1536, 6, 2880])
@pytest.mark.parametrize("kind", ["silu", "swiglu_oai"])
def test_activation_kernels_match_torch(monkeypatch, launched, dtype, inter, kind):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    fn = moe.silu_and_mul if kind == "silu" else moe.swiglu_oai
    for rows in (1, 37, 2048):
        x = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype).cuda()
        x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 100.0])
        got, ref = fn(x), _reference(monkeypatch, fn, x)
        assert torch.equal(got.isnan(), ref.isnan()), f"{kind} {dtype} {rows}x{inter} NaNs seed={seed}"
        assert torch.equal(got.nan_to_num(), ref.nan_to_num()), f"{kind} {dtype} {rows}x{inter} seed={seed}"
    wide = (torch.randn(5, 2 * inter + 8, generator=gen)).to(dtype).cuda()[:, : 2 * inter]  # strided rows
    assert torch.equal(fn(wide), _reference(monkeypatch, fn, wide))
    name = "silu_and_mul" if kind == "silu" else "swiglu_oai"
    assert f"moe_{name}_{'bf16' if dtype == torch.bfloat16 else 'f16'}_v{4 if inter % 8 == 0 else 1}" in launched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [7168, 2048, 2880, 6])
@pytest.mark.parametrize("weight_dtype", ["fp32", "act"])
def test_combine_kernel_matches_unpermute_and_weighted_sum(monkeypatch, launched, dtype, n, weight_dtype):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for tokens, experts, top_k in ((1, 256, 8), (37, 16, 4), (513, 128, 8)):
        ids = _topk(tokens, experts, top_k, "uniform", gen).int().cuda()
        weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), 1)
        weights = (weights if weight_dtype == "fp32" else weights.to(dtype)).cuda()
        routing = moe.group_rows(ids, experts, check_range=False)
        wide = torch.randn(tokens * top_k, n + 8, generator=gen).to(dtype).cuda()
        for rows in (wide[:, :n], wide[:, 2:n + 2]):  # a row stride of n + 8; 16-byte aligned, then not
            got = moe.combine(rows, routing, weights)
            ref = _reference(monkeypatch, lambda: moe.weighted_sum(moe.unpermute(rows, routing), weights))
            assert torch.equal(got, ref), f"combine {dtype} n={n} tokens={tokens} seed={seed}"
        grouping = moe.align_groups(ids, experts, 16)
        padded = torch.randn(grouping.slot_of_row.shape[0], n, generator=gen).to(dtype).cuda()
        ref = _reference(monkeypatch, lambda: moe.weighted_sum(moe.unpermute_aligned(padded, grouping, tokens),
                                                               weights))
        assert torch.equal(moe.combine(padded, grouping, weights), ref), f"combine aligned seed={seed}"
    act = "bf16" if dtype == torch.bfloat16 else "f16"
    weights_name = "w32" if weight_dtype == "fp32" else "wact"
    assert f"moe_combine_{act}_{weights_name}_v1" in launched
    assert (f"moe_combine_{act}_{weights_name}_v4" in launched) == (n % 8 == 0)


@pytest.mark.parametrize("tokens,dtype", [(64, torch.int32), (300, torch.int64)])  # one chunk, two
def test_steps_replay_in_a_cuda_graph(monkeypatch, launched, tokens, dtype):
    """Routing, permute, activation and combine have no host round trip: captured once and
    replayed on a new routing and new rows copied into the captured inputs, they give the eager
    results."""
    gen = torch.Generator().manual_seed(_seed())
    experts, top_k, inter = 256, 8, 256
    ids = _topk(tokens, experts, top_k, "uniform", gen).to(dtype).cuda()
    weights = torch.rand(tokens, top_k, generator=gen).cuda()
    gate_up = torch.randn(tokens * top_k, 2 * inter, generator=gen).bfloat16().cuda()

    hidden = torch.randn(tokens, 2 * inter, generator=gen).bfloat16().cuda()

    def steps():
        routing = moe.group_rows(ids, experts, check_range=False)
        indexed = moe.align_block_size(ids, experts, 16, check_range=False)
        h = moe.silu_and_mul(gate_up + moe.permute(hidden, routing))
        return routing.slot_of_row, indexed.sorted_token_ids, moe.combine(h, routing, weights)

    steps()  # load the unit outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = steps()
    ids.copy_(_topk(tokens, experts, top_k, "skewed", gen).to(dtype).cuda())
    gate_up.copy_(torch.randn(tokens * top_k, 2 * inter, generator=gen).bfloat16().cuda())
    graph.replay()
    torch.cuda.synchronize()
    for got, ref in zip(captured, _reference(monkeypatch, steps), strict=True):
        assert torch.equal(got, ref)
    assert {"moe_gather_v4", "moe_silu_and_mul_bf16_v4", "moe_combine_bf16_w32_v4"} <= set(launched)


def test_steps_behind_gemms_read_their_finished_output(monkeypatch, launched):
    """From sm_90 the moe kernels launch with Programmatic Dependent Launch and wait for the
    upstream grid before they touch memory: right behind a GEMM of this library (which lets the
    next kernel launch as its CTAs run out of tiles) or behind another moe kernel, with no
    synchronization between them, each step must see every value the kernel before it writes,
    eagerly and in a CUDA graph, bit for bit against the torch path on the finished inputs."""
    import humming_aot
    from humming_aot import ops, quant

    gen = torch.Generator().manual_seed(_seed())
    tokens, experts, top_k, k, hidden_n, inter = 37, 16, 4, 4096, 2048, 512

    def packed(n, kk):
        return humming_aot.pack(quant.quantize(torch.randn(n, kk, generator=gen), "int4:g128"), torch.bfloat16,
                                device="cuda")

    w_hidden, w_gate_up, w_down = packed(hidden_n, k), packed(2 * inter, hidden_n), packed(hidden_n, inter)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), 1).cuda()
    ids = _topk(tokens, experts, top_k, "uniform", gen).int().cuda()
    x = torch.randn(tokens, k, generator=gen).bfloat16().cuda()

    def layer():
        hidden = ops.gemm(x, w_hidden)
        routing = moe.group_rows(ids, experts, check_range=False)
        again = moe.group_rows(routing.row_expert.view(tokens, top_k), experts, check_range=False)  # route behind route
        rows = moe.permute(hidden, routing)  # gather behind the routing
        gate_up = ops.gemm(rows, w_gate_up)
        h = moe.silu_and_mul(gate_up)  # activation behind a GEMM
        down = ops.gemm(h, w_down)
        return hidden, routing, again, rows, gate_up, h, down, moe.combine(down, routing, weights)  # combine behind one

    def check(results, what):
        hidden, routing, again, rows, gate_up, h, down, out = results
        torch.cuda.synchronize()
        ref_routing = _reference(monkeypatch, moe.group_rows, ids, experts, check_range=False)
        ref_again = _reference(monkeypatch, moe.group_rows, ref_routing.row_expert.view(tokens, top_k), experts,
                               check_range=False)
        assert torch.equal(routing.slot_of_row, ref_routing.slot_of_row), what
        assert torch.equal(again.slot_of_row, ref_again.slot_of_row), what
        assert torch.equal(rows, _reference(monkeypatch, moe.permute, hidden, routing)), what
        assert torch.equal(h, _reference(monkeypatch, moe.silu_and_mul, gate_up)), what
        ref_out = _reference(monkeypatch, lambda: moe.weighted_sum(moe.unpermute(down, routing), weights))
        assert torch.equal(out, ref_out), what

    for i in range(3):
        x.copy_(torch.randn(tokens, k, generator=gen))
        ids.copy_(_topk(tokens, experts, top_k, "skewed" if i else "uniform", gen))
        check(layer(), f"eager {i}")
    expected = {"moe_route_single_i32", "moe_gather_v4", "moe_silu_and_mul_bf16_v4", "moe_combine_bf16_w32_v4"}
    assert expected <= set(launched)
    sm90 = torch.cuda.get_device_capability()[0] >= 9 and os.environ.get("HUMMING_AOT_PDL", "1") != "0"
    assert cuda_steps._unit(torch.device("cuda", torch.cuda.current_device())).programmatic == sm90
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    x.copy_(torch.randn(tokens, k, generator=gen))
    ids.copy_(_topk(tokens, experts, top_k, "uniform", gen))
    graph.replay()
    check(captured, "graph")
