"""W4A4 (int4:channel weights x int4:token activations, humming_aot.w8a8 on the portable mma-ss
body: mma.sync m16n8k64 s4) on the GPU at hand, through the build of the first arch that serves it
(on an H200: sm_90a, whose ptxas emulates the s4 mma with s8 ones): every tile of the table and
one beside it against the float64 product of the exact codes and scales (int32 sums are exact, so
only the fp32 scale products and the output's rounding differ), at odd shapes (M, N off every
tile; K a multiple of 32 but not of 256), NaN-poisoned outputs, split K twice for the same bits,
per-tensor scales with a bias and float16, the layer and a CUDA graph. Fresh random data each run
(seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import ops, quant, w8a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.testing.w8a8 import fresh_seed as _seed
from humming_aot.testing.w8a8 import skip_without_portable_kernels
from humming_aot.w8a8 import dequantized_activation

pytestmark = pytest.mark.gpu

_TILES = sorted({label for _, label in w8a8._SYNC_TILES} | {"mma-ss:16x64x128_w1x2_s2"})


@pytest.fixture(autouse=True)
def _needs_the_kernels(request):
    skip_without_portable_kernels(request, "mma-ss", lambda arch, elements: [
        w8a8.kernel_key(arch, dtype, parse_tile_field(t), element="int4")
        for t in _TILES for dtype in (torch.bfloat16, torch.float16)])


def _operands(m: int, n: int, k: int, gen: torch.Generator, weights: str = "int4:channel", act: str = "int4:token"):
    # channels and tokens of different magnitudes, so that a misplaced scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1)
    return ops.quantize_activation(x.cuda(), act), w8a8.pack(quant.quantize(w, weights)).to("cuda")


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    ref = w8a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    # exact int32 sums: the output's rounding (half an ulp) and the fp32 scale products and adds,
    # far below 2^-20 of the sum of |products|; a code, nibble or scale gone wrong is far larger
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    a_abs = dequantized_activation(qa, packed.k).abs()
    bound = eps * ref.abs() + 2.0**-20 * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 256), (37, 200, 416), (200, 384, 1024), (129, 1000, 2048),
                                   (77, 320, 96)])
def test_every_tile_matches_the_float64_product(tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)


def test_split_k_gives_the_same_bits_twice_and_the_table_runs():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 512, 8192, gen)  # few tiles on a long K: the table splits K
    y = w8a8.gemm(qa, packed)
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed)), "two runs differ"
    for m in (16, 64, 300):
        qa, packed = _operands(m, 1000, 1024, gen)
        _check(w8a8.gemm(qa, packed), qa, packed)


def test_tensor_scales_bias_float16_the_op_and_a_graph():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, weights="int4:tensor", act="int4:tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    y = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    assert y.shape == (50, 100) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)
    assert torch.equal(ops.gemm(qa, packed, bias), y)  # the op routes it here
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, y)


def test_the_layer():
    from humming_aot.nn import QuantizedLinear

    gen = torch.Generator().manual_seed(_seed())
    linear = torch.nn.Linear(512, 300).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "int4:channel", activations="int4:token").cuda()
    x = torch.randn(9, 512, generator=gen).to(torch.bfloat16).cuda()
    q = ops.quantize_activation(x, "int4:token")
    assert torch.equal(layer(x), w8a8.gemm(q, layer.packed, bias=layer.bias.to(torch.bfloat16)))
