"""Block-scaled FP4 W4A4 (NVFP4 x NVFP4, MXFP4 x MXFP4: humming_aot.fp4 on the mma-fp4 body) on
the GPU at hand. On an sm120a / sm121a GPU the kernels run the block-scaled mma; on an H200 (no
such instruction) the tests build the same kernel for sm_90a, where mma/mma_sync_fp4.cuh emulates
the instruction with warp shuffles in its register contract: that checks everything around the
instruction (the staging of codes and scale bytes, the fragments, each lane's scale words and the
selectors that pick them, promotion, split K, the global scales, the epilogue) against the float64
product of the exact operands. Every table tile and one beside it, odd shapes (M and N off every
tile, K a multiple of 32 but not of 64 or 256: partial k64 steps), NaN-poisoned outputs, split K
twice for the same bits, float16 with a bias, the custom op and a CUDA graph. Fresh random data
each run (seed printed)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import fp4, ops, quant
from humming_aot.bodies.mma_fp4 import native
from humming_aot.enumerate import parse_tile_field
from humming_aot.testing.w8a8 import fresh_seed as _seed

pytestmark = pytest.mark.gpu

_TILES = sorted({label for _, label in fp4._TILES} | {"mma-fp4:16x64x128_w1x2_s2", "mma-fp4:128x128x128_w2x4_s2"})
_RECIPES = ("nvfp4", "mxfp4")


def _arch() -> str | None:
    """The kernels' target here: the GPU's block-scaled one, or sm90a (emulated) on an H200."""
    from humming_aot import dispatch

    info = dispatch.device_info(torch.cuda.current_device())
    native_arches = [a for a in info.arches if native(a)]
    if native_arches:
        return native_arches[0]
    return "sm90a" if "sm90a" in info.arches else None


@pytest.fixture(autouse=True)
def _needs_the_kernels():
    from humming_aot.catalog import installed_catalog
    from humming_aot.testing.jit import why_no_jit

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    arch = _arch()
    if arch is None:
        pytest.skip("the FP4 W4A4 kernels run on sm120a / sm121a, and emulated on sm90a")
    why = why_no_jit("the FP4 W4A4 kernels must come from the installed catalog", "to build the FP4 W4A4 kernels")
    catalog = installed_catalog()
    keys = [fp4.kernel_key(arch, d, parse_tile_field(t), s) for t in _TILES for d in (torch.bfloat16, torch.float16)
            for s in (fp4.NVFP4_SCALES, fp4.MXFP4_SCALES)]
    if why is not None and (catalog is None or any(catalog.lookup(key.name) is None for key in keys)):
        pytest.skip(why)


def _operands(m: int, n: int, k: int, gen: torch.Generator, recipe: str):
    # channels and tokens of different magnitudes, and within a row groups of different ones, so
    # that a misplaced block scale shows
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).add(0.1)
    w = w * torch.rand(n, k // 16, generator=gen).add(0.05).repeat_interleave(16, 1)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.1)
    x = x * torch.rand(m, k // 16, generator=gen).add(0.05).repeat_interleave(16, 1)
    return ops.quantize_activation(x.cuda(), recipe), fp4.pack(quant.quantize(w, recipe)).to("cuda")


def _check(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16):
    ref = fp4.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    # every product is exact in fp32 (2 x 2 significant bits of codes, 4 x 4 of ue4m3 scales);
    # the fp32 sums and the global scales stay far below 2^-18 of the sum of |products|, and the
    # output's rounding is half an ulp: a code, nibble, scale byte or selector gone wrong is far larger
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    a_abs = fp4.dequantized_activation(qa, packed.k).abs()
    bound = eps * ref.abs() + 2.0**-18 * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


@pytest.mark.parametrize("recipe", _RECIPES)
@pytest.mark.parametrize("tile", _TILES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 256), (37, 200, 416), (200, 384, 1024), (129, 136, 2880), (77, 320, 96)])
def test_every_tile_matches_the_float64_product(recipe, tile, m, n, k):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(m, n, k, gen, recipe)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = fp4.gemm(qa, packed, out=out, tile=tile, arch=_arch())
    _check(y[:, : packed.out_features], qa, packed)


@pytest.mark.parametrize("recipe", _RECIPES)
def test_split_k_gives_the_same_bits_twice_and_the_table_runs(recipe):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(4, 512, 8192, gen, recipe)  # few tiles on a long K: the table splits K
    y = fp4.gemm(qa, packed, arch=_arch())
    _check(y, qa, packed)
    assert torch.equal(y, fp4.gemm(qa, packed, arch=_arch())), "two runs differ"
    for m in (16, 33, 300):
        qa, packed = _operands(m, 1000, 1024, gen, recipe)
        _check(fp4.gemm(qa, packed, arch=_arch()), qa, packed)


@pytest.mark.parametrize("recipe", _RECIPES)
def test_float16_bias_and_a_graph(recipe):
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(50, 100, 512, gen, recipe)
    bias = torch.randn(100, generator=gen).to(torch.float16).cuda()
    y = fp4.gemm(qa, packed, bias=bias, out_dtype=torch.float16, arch=_arch())
    assert y.shape == (50, 100) and y.dtype == torch.float16
    _check(y, qa, packed, bias, torch.float16)
    # a captured graph replays the launch (activation layout included) on new operands in place
    fp4.gemm(qa, packed, arch=_arch())  # (loads the kernel outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp4.gemm(qa, packed, arch=_arch())
    fresh, _ = _operands(50, 100, 512, gen, recipe)
    qa.codes.copy_(fresh.codes)
    qa.scales.copy_(fresh.scales)
    if qa.global_scale is not None:
        qa.global_scale.copy_(fresh.global_scale)
    graph.replay()
    torch.cuda.synchronize()
    _check(y, qa, packed)


def test_the_op_matches_on_a_native_gpu_or_refuses_elsewhere():
    gen = torch.Generator().manual_seed(_seed())
    qa, packed = _operands(8, 64, 256, gen, "nvfp4")
    if _arch() == "sm90a":  # no block-scaled mma here: the table's call says which GPUs have it
        with pytest.raises(RuntimeError, match="sm120a and sm121a.*W4A16"):
            fp4.gemm(qa, packed)
        return
    y = torch.ops.humming_aot.gemm_fp4(qa.codes, qa.scales, qa.global_scale, packed.w, packed.w_scale,
                                       packed.global_scale, None, packed.out_features, packed.k, packed.scale_dtype,
                                       torch.bfloat16)
    _check(y, qa, packed)
