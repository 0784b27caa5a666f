"""The naive reference body (tile kind ``simt``, kernel/dense_simt.cuh) on the GPU: CUDA-core fp32
FMAs over weights decoded by the same numerics as the tensor-core bodies, reached through the JIT
(no catalog holds it). For every code family (integer with implicit, integer and float zero
points, 1- to 8-bit; small floats, MX and NVFP4) it must match the float64 reference of the exact
operands, at ragged M and N, with bias, in bf16 and f16, and so must the production kernel the
dispatcher picks for the same problem: two independent implementations held to one reference."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot import obtain as kernel_obtain
from humming_aot.testing.jit import why_no_jit
from humming_aot.testing.numerics import assert_bitwise_equal, assert_gemm_close, reference_gemm, with_every_code


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    return why_no_jit("the simt body is in no catalog, only the JIT builds it", "to build the simt body")


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

TILES = ("simt:8x64x16_w1x1_s1", "simt:3x64x16_w1x1_s1")
FORMATS = ("int4:g128", "uint4:g64:zp", "uint4:g128:zpf", "int8:channel", "int3:g64", "uint2:g32:zp", "int1:g64",
           "float4e2m1:g32", "float8e4m3:channel", "mxfp4", "nvfp4")
# (N, K): the minimum, then 3 units of N and a K of 5 x 128
SHAPES = ((64, 128), (192, 640))


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_simt_body_and_production_kernel_match_the_reference(fmt, act):
    if act is torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bfloat16 kernels need sm_80+")
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for n, k in SHAPES:
        if fmt.endswith(":g128") and k % 128 or ":g64" in fmt and k % 64:
            continue  # the group must divide K (both shapes are multiples of 128)
        w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
        packed = humming_aot.pack(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=act)
        w_round = packed.effective_weight(scales_in_fp32=False)  # what the simt body multiplies
        for m in (1, 5, 17):
            a = torch.randn(m, k, device="cuda", generator=gen).to(act)
            bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m != 1 else None
            context = f"fmt={fmt} act={act} m={m} n={n} k={k} seed={seed}"
            for tile in TILES:
                out = ops.gemm_with_tile(a, packed, tile, bias)
                assert out.shape == (m, n) and out.dtype == act, context
                assert_gemm_close(out, reference_gemm(a, w_round, bias), a=a, w_eff=w_round, bias=bias,
                                  context=f"{tile} {context}")
                assert_bitwise_equal(out, ops.gemm_with_tile(a, packed, tile, bias), f"{tile} {context}")
            key = kernel_obtain.select_key(ops.gemm_spec(packed), dispatch.device_info(torch.cuda.current_device()),
                                           m, k=k, group=packed.group_size, n=n)
            w_prod = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(ops.gemm(a, packed, bias), reference_gemm(a, w_prod, bias), a=a, w_eff=w_prod,
                              bias=bias, context=f"production {key.name} {context}")


def test_simt_body_refuses_split_k():
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(64, 128, device="cuda"), "int4:g128"))
    a = torch.randn(1, 128, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="sums all of K in one CTA; pass splits=None or 1"):
        ops.gemm_with_tile(a, packed, TILES[0], splits=2)
