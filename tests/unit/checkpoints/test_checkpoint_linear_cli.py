"""QuantizedLinear.from_checkpoint on the CPU reference path, and `humming-aot inspect`."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from ckpt_fixture_utils import fixture

from humming_aot import checkpoints, cli
from humming_aot.nn import QuantizedLinear

KPROJ = "model.layers.0.self_attn.k_proj"


@pytest.mark.parametrize("name,prefix", [
    ("gptq_4bit_actorder_v1", KPROJ), ("gptq_4bit_asym_v2", KPROJ), ("awq_gemm_4bit", KPROJ),
    ("ct_w4a16", "proj"), ("ct_nvfp4a16", "proj"), ("ct_fp8_block", "proj"), ("fp8_block_ue8m0", KPROJ),
    ("modelopt_int4_awq", "model.layers.0.self_attn.o_proj"), ("hqq_4bit_g64_axis1", "proj"),
    ("autoround_4bit_sym", KPROJ)])
def test_from_checkpoint_matches_the_layer_reference(name, prefix):
    linear = QuantizedLinear.from_checkpoint(fixture(name), prefix)
    layer = checkpoints.load_layer(fixture(name), prefix)
    act = linear.packed.act_dtype
    x = torch.randn(5, linear.in_features, generator=torch.Generator().manual_seed(0)).to(act)
    out = linear(x)
    # the exact operand the kernel multiplies (scales in the activation dtype), in file K order
    w = linear.packed.effective_weight()
    if layer.input_perm is not None:
        restored = torch.empty_like(w)
        restored[:, layer.input_perm] = w
        w = restored
    xs = x.to(torch.float64)
    if layer.input_scale is not None:
        xs = (x * layer.input_scale.to(act)).to(torch.float64)  # the module scales in act dtype
    expected = (xs @ w.T).to(act)
    assert out.dtype == act and out.shape == (5, linear.out_features)
    torch.testing.assert_close(out, expected, rtol=0, atol=float(expected.abs().max()) * 2**-9)
    # and the layer computes x @ W_ref^T, W_ref from the loader, within the act dtype's rounding
    ref = x.to(torch.float64) @ layer.reference_weight().to(torch.float64).T
    assert float((out.to(torch.float64) - ref).abs().max()) <= 0.02 * float(ref.abs().max()) + 1e-3


def test_from_checkpoint_refuses_stacked_experts():
    with pytest.raises(ValueError, match="MoE"):
        QuantizedLinear.from_checkpoint(fixture("gptoss_mxfp4"), "model.layers.0.mlp.experts.gate_up_proj")


def test_cli_inspect(capsys):
    assert cli.main(["inspect", str(fixture("gptq_4bit_actorder_v1")), "--arch", "sm90a"]) == 0
    out = capsys.readouterr().out
    assert KPROJ in out and "int4:g128:s=float16" in out and "128 x 256" in out and "act-order" in out
    assert cli.main(["inspect", str(fixture("ct_nvfp4a16")), "--arch", "sm90a", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["layers"]
    assert row["format"] == "nvfp4" and (row["n"], row["k"]) == (64, 256) and row["served"]


def test_cli_inspect_names_a_bad_directory(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gptq_4bit_sym_v1", "modelopt_int4_awq", "ct_nvfp4a16", "hqq_4bit_g64_axis1"])
def test_model_catalog_holds_exactly_the_kernels_the_layers_need(tmp_path, name):
    from humming_aot.aot.model_catalog import write_model_catalog
    from humming_aot.checkpoints.serving import layer_spec
    from humming_aot.enumerate import enumerate_catalog

    archs = ["sm89", "sm90a"]
    path = write_model_catalog(fixture(name), archs, tmp_path / "model.toml")
    needed = {layer_spec(checkpoints.load_layer(fixture(name), p))[0] for p in checkpoints.quantized_layers(fixture(name))}
    keys = enumerate_catalog(str(path), archs).keys
    assert keys and {k.spec for k in keys} == needed
    # every M bucket: the default catalog's kernels of these specs, no more, no fewer
    default = [k for k in enumerate_catalog("default", archs).keys if k.spec in needed]
    assert sorted(k.name for k in keys) == sorted(k.name for k in default)


def test_build_model_refuses_model_with_catalog(tmp_path, capsys):
    rc = cli.main(["build", "--arch", "sm90a", "--model", str(fixture("ct_w4a16")), "--catalog", "smoke",
                   "--out", str(tmp_path)])
    assert rc == 2 and "--model and --catalog" in capsys.readouterr().err


def test_build_model_names_a_layer_without_kernel(tmp_path, capsys):
    # gpt-oss's experts are bfloat16-scaled mxfp4: Turing (float16 only) serves none of its layers
    rc = cli.main(["build", "--arch", "sm75", "--model", str(fixture("gptoss_mxfp4")), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "gate_up_proj" in err and "which sm75 does not serve" in err


def test_model_catalog_of_stacked_experts_holds_the_grouped_moe_gemms_too(tmp_path):
    """gpt-oss's stacked MXFP4 experts: the dense kernels of their spec (QuantizedMoE's expert
    loop) and the grouped masked and contiguous ones (its grouped kernels), for every M bucket:
    exactly the default catalog's kernels of that spec (its dense and moe parts)."""
    from humming_aot.aot.model_catalog import write_model_catalog
    from humming_aot.enumerate import enumerate_catalog
    from humming_aot.spec import GemmType

    path = write_model_catalog(fixture("gptoss_mxfp4"), ["sm90a"], tmp_path / "model.toml")
    keys = enumerate_catalog(str(path), ["sm90a"]).keys
    assert {k.spec.gemm_type for k in keys} == {GemmType.DENSE, GemmType.MASKED, GemmType.GROUPED}
    specs = {k.spec for k in keys if k.spec.gemm_type is GemmType.DENSE}
    assert {k.spec.w_dtype for k in keys} == {"float4e2m1"}
    expected = [k for k in enumerate_catalog("default", ["sm90a"]).keys
                if dataclasses.replace(k.spec, gemm_type=GemmType.DENSE) in specs]
    assert {k.name for k in expected} == {k.name for catalog in ("dense", "moe")
                                          for k in enumerate_catalog(catalog, ["sm90a"]).keys
                                          if dataclasses.replace(k.spec, gemm_type=GemmType.DENSE) in specs}
    assert sorted(k.name for k in keys) == sorted(k.name for k in expected)


def test_build_model_passes_the_model_catalog_to_the_build(tmp_path, monkeypatch):
    from humming_aot.aot import wheel
    from humming_aot.enumerate import enumerate_catalog

    seen = {}

    def fake_build(*, archs, catalog, **kwargs):
        seen["keys"] = enumerate_catalog(catalog, archs).keys  # while the temporary catalog exists
        raise ValueError("stop after choosing the kernels")

    monkeypatch.setattr(wheel, "build", fake_build)
    rc = cli.main(["build", "--arch", "sm90a", "--model", str(fixture("gptq_4bit_sym_v1")), "--out", str(tmp_path)])
    assert rc == 2 and seen["keys"] and {k.spec.w_dtype for k in seen["keys"]} == {"int4"}
