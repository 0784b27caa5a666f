"""Kernel parity on the committed checkpoint fixtures (tests/fixtures/checkpoints): one layer of
each schema through ``QuantizedLinear.from_checkpoint`` on the GPU, at M = 1 and 1024, against

1. ``reference_gemm`` of exactly the operands the kernel reads (the gathered / pre-scaled
   activations and ``ops.effective_weight``), within ``assert_gemm_close``'s kernel tolerance, and
2. ``x @ W_ref^T`` with ``W_ref = CheckpointLayer.reference_weight()`` (the loader's dequantization
   in the file's K order): the effective weight, un-permuted, equals W_ref elementwise up to the
   kernel's rounding to the activation dtype (2^-7 relative), and so does the output.

GPTQ act-order is included (its activations are gathered with ``input_perm``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from humming_aot import checkpoints, ops
from humming_aot.nn import QuantizedLinear
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
KPROJ = "model.layers.0.self_attn.k_proj"
CASES = (
    ("gptq_4bit_actorder_v1", KPROJ), ("gptq_4bit_asym_v1", KPROJ), ("gptq_3bit_sym_v1", KPROJ),
    ("gptq_8bit_sym_v1", KPROJ), ("awq_gemm_4bit", KPROJ), ("autoround_4bit_sym", KPROJ),
    ("autoround_4bit_asym", KPROJ), ("ct_w4a16", "proj"), ("ct_w4a16_asym", "proj"), ("ct_w8a8", "proj"),
    ("ct_fp8_block", "proj"), ("ct_nvfp4a16", "proj"), ("ct_mxfp4a16", "proj"), ("fp8_block_float", KPROJ),
    ("fp8_block_ue8m0", KPROJ), ("modelopt_fp8_default", KPROJ), ("modelopt_nvfp4_default", KPROJ),
    ("modelopt_int4_awq", "model.layers.0.self_attn.o_proj"), ("modelopt_mxfp4_default", KPROJ),
    ("modelopt_mxfp8_default", KPROJ), ("hqq_4bit_g64_axis1", "proj"),
)


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize("m", (1, 1024))
@pytest.mark.parametrize("name,prefix", CASES, ids=[c[0] for c in CASES])
def test_from_checkpoint_on_gpu_matches_reference(name, prefix, m):
    seed = _seed()
    context = (f"fixture {name} layer {prefix} M={m} seed={seed}; repro: pytest "
               f"'tests/gpu/test_checkpoints_gpu.py::test_from_checkpoint_on_gpu_matches_reference'")
    layer = checkpoints.load_layer(FIXTURES / name, prefix)
    linear = QuantizedLinear.from_checkpoint(FIXTURES / name, prefix, device="cuda")
    packed = linear.packed
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, linear.in_features, generator=gen, device="cuda").to(packed.act_dtype)
    out = linear(x)
    assert out.shape == (m, linear.out_features) and out.dtype == packed.act_dtype, context

    # 1. the kernel against exactly what it multiplies
    a = x
    if linear.input_perm is not None:
        a = a.index_select(-1, linear.input_perm)
    if linear.input_scale is not None:
        a = a * linear.input_scale
    w_eff = ops.effective_weight(packed, m)
    ref = reference_gemm(a, w_eff, None)
    assert_gemm_close(out, ref, a=a, w_eff=w_eff, context=context)
    assert torch.equal(linear(x), out), f"two runs differ: {context}"

    # 2. the effective weight is the loader's W_ref (file K order, pre_quant_scale folded), up to
    # the kernel's rounding of scales and dequantized weights to the activation dtype
    w_file = w_eff.to(torch.float64)
    if layer.input_perm is not None:
        restored = torch.empty_like(w_file)
        restored[:, layer.input_perm.cuda()] = w_file
        w_file = restored
    if layer.input_scale is not None:
        w_file = w_file * layer.input_scale.to(device="cuda", dtype=packed.act_dtype).to(torch.float64)
    w_ref = layer.reference_weight().to(device="cuda", dtype=torch.float64)
    bad = (w_file - w_ref).abs() > 2**-7 * w_ref.abs() + 1e-6 * float(w_ref.abs().max())
    assert not bool(bad.any()), f"effective weight differs from W_ref at {int(bad.sum())} elements: {context}"
    out_ref = x.to(torch.float64) @ w_ref.T
    err = float((out.to(torch.float64) - out_ref).abs().max())
    assert err <= 2**-6 * float(out_ref.abs().max()) + 1e-3, f"x @ W_ref^T differs by {err:g}: {context}"
