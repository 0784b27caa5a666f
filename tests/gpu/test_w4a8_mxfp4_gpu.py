"""W4A8 with MXFP4 weights (float4e2m1, an e8m0 scale per 32 of K) x float8e4m3 activations
(humming_aot.w4a8) on the GPU: the sm90a wgmma-w4a8 body's table tiles and others beside them
(one scratch set and two, four CTAs per SM), and the portable mma-w4a8 body through the build of
the first arch that serves it, against the float64 product of the exact codes and scales. Weights
drawn as codes and scales directly: group scales up to 3 binades apart within a K tile (as
quantizers make them) under the bound of the int4 tests, and every offset the window holds (up
to 11 binades) under the bound of the fp8 tensor cores' truncated sums (_check); tile scales far
apart; odd shapes (N padded by pack, K a multiple of 32 but not of 128), NaN-poisoned outputs,
both schedules, the long-K error bound, a bias with float16 output, the layer, a CUDA graph
replay, and the errors. Fresh random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w4a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.testing.w8a8 import (
    assert_graph_replay_is_eager,
    assert_long_k_error_bound,
    skip_without_kernels,
    skip_without_portable_kernels,
)
from humming_aot.testing.w8a8 import fresh_seed as _seed
from humming_aot.w8a8 import dequantized_activation

pytestmark = pytest.mark.gpu

_MX = w4a8.MXFP4_ELEMENT
_TILES = sorted({label for _, label in w4a8._TILES} | {w4a8._WIDE_DECODE_TILE} | {
    "wgmma-w4a8:128x128x128_w1x8_s5", "wgmma-w4a8:96x128x128_w1x8_s6", "wgmma-w4a8:32x256x128_w1x8_s6",
    "wgmma-w4a8:8x64x128_w1x4_s8",  # four CTAs per SM
})
_SYNC_TILES = sorted({label for _, label in w4a8._SYNC_TILES} | {"mma-w4a8:16x64x128_w1x2_s2"})


@pytest.fixture
def _wgmma():
    skip_without_kernels([w4a8.kernel_key("sm90a", dtype, parse_tile_field(t), weight_element=_MX) for t in _TILES
                          for dtype in (torch.bfloat16, torch.float16)])


@pytest.fixture
def _sync(request):
    skip_without_portable_kernels(request, "mma-w4a8", lambda arch, elements: [
        w4a8.kernel_key(arch, dtype, parse_tile_field(t), "float8e4m3", _MX)
        for t in _SYNC_TILES for dtype in (torch.bfloat16, torch.float16)] if "float8e4m3" in elements else [])
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8e4m3 mma.sync needs sm89")


def _mxfp4_weight(n: int, k: int, gen: torch.Generator, spread: int = 3, bases: int = 20) -> quant.QuantizedWeight:
    """Random e2m1 codes (every code, both zeros) and power-of-two group scales: per channel and
    K tile of 128 a base exponent in -bases .. bases, each group of 32 at 0 .. spread binades below
    it (spread 11: the whole window pack folds into the codes)."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    groups = k // 32
    base = torch.randint(-bases, bases + 1, (n, -(-groups // 4)), generator=gen).repeat_interleave(4, 1)[:, :groups]
    exponents = base - torch.randint(0, spread + 1, (n, groups), generator=gen)
    return quant.QuantizedWeight(format=quant.WeightFormat.parse("mxfp4"), codes=codes,
                                 scales=torch.pow(2.0, exponents.double()).float())


def _operands(m: int, n: int, k: int, gen: torch.Generator, act: str = "float8e4m3:token", spread: int = 3,
              bases: int = 20, span: int | None = None):
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w4a8.pack(_mxfp4_weight(n, k, gen, spread, bases), mxfp4_span=span).to("cuda")
    return ops.quantize_activation(x.cuda(), act), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16, wide: bool = False):
    """y against the float64 product: the output's rounding (half an ulp), plus the fp8 tensor
    cores' sums of each K tile. Those keep about 14 bits of a sum aligned to its largest term and
    truncate the rest (tests/gpu/test_w8a8_gpu.py): with group scales a few binades apart 2^-11 of
    the sum of |products| covers it (the int4 tests' bound); with `wide` offsets (up to 2^11
    within a K tile) a large group's partial sum makes the smaller groups' 32 products a step
    truncate at its scale, and measured errors reached ~2^-9 of it: 2^-8 of the sum of |products|
    then (found on the H200, session 41). Where a span of K tiles (packed.group_size / 128) shares
    one sum before its promotion, each step's truncation is at most the span's running sum's: the
    span's K tiles times the bound.
    A code, table or tile scale gone wrong is far larger."""
    ref = w4a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    a_abs = dequantized_activation(qa, packed.k).abs()
    sums = 2.0**-8 if wide else 2.0**-11 * (packed.group_size // 128)  # (the span's K tiles)
    bound = eps * ref.abs() + sums * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


_SHAPES = [(1, 256, 128), (37, 200, 416), (200, 384, 1024), (129, 1000, 2048),
           (77, 320, 384)]  # N = 320: a 128-wide CTA of 64 columns; 3 K tiles (odd)


@pytest.mark.usefixtures("_wgmma")
@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", _SHAPES)
def test_every_wgmma_tile_matches_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen)
    out = torch.empty((m, packed.n), dtype=torch.bfloat16, device="cuda")
    for stream_k in (None, 0):
        out.fill_(float("nan"))
        y = w4a8.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k)
        _check(y[:, : packed.out_features], qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, out=torch.empty_like(out), tile=tile, stream_k=0)), "two runs differ"


@pytest.mark.usefixtures("_wgmma")
@pytest.mark.parametrize("tile", ["wgmma-w4a8:8x128x128_w1x4_s8", "wgmma-w4a8:96x128x128_w1x8_s6",
                                  "wgmma-w4a8:192x128x128_w1x8_s5"])
def test_every_group_offset_of_the_window(tile):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(77, 320, 384, gen, spread=11)
    offsets = packed.w_scale[..., 1].to(torch.int64)
    seen = {int(((offsets >> (8 * g)) & 0xFF).unique().numel()) for g in range(4)}
    assert max(seen) == 12, "the draw should hold every offset -5 .. 6"
    out = torch.full((77, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _check(w4a8.gemm(qa, packed, out=out, tile=tile), qa, packed, wide=True)


@pytest.mark.usefixtures("_wgmma")
@pytest.mark.parametrize("tile", ["wgmma-w4a8:8x128x128_w1x4_s8", "wgmma-w4a8:64x128x128_w1x8_s8",
                                  "wgmma-w4a8:128x128x128_w1x8_s7", "wgmma-w4a8:192x128x128_w1x8_s5"])
@pytest.mark.parametrize("span", [2, 4, 8])
def test_spans_of_k_tiles_share_a_promotion(tile, span):
    """Scales folded over spans of K tiles (every K tile's entry holding its span's scale): one
    scratch set sums a span before one promotion (the 128- and 192-token tiles), two promote each
    K tile (8 and 64 tokens). K of 11 K tiles less 32 (a partial last span), the tail split's K
    slices and stream-K's ranges (which begin and end inside spans), NaN-poisoned outputs."""
    gen = torch.Generator().manual_seed(_seed())
    m, n, k = 150, 320, 11 * 128 - 32
    qa, packed = _operands(m, n, k, gen, bases=0, span=span)
    assert packed.group_size == 128 * span
    out = torch.empty((m, packed.n), dtype=torch.bfloat16, device="cuda")
    for stream_k in (None, 0, 7):
        out.fill_(float("nan"))
        y = w4a8.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k)
        _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.usefixtures("_sync")
@pytest.mark.parametrize("tile", _SYNC_TILES)
@pytest.mark.parametrize("m,n,k", _SHAPES)
def test_every_mma_tile_matches_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w4a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.usefixtures("_wgmma")
def test_the_table_tensor_scales_bias_float16_and_the_op():
    gen = torch.Generator().manual_seed(_seed())
    for m in (1, 16, 100, 700):
        # (tile scales of at most 2^4: the float16 output holds the sums)
        qa, packed = _operands(m, 1000, 1024, gen, act="float8e4m3:tensor" if m == 100 else "float8e4m3:token",
                               bases=4)
        bias = torch.randn(1000, generator=gen).to(torch.float16).cuda()
        y = w4a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
        assert y.shape == (m, 1000) and y.dtype == torch.float16
        _check(y, qa, packed, bias, torch.float16)
        assert torch.equal(ops.gemm(qa, packed, bias), y)  # the op routes a W4A8 weight here


@pytest.mark.usefixtures("_wgmma")
def test_long_k_error_bound_needs_the_fp32_promotion():
    gen = torch.Generator().manual_seed(_seed())
    k = 16384
    x = torch.randn(256, k, generator=gen)
    qa = ops.quantize_activation(x.cuda(), "float8e4m3:token")
    qw = quant.quantize(torch.randn(1024, k, generator=gen), "mxfp4")
    for span in (1, None):  # (None: pack's own, the longest up to w4a8_mxfp4.MAX_SPAN)
        packed = w4a8.pack(qw, mxfp4_span=span).to("cuda")
        print(f"span {packed.group_size // 128} K tiles")
        assert_long_k_error_bound(qa, packed, lambda sub, m, p=packed: w4a8.gemm(sub, p, out_dtype=torch.float16))


@pytest.mark.usefixtures("_wgmma")
def test_cuda_graph_replay_and_the_layer():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen)
    assert_graph_replay_is_eager(lambda: w4a8.gemm(qa, packed))

    linear = torch.nn.Linear(512, 300, bias=True).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "mxfp4", activations="float8e4m3:token").cuda()
    assert isinstance(layer, W8A8Linear)
    x = torch.randn(9, 512, generator=gen).to(torch.bfloat16).cuda()
    y = layer(x)
    q = ops.quantize_activation(x, "float8e4m3:token")
    assert torch.equal(y, w4a8.gemm(q, layer.packed, bias=layer.bias.to(torch.bfloat16)))


@pytest.mark.usefixtures("_wgmma")
def test_bad_operands_raise_errors_that_say_what_to_do():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 128, 256, gen)
    int8 = ops.quantize_activation(torch.randn(4, 256, device="cuda"), "int8:token")
    with pytest.raises(ValueError, match="takes float8e4m3 activations"):
        w4a8.gemm(int8, packed)
    with pytest.raises(ValueError, match="wgmma-w4a8 tiles"):
        w4a8.gemm(qa, packed, tile="wgmma-ss:8x128x128_w1x4_s6")

