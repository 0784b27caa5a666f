"""The 16-token swapped tile (body ``mma-sw``, humming_aot/bodies/mma_swapped.py) on the GPU: the
per-warp pipeline of the 8-token tile with two n8 token fragments per weight tile. Reached
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

TILES = ("mma-sw:16x128x256_w1x2x4_s2", "mma-sw:16x64x256_w1x1x4_s2", "mma-sw:16x128x64_w1x2x2_s4")
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


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_sixteen_token_swapped_tile_matches_the_reference(fmt, act):
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k = 320, 1024  # 5 units of 64 columns: a ragged last CTA for the 128-column tiles
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    packed = humming_aot.pack(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=act)
    spec = ops.gemm_spec(packed)
    for tile in TILES:
        key = _kernel_or_skip(packed, tile)
        w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
        for m in (1, 9, 16, 37):
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
