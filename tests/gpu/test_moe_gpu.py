"""QuantizedMoE on the GPU (the expert loop over the catalog's dense kernels, and opted in, the
grouped contiguous kernel): moved with .to(),
against the float64 layer of the exact operands, for int4 with silu and gpt-oss's mxfp4 with
swiglu_oai, under uniform, skewed and empty routing, at 1 and 37 tokens."""
from __future__ import annotations

import os

import pytest
import torch

from humming_aot.testing.moe import moe_layer_reference, random_moe_layer


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


@pytest.mark.parametrize("kernels", [False, True], ids=["expert-loop", "grouped-kernel"])
@pytest.mark.parametrize("activation,fmt", [("silu", "int4:g128"), ("swiglu_oai", "mxfp4")])
@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty"])
def test_quantized_moe_on_gpu_matches_the_float64_layer(activation, fmt, kind, kernels):
    if kernels:
        from humming_aot.testing.jit import why_no_jit

        why = why_no_jit("the device suite's catalog (dense) holds no grouped kernels: the JIT builds them", "to build them")
        if why is not None or torch.cuda.get_device_capability() < (8, 0):
            pytest.skip(why or "the grouped kernels wrap the sm_80+ mma.sync bodies")
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    experts, hidden_size, top_k = 8, 256, 2
    layer = random_moe_layer(experts, hidden_size, 128, fmt, activation, gen).to("cuda")
    layer.use_grouped_kernels = kernels
    assert layer.gate_up.w.is_cuda and layer.down.global_scale_tensor.is_cuda
    for m in (1, 37):
        scores = torch.rand(m, experts, generator=gen)
        if kind == "skewed":
            scores[:, :2] += 4.0
        elif kind == "empty":
            scores[:, experts // 2:] -= 10.0
        topk_ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
        weights = torch.softmax(torch.randn(m, top_k, generator=gen), dim=1)
        hidden = torch.randn(m, hidden_size, generator=gen).bfloat16()
        out = layer(hidden.cuda(), topk_ids.cuda(), weights.cuda())
        ref = moe_layer_reference(layer, hidden, topk_ids, weights)
        err = (out.cpu().double() - ref).abs()
        bound = 2**-7 * ref.abs() + 1e-2 * float(ref.abs().max()) + 1e-6
        assert bool((err <= bound).all()), f"max error {float(err.max()):g}: {activation} {fmt} {kind} m={m} seed={seed}"
        assert torch.equal(layer(hidden.cuda(), topk_ids.cuda(), weights.cuda()), out)


def test_quantized_moe_grouped_kernels_replay_in_a_cuda_graph():
    """The grouped-kernel forward (routing, both GEMMs on the prefix offsets, activation, reduce)
    has no host round trip: captured once, replayed on new hidden states and a new routing copied
    into the captured inputs, it gives what the eager forward gives on them."""
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the device suite's catalog (dense) holds no grouped kernels: the JIT builds them", "to build them")
    if why is not None or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip(why or "the grouped kernels wrap the sm_80+ mma.sync bodies")
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    experts, hidden_size, top_k, m = 8, 256, 2, 21
    layer = random_moe_layer(experts, hidden_size, 128, "int4:g128", "silu", gen).to("cuda")
    layer.use_grouped_kernels = True

    def routing():
        ids = torch.rand(m, experts, generator=gen).topk(top_k, dim=1).indices.to(torch.int32)
        return (torch.randn(m, hidden_size, generator=gen).bfloat16().cuda(), ids.cuda(),
                torch.softmax(torch.randn(m, top_k, generator=gen), dim=1).cuda())

    inputs = routing()
    layer(*inputs)  # builds the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(*inputs)
    for _ in range(2):
        fresh = routing()
        for dst, src in zip(inputs, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, layer(*fresh)), f"seed={seed}"


def test_quantized_moe_takes_the_grouped_kernels_by_default_on_sm80_and_newer(monkeypatch):
    """use_grouped_kernels None (the default) chooses the grouped kernels on sm_80+ and the expert
    loop before; False forces the loop."""
    from humming_aot.nn import QuantizedMoE
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the device suite's catalog (dense) holds no grouped kernels: the JIT builds them", "to build them")
    if why is not None:
        pytest.skip(why)
    gen = torch.Generator().manual_seed(_seed())
    layer = random_moe_layer(8, 256, 128, "int4:g128", "silu", gen).to("cuda")
    assert layer.use_grouped_kernels is None
    calls = []
    grouped = QuantizedMoE._forward_grouped_kernels

    def spy(self, *args):
        calls.append(args[0].shape)
        return grouped(self, *args)

    monkeypatch.setattr(QuantizedMoE, "_forward_grouped_kernels", spy)
    topk_ids = torch.tensor([[0, 3], [5, 1]], dtype=torch.int32).cuda()
    weights = torch.full((2, 2), 0.5).cuda()
    hidden = torch.randn(2, 256, generator=gen).bfloat16().cuda()
    out = layer(hidden, topk_ids, weights)
    assert len(calls) == (1 if torch.cuda.get_device_capability() >= (8, 0) else 0)
    layer.use_grouped_kernels = False
    loop = layer(hidden, topk_ids, weights)
    assert len(calls) <= 1
    ref = moe_layer_reference(layer, hidden.cpu(), topk_ids.cpu(), weights.cpu())
    for got in (out, loop):
        err = (got.cpu().double() - ref).abs()
        assert bool((err <= 2**-7 * ref.abs() + 1e-2 * float(ref.abs().max()) + 1e-6).all())
