"""The activation scheme a checkpoint's producer calibrated for (CheckpointLayer.activations) and
QuantizedLinear.from_checkpoint(..., activations=...) on the W8A8 layer, on the CPU reference path,
over the committed W8A8 fixtures (compressed-tensors W8A8 int8, FP8_DYNAMIC, FP8_BLOCK; fp8
DeepSeek-style blocks; ModelOpt FP8 static and per channel per token). Variants with a static
compressed-tensors scale and fused siblings are built here from those files, and say so."""
from __future__ import annotations

import json

import pytest
import torch
from ckpt_fixture_utils import copy_fixture, edit_tensors, fixture, tensors, write_tensors

from humming_aot import checkpoints, ops, w4a8, w8a8
from humming_aot.checkpoints.reader import CheckpointError
from humming_aot.formats import round_to
from humming_aot.nn import QuantizedLinear, W8A8Linear

KPROJ = "model.layers.0.self_attn.k_proj"
SCHEMES = [  # fixture, layer, its activations, whether the scheme has a static scale
    ("ct_w8a8", "proj", "int8:token", False),
    ("ct_fp8_dynamic", "proj", "float8e4m3:token", False),
    ("ct_fp8_block", "proj", "float8e4m3:g128", False),
    ("fp8_block_float", KPROJ, "float8e4m3:g128", False),
    ("modelopt_fp8_default", KPROJ, "float8e4m3:tensor", True),
    ("modelopt_fp8_per_channel_per_token", KPROJ, "float8e4m3:token", False),
]


@pytest.mark.parametrize("name,prefix,fmt,static", SCHEMES)
def test_the_checkpoint_scheme_runs_the_w8a8_layer_exactly(name, prefix, fmt, static):
    layer = checkpoints.load_layer(fixture(name), prefix)
    assert layer.activations is not None and layer.activations.format == fmt
    assert (layer.activations.static_scale is not None) == static
    linear = QuantizedLinear.from_checkpoint(fixture(name), prefix, activations="checkpoint")
    assert isinstance(linear, W8A8Linear) and linear.activations == fmt
    x = torch.randn(2, 3, linear.in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = linear(x)
    # the exact product of the operands the kernel sees: the input quantized by the scheme (its
    # static scale included), the checkpoint's codes and scales
    qa = ops.quantize_activation(x, fmt, static_scale=layer.activations.static_scale)
    packed = w8a8.pack(layer.weight)
    expected = w8a8.reference(qa, packed)
    if layer.bias is not None:
        expected = expected + layer.bias.to(torch.bfloat16).double()
    assert torch.equal(y.reshape(6, -1), round_to(expected, torch.bfloat16))
    # and it approximates the float layer the producer quantized
    ref = x.double().reshape(6, -1) @ layer.reference_weight().double().T
    if layer.bias is not None:
        ref = ref + layer.bias.double()
    rel = ((y.reshape(6, -1).double() - ref).norm() / ref.norm()).item()
    assert rel < 0.06, rel


def test_weight_only_and_kernel_less_schemes_say_what_to_do():
    with pytest.raises(ValueError, match="quantizes no activations: the checkpoint is weight-only"):
        QuantizedLinear.from_checkpoint(fixture("ct_w4a16"), "proj", activations="checkpoint")
    assert checkpoints.load_layer(fixture("ct_w4a16"), "proj").activations is None
    with pytest.raises(ValueError, match="NVFP4 .* which no humming_aot kernel takes yet"):
        QuantizedLinear.from_checkpoint(fixture("modelopt_nvfp4_default"), KPROJ, activations="checkpoint")
    # the default stays 16-bit, whatever the checkpoint calibrated
    assert isinstance(QuantizedLinear.from_checkpoint(fixture("ct_fp8_dynamic"), "proj"), QuantizedLinear)
    # a named format runs dynamically; one the weight cannot take is refused with the layer named
    named = QuantizedLinear.from_checkpoint(fixture("ct_fp8_dynamic"), "proj", activations="float8e4m3:tensor")
    assert named.activations == "float8e4m3:tensor" and named.static_scale is None
    with pytest.raises(ValueError, match="do not suit weights float8e4m3:channel"):
        QuantizedLinear.from_checkpoint(fixture("ct_fp8_dynamic"), "proj", activations="int8:token")
    # a weight-only int4:g128 checkpoint runs as W4A8 with its inputs quantized dynamically
    w4 = QuantizedLinear.from_checkpoint(fixture("ct_w4a16"), "proj", activations="float8e4m3:token")
    assert isinstance(w4, W8A8Linear) and isinstance(w4.packed, w4a8.PackedW4A8Weight)
    x = torch.randn(3, w4.in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    layer = checkpoints.load_layer(fixture("ct_w4a16"), "proj")
    bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
    expected = w4a8.gemm(ops.quantize_activation(x, "float8e4m3:token"), w4a8.pack(layer.weight), bias=bias)
    assert torch.equal(w4(x), expected)
    # and with int8 activations on the portable body (int4 x int8: mma-w4a8)
    w4_int8 = QuantizedLinear.from_checkpoint(fixture("ct_w4a16"), "proj", activations="int8:token")
    expected = w4a8.gemm(ops.quantize_activation(x, "int8:token"), w4a8.pack(layer.weight), bias=bias)
    assert w4_int8.activations == "int8:token" and torch.equal(w4_int8(x), expected)
    with pytest.raises(ValueError, match="do not suit weights int4:g128"):
        QuantizedLinear.from_checkpoint(fixture("ct_w4a16"), "proj", activations="float8e4m3:g128")
    # int4 with zero points (uint4:g128:zp) on the W4A8 kernels, both activation elements
    asym = checkpoints.load_layer(fixture("ct_w4a16_asym"), "proj")
    asym_bias = None if asym.bias is None else asym.bias.to(torch.bfloat16)
    for act in ("float8e4m3:token", "int8:token"):
        layer_u4 = QuantizedLinear.from_checkpoint(fixture("ct_w4a16_asym"), "proj", activations=act)
        assert layer_u4.packed.element == "uint4"
        expected = w4a8.gemm(ops.quantize_activation(x, act), w4a8.pack(asym.weight), bias=asym_bias)
        assert torch.equal(layer_u4(x), expected)
    # a weight no 8-bit-activation kernel takes (float zero points per 64) is refused with the layer named
    with pytest.raises(ValueError, match="from_checkpoint: layer 'proj': the W4A8 kernels take symmetric int4"):
        QuantizedLinear.from_checkpoint(fixture("hqq_4bit_g64_axis1"), "proj", activations="float8e4m3:token")
    with pytest.raises(ValueError, match="act_dtype chooses the 16-bit activations' dtype"):
        QuantizedLinear.from_checkpoint(fixture("ct_fp8_dynamic"), "proj", act_dtype=torch.float16,
                                        activations="checkpoint")


def test_a_static_compressed_tensors_scheme_reads_its_input_scale(tmp_path):
    # variant built here: ct_fp8_dynamic's activations made static per tensor, with an input_scale
    model = copy_fixture("ct_fp8_dynamic", tmp_path)
    config = json.loads((model / "config.json").read_text())
    acts = config["quantization_config"]["config_groups"]["group_0"]["input_activations"]
    acts.update(strategy="tensor", dynamic=False)
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="proj.input_scale"):
        checkpoints.load_layer(model, "proj")
    edit_tensors(model, proj__input_scale=torch.tensor([0.02], dtype=torch.bfloat16))
    layer = checkpoints.load_layer(model, "proj")
    assert layer.activations.format == "float8e4m3:tensor" and layer.activations.description.endswith("static, symmetric")
    assert float(layer.activations.static_scale) == float(torch.tensor(0.02, dtype=torch.bfloat16))
    linear = QuantizedLinear.from_checkpoint(model, "proj", activations="checkpoint")
    assert "static_scale=0.0200195" in repr(linear)
    acts.update(symmetric=False)
    (model / "config.json").write_text(json.dumps(config))
    layer = checkpoints.load_layer(model, "proj")
    assert layer.activations.format is None and "asymmetric" in layer.activations.description


def test_fused_siblings_share_the_largest_static_scale(tmp_path):
    # variant built here: ModelOpt FP8's k_proj copied as v_proj with twice its input_scale
    model = copy_fixture("modelopt_fp8_default", tmp_path)
    data = tensors(model)
    vproj = "model.layers.0.self_attn.v_proj"
    for key in [k for k in data if k.startswith(KPROJ + ".")]:
        data[vproj + key[len(KPROJ):]] = data[key].clone()
    data[vproj + ".input_scale"] = data[KPROJ + ".input_scale"] * 2
    from ckpt_fixture_utils import write_tensors

    write_tensors(model, data)
    fused = checkpoints.load_fused(model, [KPROJ, vproj])
    assert torch.equal(fused.activations.static_scale, data[vproj + ".input_scale"].reshape(()).float())
    rows = checkpoints.inspect(model)
    assert {r.activations for r in rows} == {"float8e4m3:tensor"}


def test_inspect_names_each_layers_activations():
    assert [r.activations for r in checkpoints.inspect(fixture("ct_w8a8"))] == ["int8:token"]
    assert [r.activations for r in checkpoints.inspect(fixture("ct_w4a16"))] == [None]
    (row,) = checkpoints.inspect(fixture("modelopt_nvfp4_default"))[:1]
    assert row.activations.endswith("(no kernel)")


def test_inspect_says_whether_the_w8a8_path_serves_an_arch():
    (row,) = checkpoints.inspect(fixture("ct_w8a8"), arch="sm90a")
    assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT")
    # the portable mma-ss body serves int8 W8A8 from sm80 (the default catalog precompiles it)
    (row,) = checkpoints.inspect(fixture("ct_w8a8"), arch="sm89")
    assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT")
    (row,) = checkpoints.inspect(fixture("ct_w8a8"), arch="sm75")
    assert row.served_w8a8.startswith("no: pairing 'w8a8_int8_channel'") and "not on sm75" in row.served_w8a8
    (row,) = checkpoints.inspect(fixture("ct_w4a16"), arch="sm90a")
    assert row.served_w8a8 is None and row.served is not None
    row = checkpoints.inspect(fixture("modelopt_nvfp4_default"), arch="sm90a")[0]
    assert row.served_w8a8.startswith("no: no kernel takes NVFP4")


def test_cli_inspect_prints_the_activations_and_the_w8a8_path(capsys):
    from humming_aot import cli

    assert cli.main(["inspect", str(fixture("ct_fp8_dynamic")), "--arch", "sm86"]) == 0
    out = capsys.readouterr().out
    assert "activations float8e4m3:token" in out and "with its activations quantized (W8A8): no: pairing" in out


def test_an_int4_checkpoint_with_float8_token_activations_is_served_as_w4a8(tmp_path):
    # variant built here: ct_w4a16 with compressed-tensors' dynamic float8 per-token input_activations
    # (the W4A8-FP8 scheme)
    model = copy_fixture("ct_w4a16", tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    (model / "config.json").write_text(json.dumps(config))
    layer = checkpoints.load_layer(model, "proj")
    assert layer.activations.format == "float8e4m3:token"
    (row,) = checkpoints.inspect(model, arch="sm90a")
    assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT"), row.served_w8a8
    (row,) = checkpoints.inspect(model, arch="sm89")  # the portable mma-w4a8 body
    assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT"), row.served_w8a8
    (row,) = checkpoints.inspect(model, arch="sm86")
    assert row.served_w8a8.startswith("no: pairing 'w4a8_int4_float8'") and "not on sm86" in row.served_w8a8
    linear = QuantizedLinear.from_checkpoint(model, "proj", activations="checkpoint")
    assert isinstance(linear, W8A8Linear) and isinstance(linear.packed, w4a8.PackedW4A8Weight)
    assert linear.activations == "float8e4m3:token"


def test_an_int4_checkpoint_with_int8_token_activations_is_served_as_int4_x_int8(tmp_path):
    # variant built here: ct_w4a16 with compressed-tensors' dynamic int8 per-token input_activations
    # (the W4A8 int scheme), served by the portable mma-w4a8 body from sm80 on
    model = copy_fixture("ct_w4a16", tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}
    (model / "config.json").write_text(json.dumps(config))
    layer = checkpoints.load_layer(model, "proj")
    assert layer.activations.format == "int8:token"
    for arch in ("sm80", "sm89", "sm90a"):
        (row,) = checkpoints.inspect(model, arch=arch)
        assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT"), (arch, row.served_w8a8)
    (row,) = checkpoints.inspect(model, arch="sm75")
    assert row.served_w8a8.startswith("no: pairing 'w4a8_int4_int8'") and "not on sm75" in row.served_w8a8
    linear = QuantizedLinear.from_checkpoint(model, "proj", activations="checkpoint")
    assert isinstance(linear, W8A8Linear) and isinstance(linear.packed, w4a8.PackedW4A8Weight)
    assert linear.activations == "int8:token"
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
    expected = w4a8.gemm(ops.quantize_activation(x, "int8:token"), w4a8.pack(layer.weight), bias=bias)
    assert torch.equal(linear(x), expected)


def test_an_mxfp4_checkpoint_with_float8_token_activations_is_served_as_w4a8(tmp_path):
    # variant built here: ct_mxfp4a16 with compressed-tensors' dynamic float8 per-token
    # input_activations (MXFP4 weights x float8: the wgmma-w4a8 body on sm90a, mma-w4a8 from sm89)
    model = copy_fixture("ct_mxfp4a16", tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    (model / "config.json").write_text(json.dumps(config))
    (row,) = checkpoints.inspect(model)[:1]
    prefix = row.prefix
    layer = checkpoints.load_layer(model, prefix)
    assert layer.activations.format == "float8e4m3:token"
    for arch in ("sm89", "sm90a", "sm120"):
        row = next(r for r in checkpoints.inspect(model, arch=arch) if r.prefix == prefix)
        assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT"), (arch, row.served_w8a8)
    row = next(r for r in checkpoints.inspect(model, arch="sm86") if r.prefix == prefix)
    assert row.served_w8a8.startswith("no: pairing 'w4a8_mxfp4_float8'") and "not on sm86" in row.served_w8a8
    linear = QuantizedLinear.from_checkpoint(model, prefix, activations="checkpoint")
    assert isinstance(linear, W8A8Linear) and linear.packed.element == w4a8.MXFP4_ELEMENT
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
    expected = w4a8.gemm(ops.quantize_activation(x, "float8e4m3:token"), w4a8.pack(layer.weight), bias=bias)
    assert torch.equal(linear(x), expected)


def test_an_int4_checkpoint_with_int4_token_activations_is_served_as_w4a4(tmp_path):
    # variant built here: ct_w4a16 with compressed-tensors' dynamic int4 per-token input_activations,
    # its weights per channel (W4A4 takes channel scales: the mma-ss body from sm80)
    model = copy_fixture("ct_w4a16", tmp_path)
    config = json.loads((model / "config.json").read_text())
    group = config["quantization_config"]["config_groups"]["group_0"]
    group["input_activations"] = {"num_bits": 4, "type": "int", "strategy": "token", "dynamic": True,
                                  "symmetric": True}
    (model / "config.json").write_text(json.dumps(config))
    layer = checkpoints.load_layer(model, "proj")
    assert layer.activations.format == "int4:token"
    (row,) = checkpoints.inspect(model, arch="sm90a")  # groups of K: the W4A4 kernels refuse them
    assert row.served_w8a8.startswith("no: the W8A8 kernels take") and "'int4:channel'" in row.served_w8a8
    group["weights"].update(strategy="channel", group_size=None)
    (model / "config.json").write_text(json.dumps(config))
    data = tensors(model)
    data["proj.weight_scale"] = data["proj.weight_scale"][:, :1].contiguous()
    write_tensors(model, data)
    layer = checkpoints.load_layer(model, "proj")
    for arch in ("sm80", "sm89", "sm90a"):
        (row,) = checkpoints.inspect(model, arch=arch)
        assert row.served_w8a8 == "catalog" or row.served_w8a8.startswith("JIT"), (arch, row.served_w8a8)
    (row,) = checkpoints.inspect(model, arch="sm75")
    assert row.served_w8a8.startswith("no: pairing 'w4a4_int4_int4'") and "not on sm75" in row.served_w8a8
    linear = QuantizedLinear.from_checkpoint(model, "proj", activations="checkpoint")
    assert isinstance(linear, W8A8Linear) and isinstance(linear.packed, w8a8.PackedW8A8Weight)
    assert linear.packed.element == "int4" and linear.activations == "int4:token"
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
    expected = w8a8.gemm(ops.quantize_activation(x, "int4:token"), w8a8.pack(layer.weight), bias=bias)
    assert torch.equal(linear(x), expected)
