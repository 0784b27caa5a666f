"""tools/bench/bench_moe.py's pieces that need no GPU: the routed rows it times and its arguments."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "bench_moe.py"
_spec = importlib.util.spec_from_file_location("bench_moe", _PATH)
bench_moe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench_moe  # its dataclasses look their module up there
_spec.loader.exec_module(bench_moe)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (37, 16, 4), (5, 256, 8)])
def test_routed_rows_are_the_tokens_grouped_by_expert(tokens, experts, top_k):
    routed = bench_moe.route(tokens, experts, top_k, 64, seed=3, device=torch.device("cpu"))
    offsets = routed.offsets.tolist()
    assert offsets[0] == 0 and offsets[-1] == tokens * top_k == routed.a.shape[0]
    assert all(x <= y for x, y in zip(offsets, offsets[1:]))
    # the same routing again: every expert's rows are the hidden rows of the tokens routed to it
    gen = torch.Generator(device="cpu").manual_seed(3)
    topk_ids = torch.randn(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16)
    counts = routed.counts.tolist()
    assert routed.expected_m == max(1, -(-tokens * top_k // experts))
    assert routed.masked_a.shape[:2] == (experts, max(16, -(-max(counts) // 16) * 16))
    for e in range(experts):
        token_rows = torch.nonzero((topk_ids == e).any(dim=1)).reshape(-1)
        assert torch.equal(routed.a[offsets[e]:offsets[e + 1]], hidden[token_rows])
        # masked: the same rows first in the expert's slab, zeros after
        assert counts[e] == offsets[e + 1] - offsets[e]
        assert torch.equal(routed.masked_a[e, :counts[e]], hidden[token_rows])
        assert not routed.masked_a[e, counts[e]:].any()


def test_the_model_table_and_arguments():
    for experts, top_k, gemms in bench_moe.MODELS.values():
        assert 1 <= top_k <= experts and [g for g, _, _ in gemms] == ["gemm1", "gemm2"]
    # GEMM2's K is half of GEMM1's N (down after gate_up), GEMM2's N GEMM1's K (the hidden size)
    for _, _, ((_, n1, k1), (_, n2, k2)) in bench_moe.MODELS.values():
        assert (k2 * 2, n2) == (n1, k1)
    args = bench_moe.parse_args(["--models", "qwen3-30b-a3b", "--tokens", "1,64"])
    assert args.models == "qwen3-30b-a3b" and args.impls.split(",") == list(bench_moe.DEFAULT_IMPLS)
    assert args.layout == "contiguous" and bench_moe.parse_args(["--layout", "masked"]).layout == "masked"
    with pytest.raises(SystemExit):
        bench_moe.parse_args(["--models", "llama"])
    assert bench_moe.model_spec("256x8:7168x512") == (256, 8, (("gemm", 7168, 512),))
    assert bench_moe.model_spec("qwen3-30b-a3b") == bench_moe.MODELS["qwen3-30b-a3b"]
    for bad in ("256x8", "8x16:64x64", "llama:1x1", "4x2:0x64"):
        with pytest.raises(ValueError, match=f"model {bad!r}"):
            bench_moe.model_spec(bad)
    assert bench_moe.parse_args(["--models", "deepseek-v3-tp8,256x8:7168x1024"]).models.endswith("7168x1024")
    assert bench_moe.parse_args([]).tile is None
    assert bench_moe.parse_args(["--tile", "8x128x128_w1x2x2_s2"]).tile == "8x128x128_w1x2x2_s2"
    assert set(bench_moe.TILED_IMPLS) <= set(bench_moe.ALL_IMPLS) and set(bench_moe.PREPARE) == set(bench_moe.ALL_IMPLS)


def test_the_between_token_set_falls_between_the_issue_counts():
    # the issue's counts put Qwen3-30B and DeepSeek-V3 at 0.5, 2, 8, 32, ... rows an expert, on the
    # tile table's boundaries (the 5-28 row cliff of log section 63 hid between them): "between"
    # holds counts inside every interval of those
    issue = [int(t) for t in bench_moe.TOKEN_SETS["issue"].split(",")]
    between = [int(t) for t in bench_moe.TOKEN_SETS["between"].split(",")]
    assert issue == [int(t) for t in bench_moe.DEFAULT_TOKENS.split(",")] and not set(issue) & set(between)
    assert all(any(lo < t < hi for t in between) for lo, hi in zip(issue, issue[1:]))
    assert bench_moe.parse_args(["--tokens", "between"]).tokens == "between"


def test_a_forced_tile_on_the_aligned_impl_is_refused_for_the_masked_layout():
    with pytest.raises(bench_moe.bench_gemm.Unavailable, match="contiguous layout"):
        bench_moe.prepare_humming_aot_aligned(torch.zeros(2, 64, 64), "int4:g64", "masked")


def test_profile_moe_takes_a_bench_point():
    path = Path(__file__).resolve().parents[2] / "tools" / "bench" / "profile_moe.py"
    spec = importlib.util.spec_from_file_location("profile_moe", path)
    profile_moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile_moe)
    args = profile_moe.parse_args(["--model", "qwen3-30b-a3b", "--gemm", "gemm1", "--tokens", "64",
                                   "--layout", "contiguous", "--impl", "humming", "--tile", "8x64x128_w1x1x2_s2"])
    assert (args.model, args.gemm, args.tokens, args.layout, args.impl) == ("qwen3-30b-a3b", "gemm1", 64,
                                                                           "contiguous", "humming")
    with pytest.raises(SystemExit):
        profile_moe.parse_args(["--model", "llama"])
    assert profile_moe.parse_args(["--model", "256x8:7168x512", "--gemm", "gemm"]).model == "256x8:7168x512"
    with pytest.raises(SystemExit):
        profile_moe.parse_args(["--model", "256x8:7168x512", "--gemm", "gemm2"])


def test_bench_moe_layer_arguments():
    path = Path(__file__).resolve().parents[2] / "tools" / "bench" / "bench_moe_layer.py"
    spec = importlib.util.spec_from_file_location("bench_moe_layer", path)
    layer_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layer_bench)
    args = layer_bench.parse_args(["--model", "qwen3-30b-a3b", "--tokens", "1,16,64"])
    assert (args.model, args.tokens, args.format) == ("qwen3-30b-a3b", "1,16,64", "int4:g128")
    assert layer_bench.STEPS == ("route", "permute", "gemm1", "activation", "gemm2", "reduce")
    assert args.activations is None
    args = layer_bench.parse_args(["--format", "float8e4m3:b128x128", "--activations", "float8e4m3:g128"])
    assert (args.format, args.activations) == ("float8e4m3:b128x128", "float8e4m3:g128")
    assert layer_bench.A8_STEPS == ("route", "quantize", "gather", "gemm1", "activation", "requantize", "gemm2",
                                    "reduce")
    for bad in (["--tokens", "1,x"], ["--tokens", "0"], ["--model", "llama"]):
        with pytest.raises(SystemExit):
            layer_bench.parse_args(bad)


def test_each_forced_tile_and_slice_count_is_an_implementation_of_its_own():
    assert bench_moe.impl_variants("humming_aot,humming", None) == [("humming_aot", None, None), ("humming", None, None)]
    assert bench_moe.impl_variants("humming_aot,humming", "default,wgmma-ws:128x256x64_w1x8_s4") == [
        ("humming_aot", None, None), ("humming_aot", "wgmma-ws:128x256x64_w1x8_s4", None), ("humming", None, None)]
    # --splits: humming_aot's offsets form only, crossed with the tiles
    assert bench_moe.impl_variants("humming_aot,humming_aot_aligned", "default,8x128x128_w1x2x2_s2", "default,2") == [
        ("humming_aot", None, None), ("humming_aot", None, 2), ("humming_aot", "8x128x128_w1x2x2_s2", None),
        ("humming_aot", "8x128x128_w1x2x2_s2", 2), ("humming_aot_aligned", None, None),
        ("humming_aot_aligned", "8x128x128_w1x2x2_s2", None)]
    assert bench_moe.parse_args(["--splits", "default,3"]).splits == "default,3"
    for bad in ("0", "2,x", "-1"):
        with pytest.raises(SystemExit):
            bench_moe.parse_args(["--splits", bad])
    w = torch.randn(4, 128, 256).to(torch.bfloat16)
    with pytest.raises(bench_moe.bench_gemm.Unavailable, match="K slices are the offsets form's"):
        bench_moe.prepare_humming_aot(w, "int4:g128", "masked", splits=2)


def test_a_forced_slice_count_the_tile_refuses_is_a_row_not_a_stop(monkeypatch):
    """The library refuses K slices on a wgmma-ws tile (ValueError): with --splits forced that is the
    point's n/a row (Unavailable), while a refusal without --splits still stops the run."""
    from types import SimpleNamespace

    import humming_aot.moe as moe

    def refuse(*args, splits=None, **kwargs):
        raise ValueError("splits=2 must be 1 when the tile is a wgmma-ws one")

    monkeypatch.setattr(moe, "gemm_grouped_kernel", refuse)
    w = torch.randn(4, 128, 256).to(torch.bfloat16)
    routed = SimpleNamespace(a=torch.zeros(3, 256, dtype=torch.bfloat16), offsets=torch.tensor([0, 1, 2, 3, 3]),
                             expected_m=1)
    with pytest.raises(bench_moe.bench_gemm.Unavailable, match="wgmma-ws"):
        bench_moe.prepare_humming_aot(w, "int4:g128", "contiguous", splits=2).call(routed)
    with pytest.raises(ValueError, match="wgmma-ws"):
        bench_moe.prepare_humming_aot(w, "int4:g128", "contiguous").call(routed)


def test_the_a8_implementations_take_the_activation_format():
    """--activations names the 8-bit format of humming_aot_a8 / +quant / humming_a8; without it
    they are unavailable (a row saying why), and --tile forces a tile on ours."""
    args = bench_moe.parse_args(["--impls", "humming_aot_a8,humming_aot_a8+quant,humming_a8",
                                 "--activations", "float8e4m3:token", "--formats", "int4:g128,float8e4m3:b128x128"])
    assert args.activations == "float8e4m3:token"
    assert [name for name, *_ in bench_moe.impl_variants("humming_aot_a8,humming_a8", "default,mma-w4a8:16x128x128_w1x4_s4")] \
        == ["humming_aot_a8", "humming_aot_a8", "humming_a8"]
    w = torch.randn(4, 128, 256).to(torch.bfloat16)
    bench_moe.ACTIVATIONS["format"] = None
    for prepare in (bench_moe.prepare_humming_aot_a8, bench_moe.prepare_humming_a8):
        with pytest.raises(bench_moe.bench_gemm.Unavailable, match="give --activations"):
            prepare(w, "int4:g128", "contiguous")
    bench_moe.ACTIVATIONS["format"] = "float8e4m3:token"
    try:
        impl = bench_moe.prepare_humming_aot_a8(w, "int4:g128", "contiguous", tile="mma-w4a8:16x128x128_w1x4_s4")
        assert impl.name == "humming_aot_a8" and "float8e4m3:token tile mma-w4a8" in impl.note
        assert impl.weight(1).shape == (128, 256)
        assert bench_moe.prepare_humming_aot_a8_sync(w, "int4:g128", "contiguous").name == "humming_aot_a8_sync"
        # the row-expert form on aligned rows: DeepGEMM's contiguous layout, so the contiguous layout only
        aligned = bench_moe.prepare_humming_aot_a8_aligned(w, "int4:g128", "contiguous")
        assert aligned.name == "humming_aot_a8_aligned" and "aligned rows" in aligned.note and aligned.to_layout
        with pytest.raises(bench_moe.bench_gemm.Unavailable, match="contiguous layout's"):
            bench_moe.prepare_humming_aot_a8_aligned(w, "int4:g128", "masked")
    finally:
        bench_moe.ACTIVATIONS["format"] = None


def test_each_gemm_hands_its_rows_to_the_checkpoint(monkeypatch):
    """bench() calls its checkpoint after every GEMM with the rows so far (main writes them to
    --json, so a run stopped by a time limit keeps the GEMMs it finished); here on the CPU with a
    stand-in implementation and timer."""
    from types import SimpleNamespace

    calls = []
    impl = SimpleNamespace(name="humming_aot", note="", reset=None, call=lambda routed: calls.append(routed))
    monkeypatch.setitem(bench_moe.PREPARE, "humming_aot", lambda w, fmt, layout, **forced: impl)
    monkeypatch.setattr(bench_moe, "time_cuda_graph",
                        lambda fns, repeats: [f() for f in fns] and {"median_us": 1.0, "p10_us": 1.0, "p90_us": 1.0,
                                                                     "mode": "graph"})
    monkeypatch.setattr(bench_moe, "relerr", lambda impl, routed, layout: 0.0)
    args = bench_moe.parse_args(["--models", "8x2:128x256,4x1:64x128", "--tokens", "1,3", "--impls", "humming_aot",
                                 "--routings", "2"])
    seen = []
    rows = bench_moe.bench(args, checkpoint=lambda so_far: seen.append([(r["n"], r["tokens"]) for r in so_far]),
                           device="cpu")
    assert seen == [[(128, 1), (128, 3)], [(128, 1), (128, 3), (64, 1), (64, 3)]]
    assert [(r["model"], r["us"]) for r in rows] == [("8x2:128x256", 1.0)] * 2 + [("4x1:64x128", 1.0)] * 2
    assert len(calls) == 2 * 2 * 2  # every routing of every point, on both GEMMs
