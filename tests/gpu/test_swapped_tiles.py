"""The 16- and 32-token swapped tiles (body ``mma-sw``, humming_aot/bodies/mma_swapped.py) on the
GPU: the per-warp pipeline of the 8-token tile with two or four n8 token fragments per weight tile. Reached
through the catalog where it holds the key, else the JIT. For every code family and its numerics
paths (scales on fp32 sums with the exact biased decode for 1- to 7-bit codes, scales on the
weights for float codes and zero points), at ragged M, with bias, whole and split along K (in a
cluster up to 8 slices, through the workspace past it), it must match the float64 reference of
the exact operands into a NaN-poisoned output, the same bits twice."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.catalog import installed_catalog
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey
from humming_aot.testing.jit import why_no_jit
from humming_aot.testing.numerics import assert_bitwise_equal, assert_gemm_close, reference_gemm, with_every_code


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if torch.cuda.get_device_capability() < (8, 0):
        return "the swapped pipeline copies with cp.async: sm_80+"
    return None


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

TILES = ("mma-sw:16x128x256_w1x2x4_s2", "mma-sw:16x64x256_w1x1x4_s2", "mma-sw:16x128x64_w1x2x2_s4",
         "mma-sw:32x64x256_w1x1x4_s2", "mma-sw:32x64x128_w1x1x2_s4", "mma-sw:32x128x64_w1x2x2_s4")
FORMATS = ("int4:g128", "uint4:g64:zp", "uint4:g128:zpf", "int8:channel", "int2:g128", "int3:g64", "mxfp4",
           "float8e4m3:channel")


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _kernel_or_skip(packed, tile: str) -> KernelKey:
    """The key of this tile for the device; skips (saying why) when neither the catalog nor the JIT
    can build it."""
    arch = dispatch.device_info(torch.cuda.current_device()).arches[0]
    key = KernelKey(arch=arch, spec=ops.gemm_spec(packed), tile=parse_tile_field(tile))
    catalog = installed_catalog()
    if catalog is None or key.name not in set(catalog.keys_for(arch)):
        why = why_no_jit(f"{key.name} is in no installed catalog", "to build it")
        if why is not None:
            pytest.skip(why)
    return key


def _packed_layer(fmt: str, n: int, k: int, device: str = "cuda"):
    """(seed, generator, packed bf16-activation weight) of a fresh random n x k layer in fmt, every
    code of the format present."""
    seed = _seed()
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(n, k, device=device, generator=gen) * 0.05
    return seed, gen, humming_aot.pack(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=torch.bfloat16)


def _op_matches_the_reference_twice(packed, m: int, gen: torch.Generator, context: str) -> None:
    """m fresh random tokens (a bias on odd m) through ops.gemm twice: the first output matches
    the float64 product of the weight the chosen kernel multiplies, the second has its bits."""
    n, k = packed.n, packed.k
    a = torch.randn(m, k, device=gen.device, generator=gen).to(torch.bfloat16)
    bias = (torch.randn(n, device=gen.device, generator=gen) * 0.5).to(torch.bfloat16) if m % 2 else None
    w_eff = ops.effective_weight(packed, m)
    outs = [ops.gemm(a, packed, bias) for _ in range(2)]
    assert_gemm_close(outs[0], reference_gemm(a, w_eff, bias), a=a, w_eff=w_eff, bias=bias, context=context)
    assert_bitwise_equal(outs[0], outs[1], context)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_swapped_tile_matches_the_reference(fmt, act, tile):
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k = 320, 1024  # 5 units of 64 columns: a ragged last CTA for the 128-column tiles
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    packed = humming_aot.pack(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=act)
    spec = ops.gemm_spec(packed)
    key = _kernel_or_skip(packed, tile)
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    # ragged last tiles of both token counts; 75: three 32-token tiles, the last of 11 rows
    for m in (1, 9, 16, 37, 75):
        a = torch.randn(m, k, device="cuda", generator=gen).to(act)
        bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m != 1 else None
        ref = reference_gemm(a, w_eff, bias)
        for splits in (1, 2, 8, 11):
            if k // key.tile.block_k < splits:
                continue
            context = f"{key.name} fmt={fmt} m={m} splits={splits} seed={seed}"
            outs = []
            for _ in range(2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=act)
                dispatch.launch_gemm(a, packed, bias, spec, tile=key.tile, out=out, splits=splits)
                outs.append(out)
            assert_gemm_close(outs[0], ref, a=a, w_eff=w_eff, bias=bias, context=context)
            assert_bitwise_equal(outs[0], outs[1], context)


@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g128:zp", "mxfp4"))
def test_the_op_sends_17_to_64_tokens_on_few_tiles_to_the_32_token_tile(fmt):
    """Through pack + ops.gemm (the table's choice and its split-K): on sm90a, 17-64 tokens of a
    layer with at most one 64-column tile per SM (and from 33 tokens, two token tiles, a short
    share of the K loop per SM) and codes of at most 4 bits run the swapped 32-token tile; the
    output matches
    the float64 product of the weight that kernel multiplies (ops.effective_weight: fp32 scales
    for integer codes), the same bits twice."""
    if dispatch.device_info(torch.cuda.current_device()).arches[0] != "sm90a":
        pytest.skip("the 32-token row is in the sm90a table only")
    from humming_aot import obtain

    n, k = 384, 2048
    seed, gen, packed = _packed_layer(fmt, n, k)
    info = dispatch.device_info(torch.cuda.current_device())
    for m in (17, 24, 32, 33, 50, 64):
        key = obtain.select_key(ops.gemm_spec(packed), info, m, k=k, group=packed.group_size, n=n)
        assert key.tile.label == "mma-sw:32x64x256_w1x1x4_s3", f"m={m}: {key.name}"
        _kernel_or_skip(packed, key.tile.label)
        _op_matches_the_reference_twice(packed, m, gen, f"fmt={fmt} m={m} seed={seed}")


@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g128:zpf", "mxfp4", "int8:channel"))
def test_the_op_sends_33_to_48_tokens_on_many_tiles_to_the_48_token_tma_tile(fmt):
    """Through pack + ops.gemm: on sm90a, 33-48 tokens of a layer whose swapped tiles would be more
    than one per SM (N = 4352: 2 x 68 tiles of 64 columns on 132 SMs) run the 48-token TMA tile for
    codes of at most 4 bits, and the 64-token one for 8-bit codes and from 49 tokens; the output
    matches the float64 product of the weight that kernel multiplies, the same bits twice."""
    if dispatch.device_info(torch.cuda.current_device()).arches[0] != "sm90a":
        pytest.skip("the 48-token row is in the sm90a table only")
    from humming_aot import obtain

    n, k = 4352, 512
    seed, gen, packed = _packed_layer(fmt, n, k)
    info = dispatch.device_info(torch.cuda.current_device())
    if info.num_sms >= 136:
        pytest.skip(f"{info.num_sms} SMs: 136 swapped tiles are at most one per SM there")
    for m in (33, 41, 48, 49):
        key = obtain.select_key(ops.gemm_spec(packed), info, m, k=k, group=packed.group_size, n=n)
        wide = m <= 48 and fmt != "int8:channel"
        expected = "wgmma-ws:48x128x64_w1x4_s8" if wide else "wgmma-ws:64x128x64_w1x4_s6"
        assert key.tile.label == expected, f"m={m}: {key.name}"
        _kernel_or_skip(packed, key.tile.label)
        _op_matches_the_reference_twice(packed, m, gen, f"fmt={fmt} m={m} seed={seed}")
