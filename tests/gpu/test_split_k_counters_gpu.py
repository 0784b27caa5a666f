"""The split-K / stream-K tile counters (dispatch._split_k_counters) first made inside a CUDA-graph
capture: the launcher's device memory (_launcher.alloc_zeroed_for_process), zero before the graph
ever replays and outside the graph's memory pool, so that another graph captured on the same
stream, or an eager call on it, may run before that graph does."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.testing.numerics import assert_bitwise_equal

pytestmark = pytest.mark.gpu


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def test_counters_first_made_in_a_capture_are_zero_and_not_the_graphs_memory(monkeypatch):
    # (torch reuses its streams' handles: start from no counters and no plans, so that the side
    # stream's are made inside the capture below whatever ran before)
    monkeypatch.setattr(dispatch, "_counters", {})
    monkeypatch.setattr(dispatch, "_plans", {})
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k = 4096, 4096
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    a = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    spec = ops.gemm_spec(packed)

    def split() -> torch.Tensor:  # four K slices summed through the workspace and the counters
        out = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        return dispatch.launch_gemm(a, packed, None, spec, out=out, splits=4, cluster_reduction=False)

    eager = split()  # loads the kernel (not allowed inside a capture) and makes the default stream's counters
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    slot = (a.device.index, side.cuda_stream)
    assert slot not in dispatch._counters
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, stream=side):
        out_first = split()
    counters = dispatch._counters[slot]  # made inside the capture
    torch.cuda.synchronize()
    assert not counters.any(), f"counters made in a capture are not zero before its graph replays (seed={seed})"
    pools = [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()]
    assert not any(lo <= counters.data_ptr() < hi for lo, hi in pools), "the counters lie in torch's memory"
    with torch.cuda.graph(second, stream=side):
        out_second = split()
    second.replay()  # before the first graph ever replays
    torch.cuda.synchronize()
    assert_bitwise_equal(out_second, eager, f"the second graph, replayed first (seed={seed})")
    with torch.cuda.stream(side):
        on_side = split()  # eager on the captures' stream
    torch.cuda.synchronize()
    assert_bitwise_equal(on_side, eager, f"an eager call on the captures' stream (seed={seed})")
    first.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out_first, eager, f"the first graph (seed={seed})")
    assert not counters.any(), "the split-K protocol leaves its counters at zero"
