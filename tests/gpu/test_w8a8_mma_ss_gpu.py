"""The portable W8A8 body (mma-ss: mma.sync m16n8k32 on s8 or e4m3 codes, kernel/dense_mma_ss.cuh)
on the GPU at hand, through the build of the first arch that serves it (on an H200: sm_90a, where
the e4m3 mma.sync runs as ptxas's f16 emulation, the same fragments and schedule as Ada's native
one): every tile of its
table and wider ones against the float64 product of the exact codes and scales, at odd shapes (M,
N and K off every tile, K not a multiple of 128), NaN-poisoned outputs, split K (deterministic), a
bias, float16, per-tensor activation scales, DeepSeek-V3's block scales (float8), the long-K error
bound, and a CUDA graph replay.
Fresh random data each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import _w8a8_launch, dispatch, ops, quant, w8a8
from humming_aot.bodies.mma_ss import FIRST_ARCH
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import parse_arch
from humming_aot.testing.w8a8 import fresh_seed as _seed
from humming_aot.testing.w8a8 import portable_arch, skip_without_portable_kernels

pytestmark = pytest.mark.gpu

_TILES = sorted({label for _, label in w8a8._SYNC_TILES} | {
    "mma-ss:16x64x128_w1x2_s2", "mma-ss:64x256x128_w2x4_s3", "mma-ss:32x128x128_w2x2_s3",
    "mma-ss:128x64x128_w4x1_s4",
})
_ELEMENTS = ("int8", "float8e4m3")
_OUT_DTYPES = (torch.bfloat16, torch.float16)


_arch = portable_arch


@pytest.fixture(autouse=True)
def _needs_the_kernels(request):
    skip_without_portable_kernels(request, "mma-ss", lambda arch, elements: [
        w8a8.kernel_key(arch, dtype, parse_tile_field(t), False, e)
        for t in _TILES for e in elements for dtype in _OUT_DTYPES])


def _operands(m: int, n: int, k: int, gen: torch.Generator, element: str, act: str = "token",
              weights: str = "channel"):
    # rows and K columns of different magnitudes, so that a misplaced scale or code shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1) * torch.rand(1, k, generator=gen).add(0.1)
    packed = w8a8.pack(quant.quantize(w, f"{element}:{weights}")).to("cuda")
    return ops.quantize_activation(x.cuda(), f"{element}:{act}"), packed


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    ref = w8a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    # the output's rounding (half an ulp), plus for e4m3 the tensor cores' sums (the wgmma-ss
    # test's bound: 2^-11 of the sum of |products|); s8 sums are exact, so only the fp32 scale
    # products and the slices' fp32 adds, far below 2^-20 of the sum of |products|
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    sums = 2.0**-11 if packed.element == "float8e4m3" else 2.0**-20
    a_abs = w8a8.dequantized_activation(qa, packed.k).abs()
    bound = eps * ref.abs() + sums * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


def _splits(m: int, n: int, k: int, tile: str, element: str) -> int:
    """The K slices the launch of this problem took (its plan)."""
    for key, plan in _w8a8_launch._plans.items():
        if key[2] == element and key[4] == tile and key[5:8] == (m, n, k):
            return plan.splits
    raise AssertionError("no plan for the problem: the launch did not go through _w8a8_launch")


@pytest.mark.parametrize("element", _ELEMENTS)
@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (37, 112, 272), (200, 384, 1040), (300, 1024, 512)])
def test_every_tile_matches_the_float64_product(tile, m, n, k, element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, element)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.parametrize("tile", [t for t in _TILES if 128 % (parse_tile_field(t).block_n // parse_tile_field(t).warps_n)
                                  == 0])
@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (37, 200, 384), (200, 384, 1024), (300, 1024, 512)])
def test_block_scales_match_the_float64_product(tile, m, n, k):
    # DeepSeek-V3's scaling: one scale per 128 x 128 weight block (N = 200: a partial last block)
    # and per token per 128 of K, weighed at each K tile's promotion
    if parse_arch(_arch())[0] < FIRST_ARCH["float8e4m3"]:
        pytest.skip("e4m3 mma.sync needs sm89")
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, "float8e4m3", act="g128", weights="b128x128")
    assert packed.blocks
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = w8a8.gemm(qa, packed, out=out, tile=tile)
    _check(y[:, : packed.out_features], qa, packed)
    if m == 1:  # K in slices too: 8 K tiles on few output tiles
        qa, packed = _operands(2, 256, 1024, gen, "float8e4m3", act="g128", weights="b128x128")
        y = w8a8.gemm(qa, packed, tile=tile)
        _check(y, qa, packed)
        assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile)), "two runs differ"


@pytest.mark.parametrize("element", _ELEMENTS)
@pytest.mark.parametrize("m,n,k", [(3, 1024, 8192), (40, 512, 4112)])
def test_split_k_slices_meet_in_slice_order(m, n, k, element):
    # few tiles on many SMs: K in slices reduced through the workspace; two runs give the same bits
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, element)
    tile = w8a8.select_sync_tile(m).label
    y = w8a8.gemm(qa, packed, tile=tile)
    splits = _splits(m, packed.n, k, tile, element)
    assert splits > 1, "the launch did not split K: the test misses its path"
    _check(y, qa, packed)
    assert torch.equal(y, w8a8.gemm(qa, packed, tile=tile)), "two runs differ"
    print(f"{tile}: {splits} K slices")


@pytest.mark.parametrize("element", _ELEMENTS)
def test_tensor_scale_bias_float16_and_padded_n(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 256, gen, element, act="tensor")
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    for tile in ("mma-ss:64x128x128_w2x2_s4", "mma-ss:16x128x128_w1x4_s4"):
        y = w8a8.gemm(qa, packed, bias=bias, out_dtype=torch.float16, tile=tile)
        assert y.shape == (50, 100) and y.dtype == torch.float16
        _check(y, qa, packed, bias, torch.float16)


def test_long_k_error_bound_of_the_float8_sums():
    # float16 output: its rounding (2^-11) leaves room to see the sums' own error at 1e-3
    if parse_arch(_arch())[0] < FIRST_ARCH["float8e4m3"]:
        pytest.skip("e4m3 mma.sync needs sm89")
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(256, 1024, 16384, gen, "float8e4m3")
    for m, tile in ((256, "mma-ss:128x128x128_w2x4_s3"), (16, "mma-ss:16x128x128_w1x4_s4"),
                    (1, "mma-ss:16x128x128_w1x4_s4")):
        sub = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=qa.group_size,
                                        scale_dtype=qa.scale_dtype, codes=qa.codes[:m], scales=qa.scales[:m])
        y = w8a8.gemm(sub, packed, out_dtype=torch.float16, tile=tile).double()
        ref = w8a8.reference(sub, packed)
        rel = ((y - ref).norm() / ref.norm()).item()
        print(f"m={m} relative error {rel:.2e}")
        assert rel <= 1e-3


@pytest.mark.parametrize("element", _ELEMENTS)
def test_cuda_graph_replay(element):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(24, 256, 512, gen, element)
    tile = "mma-ss:32x128x128_w1x4_s4"
    eager = w8a8.gemm(qa, packed, tile=tile)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = w8a8.gemm(qa, packed, tile=tile)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_a_serving_arch_runs_the_named_tiles():
    # (on an sm_90 GPU the table keeps wgmma-ss; a named mma-ss tile runs a build of its arches)
    info = dispatch.device_info(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(8, 128, 256, gen, "int8")
    tile, key = _w8a8_launch._kernel(info, torch.bfloat16, packed, "mma-ss:16x128x128_w1x4_s4", 8, 128, "int8")
    assert key.arch in info.arches and key.tile == tile
