"""The portable W4A8 body (mma-w4a8: int4 codes of W4A8's packed layout widened to s8 or e4m3 in
registers before mma.sync m16n8k32, kernel/dense_mma_w4a8.cuh) on the GPU at hand, through the
build of the first arch that serves it (on an H200: sm_90a, whose e4m3 mma.sync is ptxas's f16
emulation; s8 runs natively): int8 and float8 activations, every tile of its table and others,
against the float64 product of the exact codes and scales, at odd shapes (M, N and K off every
tile, K not a multiple of 128), in every weight scaling (g128, g256, per channel), NaN-poisoned
outputs, split K (deterministic), per-tensor activation scales with a bias and float16, the
long-K error bound, the layer, and a CUDA graph replay. Fresh random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import _w8a8_launch, ops, quant, w4a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.testing.w8a8 import assert_long_k_error_bound, assert_within_sum_bound, portable_arch, skip_without_portable_kernels
from humming_aot.testing.w8a8 import fresh_seed as _seed

pytestmark = pytest.mark.gpu

_TILES = sorted({label for _, label in w4a8._SYNC_TILES} | {
    "mma-w4a8:16x64x128_w1x2_s2", "mma-w4a8:32x256x128_w1x8_s3", "mma-w4a8:64x64x128_w2x2_s3",
})
_ELEMENTS = ("int8", "float8e4m3")


_arch = portable_arch


@pytest.fixture(autouse=True)
def _needs_the_kernels(request):
    skip_without_portable_kernels(request, "mma-w4a8", lambda arch, elements: [
        w4a8.kernel_key(arch, dtype, parse_tile_field(t), e)
        for t in _TILES for e in elements for dtype in (torch.bfloat16, torch.float16)])


def _operands(m: int, n: int, k: int, gen: torch.Generator, element: str, weights: str = "int4:g128",
              act: str = "token"):
    # channels, K ranges and tokens of different magnitudes, so that a misplaced scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w4a8.pack(quant.quantize(w, weights)).to("cuda")
    return ops.quantize_activation(x.cuda(), f"{element}:{act}"), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    """y against the float64 product: the output's rounding, plus for e4m3 the tensor cores' sums
    of each K tile; s8 sums are exact (humming_aot.testing.w8a8.assert_within_sum_bound)."""
    assert_within_sum_bound(y, qa, packed, bias, out_dtype)


@pytest.mark.parametrize("element", _ELEMENTS)
@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k,weights", [(1, 128, 128, "int4:g128"), (37, 192, 272, "int4:channel"),
                                           (200, 384, 1024, "int4:g256"), (300, 1024, 512, "int4:g128")])
def test_every_tile_matches_the_float64_product(tile, m, n, k, weights, element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, element, weights)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w4a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.parametrize("element", _ELEMENTS)
@pytest.mark.parametrize("m,n,k", [(3, 1024, 8192), (40, 512, 4112)])
def test_split_k_slices_meet_in_slice_order(m, n, k, element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, element, "int4:channel" if k % 128 else "int4:g128")
    tile = w4a8.select_sync_tile(m).label
    y = w4a8.gemm(qa, packed, tile=tile)
    (plan,) = [p for key, p in _w8a8_launch._plans.items() if key[2] == f"int4x{element}" and key[4] == tile
               and key[5:8] == (m, packed.n, k)]
    assert plan.splits > 1, "the launch did not split K: the test misses its path"
    _check(y, qa, packed)
    assert torch.equal(y, w4a8.gemm(qa, packed, tile=tile)), "two runs differ"
    print(f"{tile}: {plan.splits} K slices")


@pytest.mark.parametrize("element", _ELEMENTS)
def test_tensor_scale_bias_float16_and_padded_n(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, element, act="tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    for tile in ("mma-w4a8:64x128x128_w2x4_s4", "mma-w4a8:16x128x128_w1x4_s4"):
        y = w4a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16, tile=tile)
        assert y.shape == (50, 100) and y.dtype == torch.float16
        _check(y, qa, packed, bias, torch.float16)


@pytest.mark.parametrize("element", _ELEMENTS)
def test_long_k_error_bound(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(256, 1024, 16384, gen, element)
    assert_long_k_error_bound(qa, packed, lambda sub, m: w4a8.gemm(sub, packed, out_dtype=torch.float16,
                                                                   tile=w4a8.select_sync_tile(m).label))


def test_the_table_serves_int8_activations_and_the_layer_quantizes_them():
    # wgmma-w4a8 takes float8 activations only: int8 ones go to the portable body through the table
    from humming_aot.nn import W8A8Linear

    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(33, 256, 512, gen, "int8")
    _check(w4a8.gemm(qa, packed), qa, packed)
    linear = torch.nn.Linear(512, 200).cuda()
    layer = W8A8Linear.from_linear(linear, "int4:g128", activations="int8:token")
    x = torch.randn(5, 512, generator=gen).cuda().to(torch.bfloat16)
    expected = w4a8.gemm(ops.quantize_activation(x, "int8:token"), layer.packed,
                         bias=linear.bias.detach().to(torch.bfloat16))
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("element", _ELEMENTS)
def test_cuda_graph_replay(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen, element)
    tile = "mma-w4a8:32x128x128_w1x4_s4"
    eager = w4a8.gemm(qa, packed, tile=tile)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w4a8.gemm(qa, packed, tile=tile)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
