"""Malformed checkpoints: each case breaks one thing in a copy of a committed fixture, and the
loader must raise CheckpointError naming the file and the tensor (or config key) at fault."""
from __future__ import annotations

import json

import pytest
import torch
from ckpt_fixture_utils import copy_fixture, edit_config, edit_tensors, tensors

from humming_aot import checkpoints

KPROJ = "model.layers.0.self_attn.k_proj"
K_ = KPROJ.replace(".", "__")


def _truncate(model):
    path = model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _bad_header(model):
    path = model / "model.safetensors"
    path.write_bytes((10**9).to_bytes(8, "little") + path.read_bytes()[8:])


def _index_names_missing_shard(model):
    names = sorted(tensors(model))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: "model-00002-of-00002.safetensors" for n in names}}))


def _index_not_json(model):
    (model / "model.safetensors.index.json").write_text("{not json")


def _no_config(model):
    (model / "config.json").unlink()


# (fixture, prefix, how to break it, text the error must contain besides the file name)
CASES = {
    "gptq missing scales": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_tensors(m, **{K_ + "__scales": None}),
                            KPROJ + ".scales"),
    "gptq missing qzeros": ("gptq_4bit_asym_v1", KPROJ, lambda m: edit_tensors(m, **{K_ + "__qzeros": None}),
                            KPROJ + ".qzeros"),
    "gptq qweight float": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__qweight": tensors(m)[KPROJ + ".qweight"].float()}), KPROJ + ".qweight"),
    "gptq scales wrong shape": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__scales": tensors(m)[KPROJ + ".scales"][:, :64]}), KPROJ + ".scales"),
    "gptq g_idx not groups": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__g_idx": torch.zeros(256, dtype=torch.int32).index_fill_(0, torch.tensor([0]), 1)}),
        KPROJ + ".g_idx"),
    "gptq 5 bits": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_config(m, bits=5), "'bits'"),
    "unknown quant_method": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_config(m, quant_method="bitsandbytes"),
                             "'quant_method'"),
    "missing quant_method": ("gptq_4bit_sym_v1", KPROJ, lambda m: edit_config(m, quant_method=None), "quant_method"),
    "truncated safetensors": ("gptq_4bit_sym_v1", KPROJ, _truncate, "truncated"),
    "header past the end": ("gptq_4bit_sym_v1", KPROJ, _bad_header, "truncated"),
    "index names a missing shard": ("gptq_4bit_sym_v1", KPROJ, _index_names_missing_shard,
                                    "model-00002-of-00002.safetensors"),
    "index not json": ("gptq_4bit_sym_v1", KPROJ, _index_not_json, "not valid JSON"),
    "no config.json": ("gptq_4bit_sym_v1", KPROJ, _no_config, "config.json"),
    "awq qzeros wrong dtype": ("awq_gemm_4bit", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__qzeros": tensors(m)[KPROJ + ".qzeros"].to(torch.int64)}), KPROJ + ".qzeros"),
    "ct missing weight_shape": ("ct_w4a16", "proj", lambda m: edit_tensors(m, proj__weight_shape=None),
                                "proj.weight_shape"),
    "ct weight_packed word count": ("ct_w4a16", "proj", lambda m: edit_tensors(
        m, proj__weight_packed=tensors(m)["proj.weight_packed"][:, :-1]), "proj.weight_packed"),
    "ct int32 weight under float-quantized": ("ct_fp8_dynamic", "proj", lambda m: edit_tensors(
        m, proj__weight=torch.zeros(64, 256, dtype=torch.int32)), "proj.weight"),
    "ct nvfp4 scale not e4m3": ("ct_nvfp4a16", "proj", lambda m: edit_tensors(
        m, proj__weight_scale=tensors(m)["proj.weight_scale"].to(torch.bfloat16)), "proj.weight_scale"),
    "ct nvfp4 missing global scale": ("ct_nvfp4a16", "proj", lambda m: edit_tensors(
        m, proj__weight_global_scale=None), "proj.weight_global_scale"),
    "ct negative scale": ("ct_w4a16", "proj", lambda m: edit_tensors(
        m, proj__weight_scale=-tensors(m)["proj.weight_scale"]), "proj.weight_scale"),
    "ct no group matches": ("ct_w4a16", "proj", lambda m: edit_config(m, config_groups={
        "group_0": {"targets": ["re:.*gate_proj"], "weights": {"num_bits": 4}}}), "config_groups"),
    "fp8 scale_inv wrong shape": ("fp8_block_float", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__weight_scale_inv": torch.ones(2, 2)}), KPROJ + ".weight_scale_inv"),
    "fp8 weight bf16": ("fp8_block_float", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__weight": torch.zeros(128, 256, dtype=torch.bfloat16)}), KPROJ + ".weight"),
    "mxfp4 NaN scale": ("gptoss_mxfp4", "model.layers.0.mlp.experts.gate_up_proj", lambda m: edit_tensors(
        m, model__layers__0__mlp__experts__gate_up_proj_scales=torch.full((2, 64, 8), 255, dtype=torch.uint8)),
        "gate_up_proj_scales"),
    "mxfp4 missing scales": ("gptoss_mxfp4", "model.layers.0.mlp.experts.gate_up_proj", lambda m: edit_tensors(
        m, model__layers__0__mlp__experts__gate_up_proj_scales=None), "gate_up_proj_scales"),
    "modelopt scale_2 not scalar": ("modelopt_nvfp4_default", KPROJ, lambda m: edit_tensors(
        m, **{K_ + "__weight_scale_2": torch.ones(3)}), KPROJ + ".weight_scale_2"),
    "hqq W_q wrong shape": ("hqq_4bit_g64_axis1", "proj", lambda m: edit_tensors(
        m, proj__W_q=tensors(m)["proj.W_q"][:-1]), "proj.W_q"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_checkpoint_is_named(tmp_path, case):
    name, prefix, breaker, needle = CASES[case]
    model = copy_fixture(name, tmp_path)
    breaker(model)
    with pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.load_layer(model, prefix)
    message = str(info.value)
    assert needle in message, f"{case}: {message}"
    assert str(model) in message, f"{case}: the error does not name the file or directory: {message}"


def test_inspect_lists_a_broken_layer_with_its_error(tmp_path):
    model = copy_fixture("gptq_4bit_sym_v1", tmp_path)
    edit_tensors(model, **{K_ + "__scales": None})
    (row,) = checkpoints.inspect(model)
    assert row.prefix == KPROJ and KPROJ + ".scales" in row.error
