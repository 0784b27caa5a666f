"""Mistakes a user can make with the public API on the CPU reference paths, each a clear error (or,
for an empty batch, an empty answer) instead of a raw exception from deep inside, a silently wrong
result or bits read as the wrong dtype (an audit's findings, log section 66)."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import humming_aot as ha
from humming_aot import moe, nn, ops


def _gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def test_a_float32_input_is_not_told_to_repack_for_float32():
    layer = nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128), "int4:g128")
    with pytest.raises(ValueError, match=r"cast a with a.to\(torch.bfloat16\)$"):
        layer(torch.randn(4, 256))
    with pytest.raises(ValueError, match=r"or pack the weight with act_dtype=torch.float16"):
        layer(torch.randn(4, 256).half())


@pytest.mark.parametrize("cast", ["half", "float", "to_float16"])
def test_a_cast_quantized_linear_keeps_its_packed_dtypes(cast):
    gen = _gen()
    linear = torch.nn.Linear(256, 128)
    linear.weight.data = torch.randn(128, 256, generator=gen) * 1e-6  # scales far below float16's normals
    layer = nn.QuantizedLinear.from_linear(linear, "int4:g128")
    x = torch.randn(4, 256, generator=gen).bfloat16()
    before = layer(x)
    cast_layer = layer.half() if cast == "half" else layer.float() if cast == "float" else layer.to(torch.float16)
    assert cast_layer.w_scale.dtype == cast_layer.bias.dtype == torch.bfloat16
    assert cast_layer.w.dtype == torch.int32 and cast_layer.packed_layout_version.dtype == torch.int32
    after = cast_layer(x)
    assert torch.equal(after, before)
    assert after.abs().max() > 0  # (the scales did not underflow to zero)


def test_gemm_refuses_a_packed_weight_whose_scales_were_cast():
    packed = ha.pack(ha.quantize(torch.randn(128, 256), "uint4:g128:zp"))
    cast = dataclasses.replace(packed, w_scale=packed.w_scale.half())
    with pytest.raises(ValueError, match="scales are torch.float16 but it was packed for torch.bfloat16"):
        ops.gemm(torch.randn(2, 256).bfloat16(), cast)
    cast = dataclasses.replace(packed, w_zero_point=packed.w_zero_point.float())
    with pytest.raises(ValueError, match="pack the weight again"):
        ops.gemm(torch.randn(2, 256).bfloat16(), cast)


@pytest.mark.parametrize("recipe", [("float8e4m3:channel", "float8e4m3:token"), ("int4:g128", "float8e4m3:token")])
def test_an_empty_batch_gets_an_empty_answer_with_quantized_activations(recipe):
    fmt, activations = recipe
    layer = nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128), fmt, activations=activations)
    out = layer(torch.randn(0, 256).bfloat16())
    assert out.shape == (0, 128) and out.dtype == torch.bfloat16
    assert layer(torch.randn(2, 0, 256).half()).shape == (2, 0, 128)
    with pytest.raises(ValueError):
        layer(torch.randn(0, 255).bfloat16())  # (the wrong K still says so)


def test_pack_takes_a_quantized_weight_not_a_float_tensor():
    with pytest.raises(TypeError, match="pack takes a humming_aot.quant.QuantizedWeight, got Tensor"):
        ha.pack(torch.randn(128, 256))
    with pytest.raises(TypeError, match="pack_experts takes a stacked humming_aot.quant.QuantizedWeight"):
        moe.pack_experts(torch.randn(2, 128, 256))


def test_pack_refuses_codes_and_zero_points_out_of_range_and_nan_codes():
    qw = ha.quantize(torch.randn(128, 256, generator=_gen()), "uint4:g128:zp")
    ha.pack(qw)  # (the quantizer's own codes pack)
    codes = qw.codes.clone()
    codes[3, 5] = 17
    with pytest.raises(ValueError, match=r"uint4 codes lie in \[0, 15\].*got values in \[0, 17\]"):
        ha.pack(dataclasses.replace(qw, codes=codes))
    zero_points = qw.zero_points.clone()
    zero_points.view(-1)[0] = 99
    with pytest.raises(ValueError, match=r"integer zero points of uint4 lie in \[0, 15\]"):
        ha.pack(dataclasses.replace(qw, zero_points=zero_points))
    fp8 = ha.quantize(torch.randn(128, 256), "float8e4m3:channel")
    for nan in (0x7F, 0xFF):
        codes = fp8.codes.clone()
        codes[1, 2] = nan
        with pytest.raises(ValueError, match=f"NaN encodings \\(e.g. {nan:#x}\\)"):
            ha.pack(dataclasses.replace(fp8, codes=codes))


def _experts():
    gen = _gen()
    return moe.pack_experts(ha.quantize(torch.randn(4, 128, 128, generator=gen) * 0.1, "int4:g64"))


def test_the_cpu_indexed_gemm_checks_what_the_kernel_checks():
    experts = _experts()
    topk_ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    routing = moe.align_block_size(topk_ids, 4, 8)
    a = torch.randn(3, 128).bfloat16()
    moe.gemm_indexed(a, experts, routing, a_rows_per_token=2, topk_weights=torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"topk_weights must be \(3, 2\) floating"):
        moe.gemm_indexed(a, experts, routing, a_rows_per_token=2, topk_weights=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"topk_weights must be \(3, 2\) floating"):
        moe.gemm_indexed(a, experts, routing, a_rows_per_token=2, topk_weights=torch.ones(3, 1))
    with pytest.raises(ValueError, match="a_rows_per_token must be the routing's top_k"):
        moe.gemm_indexed(torch.randn(2, 128).bfloat16(), experts, routing, a_rows_per_token=3)


def test_permute_unpermute_and_grouped_rows_check_their_shapes():
    experts = _experts()
    routing = moe.group_rows(torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32), 4)
    hidden = torch.randn(3, 128).bfloat16()
    rows = moe.permute(hidden, routing)
    assert rows.shape == (6, 128)
    with pytest.raises(ValueError, match=r"hidden must be \(3, K\), one row per token"):
        moe.permute(hidden[:2], routing)
    with pytest.raises(ValueError, match=r"hidden must be \(3, K\)"):
        moe.permute(hidden.reshape(1, 3, 128), routing)
    out = moe.gemm_grouped(rows, experts, offsets=routing.offsets)
    assert moe.unpermute(out, routing).shape == (3, 2, 128)
    with pytest.raises(ValueError, match=r"rows must be \(6, N\)"):
        moe.unpermute(out[:5], routing)
    with pytest.raises(ValueError, match=r"a must be \(R, 128\), the rows expert after expert"):
        moe.gemm_grouped(rows.reshape(2, 3, 128), experts, offsets=routing.offsets)
    with pytest.raises(ValueError, match="offsets and row_expert must be integer tensors"):
        moe.gemm_grouped(rows, experts, offsets=routing.offsets.float())


def test_quantized_moe_names_the_hidden_states_it_takes():
    gen = _gen()
    layer = nn.QuantizedMoE.from_experts(torch.randn(4, 128, 128, generator=gen),
                                         torch.randn(4, 128, 64, generator=gen), fmt="int4:g64")
    ids, weights = torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, 1)
    with pytest.raises(ValueError, match=r"hidden must be \(\.\.\., 128\) torch.bfloat16 .* got \(3, 128\) torch.float16"):
        layer(torch.randn(3, 128).half(), ids, weights)
    with pytest.raises(ValueError, match=r"hidden must be \(\.\.\., 128\) torch.bfloat16 .* got \(3, 64\)"):
        layer(torch.randn(3, 64).bfloat16(), ids, weights)
    assert layer(torch.randn(3, 128).bfloat16(), ids, weights).shape == (3, 128)


def test_arguments_that_would_be_ignored_are_refused():
    with pytest.raises(ValueError, match="with activations= the W8A8 layer .* leave it None"):
        nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128), "int4:g128", act_dtype=torch.float16,
                                       activations="float8e4m3:token")
    gen = _gen()
    gate_up = ha.quantize(torch.randn(4, 128, 128, generator=gen), "int4:g64")
    down = ha.quantize(torch.randn(4, 128, 64, generator=gen), "int4:g64")
    with pytest.raises(ValueError, match="every weight given is already quantized .* leave fmt None"):
        nn.QuantizedMoE.from_experts(gate_up, down, "float8e4m3:channel")
    nn.QuantizedMoE.from_experts(gate_up, torch.randn(4, 128, 64, generator=gen), "int4:g64")  # (fmt for the float one)


def test_routing_and_quantize_name_their_argument_mistakes():
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_experts must be an int of at least 1, got 4.0"):
        moe.group_rows(ids, 4.0)
    with pytest.raises(ValueError, match=r"topk_ids must be \(M, top_k\) int32 or int64 \(a tensor\), got list"):
        moe.group_rows([[0, 1], [2, 3]], 4)
    assert moe.group_rows(ids, 4).offsets.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"one \(N, K\) weight or stacked experts \(E, N, K\), got shape \(2, 2, 64, 128\)"):
        ha.quantize(torch.randn(2, 2, 64, 128), "int4:g64")


def test_meta_weights_and_a_string_scale_are_named():
    with pytest.raises(ValueError, match="w is on the meta device .* load the weights first"):
        ha.quantize(torch.empty(128, 256, device="meta"), "int4:g128")
    with pytest.raises(ValueError, match="w is on the meta device"):
        nn.QuantizedLinear.from_linear(torch.nn.Linear(256, 128, device="meta"), "int4:g128")
    x = torch.randn(2, 256)
    with pytest.raises(ValueError, match="static_scale must be a positive number or a one-element tensor, got str"):
        ops.quantize_activation(x, "float8e4m3:tensor", static_scale="2.0")
    given = ops.quantize_activation(x, "float8e4m3:tensor", static_scale=2.0)
    assert float(given.scales.reshape(-1)[0]) == 2.0
