"""The W4A8 GEMM (humming_aot.w4a8: int4 weights x float8e4m3 activations, the sm90a wgmma-w4a8
body) on an sm_90 GPU: every tile of its table and others beside them against the float64 product
of the exact codes and scales, at odd shapes (M, N and K off every tile; N and K padded by pack),
in every weight scaling (g128, g256, per channel, per tensor), NaN-poisoned outputs, both
schedules (tail split, stream-K), the walk of many tiles, per-tensor activation scales and a
bias, the error bound at K = 16384, two runs equal, and a CUDA graph replay. Fresh random data
each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w4a8
from humming_aot.testing.w8a8 import assert_long_k_error_bound, skip_without_kernels
from humming_aot.testing.w8a8 import fresh_seed as _seed

_TILES = sorted({label for _, label in w4a8._TILES} | {
    "wgmma-w4a8:128x128x128_w1x8_s5", "wgmma-w4a8:96x128x128_w1x8_s6", "wgmma-w4a8:16x256x128_w1x8_s6",
    "wgmma-w4a8:8x64x128_w1x4_s4", "wgmma-w4a8:32x256x128_w1x8_s6", "wgmma-w4a8:32x128x128_w1x8_s8",
    "wgmma-w4a8:192x128x128_w1x8_s5", "wgmma-w4a8:160x128x128_w1x8_s6",  # one scratch set (serial promotion)
    "wgmma-w4a8:8x64x128_w1x4_s8", "wgmma-w4a8:16x64x128_w1x4_s7",  # four CTAs per SM
})


@pytest.fixture(autouse=True)
def _needs_sm90():
    from humming_aot.enumerate import parse_tile_field

    skip_without_kernels([w4a8.kernel_key("sm90a", dtype, parse_tile_field(t)) for t in _TILES
                          for dtype in (torch.bfloat16, torch.float16)])


def _operands(m: int, n: int, k: int, gen: torch.Generator, weights: str = "int4:g128",
              act: str = "float8e4m3:token"):
    # channels, K ranges and tokens of different magnitudes, so that a misplaced scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w4a8.pack(quant.quantize(w, weights)).to("cuda")
    return ops.quantize_activation(x.cuda(), act), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    from humming_aot.w8a8 import dequantized_activation

    ref = w4a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    # The output's rounding (half an ulp), plus the fp8 wgmma's own sums over each K tile of 128
    # (Hopper keeps about 14 bits of a running sum: tests/gpu/test_w8a8_gpu.py): 2^-11 of the sum
    # of |products| covers it, and a code, step, group scale or tile gone wrong is far larger.
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    a_abs = dequantized_activation(qa, packed.k).abs()
    bound = eps * ref.abs() + 2.0**-11 * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


def _both_schedules(qa, packed, tile: str) -> None:
    m = qa.codes.numel() // packed.k
    out = torch.empty((m, packed.n), dtype=torch.bfloat16, device="cuda")
    for stream_k in (None, 0):
        out.fill_(float("nan"))
        y = w4a8.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k)
        _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k,weights", [(1, 256, 128, "int4:g128"), (37, 200, 400, "int4:channel"),
                                           (200, 384, 1024, "int4:g128"), (300, 4096, 512, "int4:g256"),
                                           (129, 1000, 2048, "int4:tensor"),
                                           # N = 320: a 128-wide CTA of 64 columns; 3 K tiles (odd)
                                           (77, 320, 384, "int4:g128")])
def test_every_tile_matches_the_float64_product(tile, m, n, k, weights):
    gen = torch.Generator().manual_seed(_seed())
    _both_schedules(*_operands(m, n, k, gen, weights), tile)


@pytest.mark.parametrize("tile", ["wgmma-w4a8:8x128x128_w1x4_s8", "wgmma-w4a8:128x128x128_w1x8_s7"])
def test_stream_k_ranges_that_split_tiles(tile):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(20, 512, 4096, gen)
    tiles = -(-20 // int(tile.split(":")[1].split("x")[0])) * 4
    for ctas in (tiles + 1, 3 * tiles - 1, 64):
        y = w4a8.gemm(qa, packed, tile=tile, stream_k=ctas)
        _check(y, qa, packed)
        assert torch.equal(y, w4a8.gemm(qa, packed, tile=tile, stream_k=ctas)), "two runs differ"


@pytest.mark.parametrize("tile,m,n,k", [("wgmma-w4a8:128x128x128_w1x8_s7", 200, 2560, 4096),
                                        ("wgmma-w4a8:8x128x128_w1x4_s8", 5, 5120, 8192)])
def test_tail_split_slices_and_the_default_schedule(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen)
    y = w4a8.gemm(qa, packed, tile=tile, stream_k=0)
    _check(y, qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, tile=tile, stream_k=0)), "two runs differ"
    _check(w4a8.gemm(qa, packed), qa, packed)


def test_a_wave_of_ctas_walks_many_tiles():
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 601, 7680, 2048
    qa, packed = _operands(m, n, k, gen)
    tile = "wgmma-w4a8:128x128x128_w1x8_s7"
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w4a8.gemm(qa, packed, out=out, tile=tile, stream_k=0, persistent=True)
    _check(y, qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, tile=tile, stream_k=0, persistent=False)), "walk and one-per-tile differ"


def test_tensor_scale_bias_float16_and_padded_n():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, act="float8e4m3:tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    y = w4a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    assert y.shape == (50, 100) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)
    assert torch.equal(ops.gemm(qa, packed, bias), y)  # the op routes a W4A8 weight here


def test_long_k_error_bound_needs_the_fp32_promotion():
    # float16 output: its rounding (2^-11) leaves room to see the sums' own error at 1e-3
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(256, 1024, 16384, gen)
    assert_long_k_error_bound(qa, packed, lambda sub, m: w4a8.gemm(sub, packed, out_dtype=torch.float16))


def test_cuda_graph_replay_and_3d_input():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen)
    qa3 = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                    scale_dtype=qa.scale_dtype, codes=qa.codes.reshape(2, 12, 512),
                                    scales=qa.scales.reshape(2, 12, 1))
    eager = w4a8.gemm(qa3, packed)
    assert eager.shape == (2, 12, 256)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w4a8.gemm(qa3, packed)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_bad_operands_raise_errors_that_say_what_to_do():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 128, 256, gen)
    with pytest.raises(ValueError, match="float8e4m3 or int8 activations"):
        w4a8.gemm(ops.quantize_activation(torch.randn(4, 256, device="cuda"), "float8e4m3:g128"), packed)
    int8 = ops.quantize_activation(torch.randn(4, 256, device="cuda"), "int8:token")
    with pytest.raises(ValueError, match="int8 ones run on mma-w4a8 tiles"):
        w4a8.gemm(int8, packed, tile="wgmma-w4a8:8x128x128_w1x4_s8")
    with pytest.raises(ValueError, match="wgmma-w4a8 tiles"):
        w4a8.gemm(qa, packed, tile="wgmma-ss:8x128x128_w1x4_s6")
    with pytest.raises(ValueError, match="bias must be a contiguous"):
        w4a8.gemm(qa, packed, bias=torch.zeros(256, dtype=torch.bfloat16, device="cuda")[::2])


@pytest.mark.parametrize("tile", ["wgmma-w4a8:8x128x128_w1x4_s8", "wgmma-w4a8:128x128x128_w1x8_s7",
                                  "wgmma-w4a8:192x128x128_w1x8_s5"])
def test_subnormal_activations_times_every_weight_value(tile):
    """The kernel multiplies e4m3 bytes of v x 2^-9 (numerics/int4_e4m3.cuh): weights 1 .. 7 are
    e4m3 subnormals there, so subnormal activation codes make products of two subnormals (2^-18 at
    the least). Activation codes drawn from every subnormal and zero (both signs) with unit scales,
    weights cycling through -8 .. 7 with unit scales: the sums are small integers times 2^-9, which
    the float64 product must match to the usual bound (a product flushed to zero would miss it)."""
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 24, 128, 256
    codes = torch.randint(0, 8, (m, k), generator=gen, dtype=torch.uint8)  # subnormals 1 .. 7 and 0
    codes |= torch.randint(0, 2, (m, k), generator=gen, dtype=torch.uint8) << 7  # either sign
    qa = quant.QuantizedActivation(element="float8e4m3", granularity=quant.ActivationGranularity.TOKEN,
                                   group_size=None, scale_dtype="float32", codes=codes.cuda(),
                                   scales=torch.ones(m, 1, device="cuda"))
    values = (torch.arange(n * k).reshape(n, k) + torch.randint(0, 16, (n, 1), generator=gen)) % 16 - 8
    qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("int4:channel"), codes=(values & 0xF).to(torch.uint8),
                               scales=torch.ones(n, 1))
    packed = w4a8.pack(qw).to("cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    y = w4a8.gemm(qa, packed, out=out, out_dtype=torch.float16, tile=tile)
    _check(y, qa, packed, out_dtype=torch.float16)
    assert y.abs().max().item() > 0, "every sum is zero: the subnormal products were flushed"
