"""The W8A8 float8 GEMM (humming_aot.w8a8, the sm90a wgmma-ss body) on an sm_90 GPU: every tile of
its table and the wider ones against the float64 product of the exact codes and scales, at odd
shapes (M, N and K off every tile), NaN-poisoned outputs, both schedules (tail split, stream-K),
a per-tensor activation scale and a bias, the error bound at K = 16384 that needs the fp32
promotion, two runs equal, and a CUDA graph replay. Fresh random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w8a8
from humming_aot.testing.w8a8 import check_both_schedules, schedule, skip_without_kernels, tail_split
from humming_aot.testing.w8a8 import fresh_seed as _seed

_BLOCK_TILES = sorted({label for _, label in w8a8._BLOCK_TILES} | {"wgmma-ss:64x256x128_w1x8_s4",
                                                                    "wgmma-ss:128x128x128_w1x8_s6"})
_TILES = sorted({label for _, label in w8a8._TILES} | {
    "wgmma-ss:96x128x128_w1x8_s6", "wgmma-ss:160x128x128_w1x8_s5", "wgmma-ss:64x128x128_w1x4_s4",
    "wgmma-ss:64x256x128_w1x8_s4", "wgmma-ss:32x256x128_w1x8_s6", "wgmma-ss:128x128x128_w1x8_s6",
    "wgmma-ss:192x128x128_w1x8_s5", "wgmma-ss:192x128x128_w1x8_s4",
})


@pytest.fixture(autouse=True)
def _needs_sm90():
    from humming_aot.enumerate import parse_tile_field

    skip_without_kernels([w8a8.kernel_key("sm90a", dtype, parse_tile_field(t), blocks)
                          for tiles, blocks in ((_TILES, False), (_BLOCK_TILES, True)) for t in tiles
                          for dtype in (torch.bfloat16, torch.float16)])


def _operands(m: int, n: int, k: int, gen: torch.Generator, act: str = "float8e4m3:token",
              weights: str = "float8e4m3:channel"):
    # rows (and for blocks, K ranges) of different magnitudes, so that a misplaced scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w8a8.pack(quant.quantize(w, weights)).to("cuda")
    qa = ops.quantize_activation(x.cuda(), act)
    return qa, packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    ref = w8a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    # The output's rounding (half an ulp of its dtype: 2^-8 or 2^-11 of |ref|), plus the fp8
    # wgmma's own sums: Hopper's fp8 tensor cores keep about 14 bits of each running sum of a
    # promotion's 128 products (truncating): each of its four k32 steps, and the additions inside
    # one, may lose about 2^-14 of the running sum, so a promotion errs by up to a few 2^-14 of its
    # sum of |products|, and the fp32 sums of the promotions add little. 2^-11 of the sum of
    # |products| covers that worst case with room, and still catches a code, step or tile gone
    # wrong (one missing K step of 32 is about a quarter of the sum).
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    k = packed.k
    a_abs = w8a8.dequantized_activation(qa, k).abs()
    w_abs = packed.effective_weight().abs()
    bound = eps * ref.abs() + 2.0**-11 * (a_abs @ w_abs.T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (37, 112, 272), (200, 384, 1040), (300, 4096, 512)])
def test_every_tile_matches_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    check_both_schedules(*_operands(m, n, k, gen), tile, _check)


@pytest.mark.parametrize("tile", _BLOCK_TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (37, 112, 384), (200, 384, 1024), (300, 4096, 512)])
def test_block_scales_match_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, act="float8e4m3:g128", weights="float8e4m3:b128x128")
    assert packed.blocks
    check_both_schedules(qa, packed, tile, _check)


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
@pytest.mark.parametrize("tile", ["wgmma-ss:8x128x128_w1x4_s6", "wgmma-ss:128x128x128_w1x8_s6"])
def test_stream_k_ranges_that_split_tiles(tile, blocks):
    gen = torch.Generator().manual_seed(_seed())
    formats = dict(act="float8e4m3:g128", weights="float8e4m3:b128x128") if blocks else {}
    qa, packed = _operands(20, 512, 4096, gen, **formats)
    tiles = -(-20 // int(tile.split(":")[1].split("x")[0])) * 4
    for ctas in (tiles + 1, 3 * tiles - 1, 64):
        y = w8a8.gemm(qa, packed, tile=tile, stream_k=ctas)
        _check(y, qa, packed)
        assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=ctas)), "two runs differ"


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
@pytest.mark.parametrize("tile,m,n,k", [("wgmma-ss:128x128x128_w1x8_s6", 200, 2560, 4096),
                                        ("wgmma-ss:8x128x128_w1x4_s6", 5, 5120, 8192)])
def test_tail_split_slices_meet_in_fp32(tile, m, n, k, blocks):
    # the tail split's K slices (stream_k=0 on fewer tiles than resident CTAs) sum in the workspace
    # before the channel scales, and inside each slice's sums with block scales
    gen = torch.Generator().manual_seed(_seed())
    formats = dict(act="float8e4m3:g128", weights="float8e4m3:b128x128") if blocks else {}
    qa, packed = _operands(m, n, k, gen, **formats)
    dp_ctas, splits, _ = tail_split(tile, m, packed.n, k, persistent=False, blocks=blocks)
    assert splits > 1, f"the schedule did not split K (dp {dp_ctas}, splits {splits}): the test misses its path"
    y = w8a8.gemm(qa, packed, tile=tile, stream_k=0)
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=0)), "two runs differ"


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
@pytest.mark.parametrize("tile", ["wgmma-ss:128x128x128_w1x8_s5", "wgmma-ss:128x128x128_w1x8_s6",
                                  "wgmma-ss:64x128x128_w1x8_s6"])
def test_a_wave_of_ctas_walks_many_tiles_then_the_split_tail(tile, blocks):
    # persistent CTAs (at most a wave) walk the tail split's whole tiles, the staging tile after the
    # ring (s5, the 64-token tile) or over it (s6), and CTAs after them take the split tail
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 601, 7680, 4096
    formats = dict(act="float8e4m3:g128", weights="float8e4m3:b128x128") if blocks else {}
    qa, packed = _operands(m, n, k, gen, **formats)
    dp_ctas, splits, walkers = tail_split(tile, m, packed.n, k, persistent=True, blocks=blocks)
    assert walkers < dp_ctas, f"{walkers} CTAs for {dp_ctas} whole tiles: the test misses the walk"
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out, tile=tile, stream_k=0, persistent=True)
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=0, persistent=False)), "walk and one-per-tile differ"
    print(f"dp {dp_ctas} walked by {walkers}, tail splits {splits}")


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
@pytest.mark.parametrize("m,n,k", [(5, 34560, 1024), (100, 17920, 6144)])
def test_stream_k_over_one_wave_when_the_last_wave_is_partial(m, n, k, blocks):
    # more tiles than resident CTAs, the last wave about half full: the default schedule streams K
    # over one wave (one warpgroup at 5 tokens: 270 tiles for 264 CTAs; two at 100 tokens: 140
    # tiles of 128 for 132 CTAs over 48 K tiles), partial tiles meeting in the fix-up
    gen = torch.Generator().manual_seed(_seed())
    formats = dict(act="float8e4m3:g128", weights="float8e4m3:b128x128") if blocks else {}
    qa, packed = _operands(m, n, k, gen, **formats)
    label, dp_ctas, splits, stream_k_ctas, _ = schedule(None, m, packed.n, k, blocks=blocks)
    assert stream_k_ctas > 0, f"{label}: {dp_ctas} whole tiles, {splits} splits: the test misses stream-K"
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out)[:, : packed.out_features]
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed)), "two runs differ"
    print(f"{label}: stream-K over {stream_k_ctas} CTAs")


def test_block_scales_with_bias_float16_padded_n_and_a_partial_last_block():
    # N = 200: padded to 208, the second CTA's 128 channels hold 72 of a partial block and 56 past N
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(70, 200, 384, gen, act="float8e4m3:g128", weights="float8e4m3:b128x128")
    bias = torch.randn(200, generator=gen).to(torch.float16).cuda()
    y = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    assert y.shape == (70, 200) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)
    out = torch.full((70, packed.n), float("nan"), dtype=torch.float16, device="cuda")
    whole = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16, out=out)
    assert whole.shape == (70, packed.n) and torch.equal(whole[:, :200], y)


def test_tensor_scale_bias_float16_and_padded_n():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, act="float8e4m3:tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    y = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    assert y.shape == (50, 100) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
def test_long_k_error_bound_needs_the_fp32_promotion(blocks):
    # float16 output: its rounding (2^-11) leaves room to see the sums' own error at 1e-3
    gen = torch.Generator().manual_seed(_seed())
    formats = dict(act="float8e4m3:g128", weights="float8e4m3:b128x128") if blocks else {}
    qa, packed = _operands(256, 1024, 16384, gen, **formats)
    for m in (256, 16, 1):
        sub = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=qa.group_size,
                                        scale_dtype=qa.scale_dtype, codes=qa.codes[:m], scales=qa.scales[:m])
        y = w8a8.gemm(sub, packed, out_dtype=torch.float16).double()
        ref = w8a8.reference(sub, packed)
        rel = ((y - ref).norm() / ref.norm()).item()
        print(f"m={m} relative error {rel:.2e}")
        assert rel <= 1e-3


def test_cuda_graph_replay_and_3d_input():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen)
    codes3 = qa.codes.reshape(2, 12, 512)
    qa3 = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                    scale_dtype=qa.scale_dtype, codes=codes3, scales=qa.scales.reshape(2, 12, 1))
    eager = w8a8.gemm(qa3, packed)
    assert eager.shape == (2, 12, 256)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w8a8.gemm(qa3, packed)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_bad_operands_raise_errors_that_say_what_to_do():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 128, 256, gen)
    int8 = ops.quantize_activation(torch.randn(4, 256, device="cuda"), "int8:token")
    with pytest.raises(ValueError, match="float8e4m3 activations"):
        w8a8.gemm(int8, packed)
    short = ops.quantize_activation(torch.randn(4, 128, device="cuda"), "float8e4m3:token")
    with pytest.raises(ValueError, match="K=128 but the weight has K=256"):
        w8a8.gemm(short, packed)
    with pytest.raises(ValueError, match="wgmma-ss tiles"):
        w8a8.gemm(qa, packed, tile="wgmma-ws:64x128x64_w1x4_s4")
    cpu_scales = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                           scale_dtype="float32", codes=qa.codes, scales=qa.scales.cpu())
    with pytest.raises(ValueError, match="move them together"):
        w8a8.gemm(cpu_scales, packed)
    with pytest.raises(ValueError, match="bias must be a contiguous"):
        w8a8.gemm(qa, packed, bias=torch.zeros(256, dtype=torch.bfloat16, device="cuda")[::2])
