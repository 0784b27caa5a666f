"""The W8A8 int8 GEMM (humming_aot.w8a8 on int8:channel weights x int8:token activations, the
sm90a wgmma-ss body's exact int32 sums) on an sm_90 GPU: every tile of its table and the wider
ones against the float64 product of the exact codes and scales at odd shapes (M, N and K off every
tile), NaN-poisoned outputs, both schedules, the tail split's K slices, a wave of CTAs walking
tiles, every code of the int8 range (-128 included) at K = 16384, sums that cancel exactly, a
per-tensor activation scale, a bias, float16 output, a CUDA graph replay and the layer. Fresh
random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w8a8
from humming_aot.quant.activation import ActivationGranularity
from humming_aot.testing.w8a8 import check_both_schedules, schedule, skip_without_kernels, tail_split
from humming_aot.testing.w8a8 import fresh_seed as _seed

_TILES = sorted({label for _, label in w8a8._INT8_TILES} | {
    "wgmma-ss:128x128x128_w1x8_s6", "wgmma-ss:192x128x128_w1x8_s4", "wgmma-ss:128x256x128_w1x8_s4",
    "wgmma-ss:256x128x128_w1x8_s4", "wgmma-ss:64x256x128_w1x8_s4",
})


@pytest.fixture(autouse=True)
def _needs_sm90():
    from humming_aot.enumerate import parse_tile_field

    skip_without_kernels([w8a8.kernel_key("sm90a", dtype, parse_tile_field(t), element="int8")
                          for t in _TILES for dtype in (torch.bfloat16, torch.float16)])


def _operands(m: int, n: int, k: int, gen: torch.Generator, act: str = "int8:token"):
    # rows of different magnitudes, so that a misplaced scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1)
    packed = w8a8.pack(quant.quantize(w, "int8:channel")).to("cuda")
    return ops.quantize_activation(x.cuda(), act), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    """The int32 sums are exact; what is left is their one rounding to fp32 (2^-24 of the sum of
    |products| at most), the fp32 scale products and the output's rounding (half an ulp of its
    dtype). 2^-20 of the sum of |products| covers the former with room and catches a single
    product gone wrong (one code of K is ~1/K of that sum, K <= 16384)."""
    ref = w8a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    magnitude = w8a8.dequantized_activation(qa, packed.k).abs() @ packed.effective_weight().abs().T
    bad = (y - ref).abs() > eps * ref.abs() + 2.0**-20 * magnitude
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (37, 112, 272), (200, 384, 1040), (300, 4096, 512)])
def test_every_tile_matches_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    check_both_schedules(*_operands(m, n, k, gen), tile, _check)


def test_every_code_at_long_k_within_the_bound():
    # raw codes over the whole int8 range (-128 too, which the quantizer never writes), power-of-two
    # scales, K = 16384: the fp32 rounding of the sums (2^-24 each: a CTA's int32 sum, and the fp32
    # adds of K slices where the schedule splits K) and the float16 output's rounding (2^-11, or
    # 2^-25 absolute below its normal range) are all the error allowed
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 70, 384, 16384
    codes = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    a_codes = torch.randint(0, 256, (m, k), generator=gen, dtype=torch.uint8)
    scales = 2.0 ** -torch.randint(20, 24, (n,), generator=gen).float()
    packed = w8a8.PackedW8A8Weight(w=codes.cuda(), w_scale=scales.cuda(), n=n, k=k, format="int8:channel")
    qa = quant.QuantizedActivation(element="int8", granularity=ActivationGranularity.TOKEN,
                                   group_size=None, scale_dtype="float32", codes=a_codes.cuda(),
                                   scales=torch.full((m, 1), 2.0**-6, device="cuda"))
    for tile in ("wgmma-ss:8x128x128_w1x4_s6", "wgmma-ss:128x128x128_w1x8_s5"):
        y = w8a8.gemm(qa, packed, tile=tile, out_dtype=torch.float16).double()
        ref = w8a8.reference(qa, packed)
        assert not torch.isnan(y).any()
        excess = ((y - ref).abs() - (2.0**-11 + 2.0**-22) * ref.abs() - 2.0**-25).max().item()
        print(f"{tile}: largest error beyond the bound {excess:.2e}")
        assert excess <= 0, tile


def test_sums_that_cancel_are_exact_within_a_ctas_k_range():
    # Activation rows of +127 over the first half of K = 16384 and -127 over the second, less d
    # (1..8) at k = 0, against weight rows of one code c (127, -128, 1, -1; the rest zero): the exact
    # sum is -c d, while the running sums pass 2^27, where an accumulator that rounded would lose it.
    # One whole tile per CTA (as many 128-channel tiles as SMs, no K split: the schedule is checked),
    # so each output is one CTA's int32 sum made fp32 once: -c d x 2^-6 x 2^-4, exact in float16.
    gen = torch.Generator().manual_seed(_seed())
    tile, m, k = "wgmma-ss:128x128x128_w1x8_s5", 8, 16384
    n = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * 128
    d = torch.randint(1, 9, (m,), generator=gen)
    cancel = torch.full((m, k), 127, dtype=torch.int16)
    cancel[:, k // 2:] = -127
    cancel[:, 0] -= d
    c = torch.tensor([127, -128, 1, -1], dtype=torch.int16)
    codes = torch.zeros((n, k), dtype=torch.uint8, device="cuda")
    codes[:4] = c[:, None].expand(4, k).to(torch.int8).view(torch.uint8).cuda()
    packed = w8a8.PackedW8A8Weight(w=codes, w_scale=torch.full((n,), 2.0**-4, device="cuda"), n=n, k=k,
                                   format="int8:channel")
    qa = quant.QuantizedActivation(element="int8", granularity=ActivationGranularity.TOKEN,
                                   group_size=None, scale_dtype="float32",
                                   codes=cancel.to(torch.int8).view(torch.uint8).cuda(),
                                   scales=torch.full((m, 1), 2.0**-6, device="cuda"))
    label, dp_ctas, splits, stream_k_ctas, _ = schedule(tile, m, n, k, element="int8")
    assert (dp_ctas, splits, stream_k_ctas) == (n // 128, 1, 0), f"{label}: the schedule splits K: the test misses"
    y = w8a8.gemm(qa, packed, tile=tile, out_dtype=torch.float16).cpu()
    exact = (-(c[None, :].double() * d[:, None].double()) * 2.0**-10).to(torch.float16)
    assert torch.equal(y[:, :4], exact), f"cancelling sums {y[:, :4]} != {exact}"
    assert not y[:, 4:].any(), "rows of zero codes gave non-zero outputs"


@pytest.mark.parametrize("tile", ["wgmma-ss:8x128x128_w1x4_s6", "wgmma-ss:32x128x128_w1x4_s5"])
def test_stream_k_ranges_that_split_tiles(tile):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(20, 512, 4096, gen)
    tiles = -(-20 // int(tile.split(":")[1].split("x")[0])) * 4
    for ctas in (tiles + 1, 3 * tiles - 1, 64):
        y = w8a8.gemm(qa, packed, tile=tile, stream_k=ctas)
        _check(y, qa, packed)
        assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=ctas)), "two runs differ"


@pytest.mark.parametrize("tile,m,n,k", [("wgmma-ss:128x128x128_w1x8_s6", 200, 2560, 4096),
                                        ("wgmma-ss:8x128x128_w1x4_s6", 5, 5120, 8192)])
def test_tail_split_slices_meet_in_fp32(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen)
    dp_ctas, splits, _ = tail_split(tile, m, packed.n, k, persistent=False, element="int8")
    assert splits > 1, f"the schedule did not split K (dp {dp_ctas}, splits {splits}): the test misses its path"
    y = w8a8.gemm(qa, packed, tile=tile, stream_k=0)
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=0)), "two runs differ"


@pytest.mark.parametrize("tile", ["wgmma-ss:128x128x128_w1x8_s5", "wgmma-ss:128x256x128_w1x8_s4",
                                  "wgmma-ss:64x128x128_w1x8_s6"])
def test_a_wave_of_ctas_walks_many_tiles_then_the_split_tail(tile):
    # 1100 tokens: 270 tiles of 128 x 256 (more than the 132 resident CTAs walk), 540 of 128 x 128
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 1100, 7680, 4096
    qa, packed = _operands(m, n, k, gen)
    dp_ctas, splits, walkers = tail_split(tile, m, packed.n, k, persistent=True, element="int8")
    assert walkers < dp_ctas, f"{walkers} CTAs for {dp_ctas} whole tiles: the test misses the walk"
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out, tile=tile, stream_k=0, persistent=True)
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile, stream_k=0, persistent=False)), "walk and one-per-tile differ"


def test_tensor_scale_bias_float16_and_padded_n():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, act="int8:tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    y = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    assert y.shape == (50, 100) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)


def test_cuda_graph_replay_and_the_layer():
    from humming_aot.nn import QuantizedLinear

    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen)
    eager = w8a8.gemm(qa, packed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w8a8.gemm(qa, packed)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    linear = torch.nn.Linear(512, 192).cuda()
    layer = QuantizedLinear.from_linear(linear, "int8:channel", activations="int8:token")
    x = torch.randn(2, 9, 512, generator=gen).to("cuda", torch.bfloat16)
    y = layer(x)
    qx = ops.quantize_activation(x, "int8:token")
    _check(y.reshape(18, 192), qx, layer.packed, linear.bias.detach().to(torch.bfloat16))
    with pytest.raises(ValueError, match="int8 activations"):
        w8a8.gemm(ops.quantize_activation(x, "float8e4m3:token"), layer.packed)
