"""W4A8 with uint4 weights less an integer zero point (AWQ: uint4:g128:zp and its other groupings)
x float8e4m3 or int8 activations (humming_aot.w4a8) on the GPU: the sm90a wgmma-w4a8 body's table
tiles and others beside them (one scratch set and two, four CTAs per SM), and the portable mma-w4a8
body through the build of the first arch that serves it (int8 natively; float8 on an H200 through
ptxas's emulated e4m3 mma), against the float64 product of the exact codes, zero points and scales.
Weights drawn as codes and zero points directly (every code and every zero point, so every
difference -15 .. 15 occurs), odd shapes (N padded by pack, K off 128 with a scale per channel),
NaN-poisoned outputs, both schedules and split K (the same bits twice), the long-K error bound, a
bias with float16 output and per-tensor activation scales, the layer, a CUDA graph replay, and the
errors. Fresh random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w4a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.testing.w8a8 import (
    assert_graph_replay_is_eager,
    assert_long_k_error_bound,
    assert_within_sum_bound,
    skip_without_kernels,
    skip_without_portable_kernels,
)
from humming_aot.testing.w8a8 import fresh_seed as _seed
from humming_aot.w8a8 import dequantized_activation

pytestmark = pytest.mark.gpu

_U4 = w4a8.UINT4_ELEMENT
_TILES = sorted({label for _, label in w4a8._TILES} | {w4a8._WIDE_DECODE_TILE} | {
    "wgmma-w4a8:128x128x128_w1x8_s5", "wgmma-w4a8:96x128x128_w1x8_s6", "wgmma-w4a8:32x256x128_w1x8_s6",
    "wgmma-w4a8:8x64x128_w1x4_s8",  # four CTAs per SM
})
_SYNC_TILES = sorted({label for _, label in w4a8._SYNC_TILES} | {"mma-w4a8:16x64x128_w1x2_s2"})
_ELEMENTS = ("int8", "float8e4m3")


@pytest.fixture
def _wgmma():
    skip_without_kernels([w4a8.kernel_key("sm90a", dtype, parse_tile_field(t), weight_element=_U4) for t in _TILES
                          for dtype in (torch.bfloat16, torch.float16)])


@pytest.fixture
def _sync(request):
    skip_without_portable_kernels(request, "mma-w4a8", lambda arch, elements: [
        w4a8.kernel_key(arch, dtype, parse_tile_field(t), e, _U4)
        for t in _SYNC_TILES for e in elements for dtype in (torch.bfloat16, torch.float16)])


def _uint4_weight(n: int, k: int, gen: torch.Generator, fmt: str = "uint4:g128:zp") -> quant.QuantizedWeight:
    """Random codes and zero points (every value of each) and scales of different magnitudes per
    channel and group, in the format's shapes."""
    f = quant.WeightFormat.parse(fmt)
    shape = f.scale_shape((n, k))
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)
    scales = (torch.rand(shape, generator=gen).add(0.05) * 2.0 ** torch.randint(-6, 3, shape, generator=gen)).float()
    return quant.QuantizedWeight(format=f, codes=codes, scales=scales, zero_points=zeros)


def _operands(m: int, n: int, k: int, gen: torch.Generator, act: str = "float8e4m3:token", fmt: str = "uint4:g128:zp"):
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w4a8.pack(_uint4_weight(n, k, gen, fmt)).to("cuda")
    return ops.quantize_activation(x.cuda(), act), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    """y against the float64 product (humming_aot.testing.w8a8.assert_within_sum_bound: the
    output's rounding and the fp8 sums' 2^-11, s8 sums exact). A code, zero point or scale gone
    wrong is far larger."""
    assert_within_sum_bound(y, qa, packed, bias, out_dtype)


# (m, n, k, format): N = 200 and 320 off the CTA widths (pack pads to 256 / 320); K = 416 off 128
_SHAPES = [(1, 256, 128, "uint4:g128:zp"), (37, 200, 416, "uint4:channel:zp"), (200, 384, 1024, "uint4:g256:zp"),
           (129, 1000, 2048, "uint4:g128:zp"), (77, 320, 384, "uint4:tensor:zp")]


@pytest.mark.usefixtures("_wgmma")
@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k,fmt", _SHAPES)
def test_every_wgmma_tile_matches_the_float64_product(tile, m, n, k, fmt):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, fmt=fmt)
    out = torch.empty((m, packed.n), dtype=torch.bfloat16, device="cuda")
    for stream_k in (None, 0):
        out.fill_(float("nan"))
        y = w4a8.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k)
        _check(y[:, : packed.out_features], qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, out=torch.empty_like(out), tile=tile, stream_k=0)), "two runs differ"


@pytest.mark.usefixtures("_sync")
@pytest.mark.parametrize("element", _ELEMENTS)
@pytest.mark.parametrize("tile", _SYNC_TILES)
@pytest.mark.parametrize("m,n,k,fmt", _SHAPES)
def test_every_mma_tile_matches_the_float64_product(tile, m, n, k, fmt, element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, f"{element}:token", fmt)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w4a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.usefixtures("_sync")
@pytest.mark.parametrize("element", _ELEMENTS)
def test_split_k_gives_the_same_bits_twice(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(3, 1024, 8192, gen, f"{element}:token")
    tile = w4a8.select_sync_tile(3).label
    y = w4a8.gemm(qa, packed, tile=tile)
    _check(y, qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, tile=tile)), "two runs differ"


@pytest.mark.usefixtures("_wgmma")
def test_the_table_tensor_scales_bias_float16_and_the_op():
    gen = torch.Generator().manual_seed(_seed())
    for m in (1, 16, 100, 700, 2000):
        qa, packed = _operands(m, 1000, 1024, gen, act="float8e4m3:tensor" if m == 100 else "float8e4m3:token")
        bias = torch.randn(1000, generator=gen).to(torch.float16).cuda()
        y = w4a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
        assert y.shape == (m, 1000) and y.dtype == torch.float16
        _check(y, qa, packed, bias, torch.float16)
        assert torch.equal(ops.gemm(qa, packed, bias), y)  # the op routes a W4A8 weight here
        int8 = ops.quantize_activation(dequantized_activation(qa, packed.k).float(), "int8:token")
        _check(w4a8.gemm(int8, packed, bias=bias, out_dtype=torch.float16), int8, packed, bias, torch.float16)


@pytest.mark.usefixtures("_wgmma")
def test_long_k_error_bound_needs_the_fp32_promotion():
    gen = torch.Generator().manual_seed(_seed())
    k = 16384
    x = torch.randn(256, k, generator=gen)
    qa = ops.quantize_activation(x.cuda(), "float8e4m3:token")
    packed = w4a8.pack(quant.quantize(torch.randn(1024, k, generator=gen), "uint4:g128:zp")).to("cuda")
    assert_long_k_error_bound(qa, packed, lambda sub, m: w4a8.gemm(sub, packed, out_dtype=torch.float16))


@pytest.mark.usefixtures("_wgmma")
def test_cuda_graph_replay_and_the_layer():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen)
    assert_graph_replay_is_eager(lambda: w4a8.gemm(qa, packed))

    linear = torch.nn.Linear(512, 300, bias=True).to(torch.bfloat16)
    for act in ("float8e4m3:token", "int8:token"):
        layer = QuantizedLinear.from_linear(linear, "uint4:g128:zp", activations=act).cuda()
        assert isinstance(layer, W8A8Linear) and layer.packed.element == _U4
        x = torch.randn(9, 512, generator=gen).to(torch.bfloat16).cuda()
        q = ops.quantize_activation(x, act)
        assert torch.equal(layer(x), w4a8.gemm(q, layer.packed, bias=layer.bias.to(torch.bfloat16)))


@pytest.mark.usefixtures("_wgmma")
def test_bad_operands_raise_errors_that_say_what_to_do():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 128, 256, gen)
    with pytest.raises(ValueError, match="wgmma-w4a8 tiles"):
        w4a8.gemm(qa, packed, tile="wgmma-ss:8x128x128_w1x4_s6")
    int8 = ops.quantize_activation(torch.randn(4, 256, device="cuda"), "int8:token")
    with pytest.raises(ValueError, match="int8 ones run on mma-w4a8 tiles"):
        w4a8.gemm(int8, packed, tile=w4a8.select_tile(4).label)
