"""The round-trip checks of docs/CHECKPOINTS.md ("What a loader must pass"), on the committed
producer fixtures and on small variants of them written here."""
from __future__ import annotations

import pytest
import torch
from ckpt_fixture_utils import copy_fixture, edit_config, edit_tensors, fixture, reference, tensors, write_tensors

from humming_aot import checkpoints
from humming_aot.checkpoints.awq import unpack_awq
from humming_aot.checkpoints.bitstream import unpack_bitstream
from humming_aot.checkpoints.mxfp4 import decode_blocks
from humming_aot.quant import dequantize

KPROJ = "model.layers.0.self_attn.k_proj"
GPTQ_FIXTURES = ("gptq_4bit_sym_v1", "gptq_4bit_asym_v1", "gptq_4bit_asym_v2", "gptq_4bit_actorder_v1",
                 "gptq_3bit_sym_v1", "gptq_2bit_asym_v1", "gptq_8bit_sym_v1")


def _rel_error(w: torch.Tensor, original: torch.Tensor) -> float:
    o = original.to(torch.float64)
    return float((w.to(torch.float64) - o).norm() / o.norm())


def _words(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


# ---------------------------------------------------------------------------------- 3. GPTQ v1 / v2
def test_gptq_asym_v1_and_v2_decode_to_the_same_weight():
    v1 = checkpoints.load_layer(fixture("gptq_4bit_asym_v1"), KPROJ)
    v2 = checkpoints.load_layer(fixture("gptq_4bit_asym_v2"), KPROJ)
    assert torch.equal(dequantize(v1.weight), dequantize(v2.weight))
    raw1 = tensors(fixture("gptq_4bit_asym_v1"))[KPROJ + ".qzeros"]
    raw2 = tensors(fixture("gptq_4bit_asym_v2"))[KPROJ + ".qzeros"]
    assert not torch.equal(raw1, raw2)  # the files differ by the "minus one"


def test_gptq_v1_zero_of_zero_needs_the_word_wise_add(tmp_path):
    """True zeros [0, 5, 8, 8, 8, 8, 8, 8] are stored (v1) as the word minus 0x11111111, which
    borrows from field 1: a per-field +1 would decode field 1 as 4 + 1 = 5... and field 0 as 0."""
    model = copy_fixture("gptq_4bit_asym_v2", tmp_path)
    data = tensors(model)
    n = data[KPROJ + ".scales"].shape[1]
    true_zeros = torch.full((2, n), 8, dtype=torch.int64)
    true_zeros[:, 0], true_zeros[:, 1] = 0, 5
    v2_words = [sum(int(true_zeros[g, 8 * c + i]) << (4 * i) for i in range(8)) for g in range(2) for c in range(n // 8)]
    v1_words = [(w - 0x11111111) % (1 << 32) for w in v2_words]
    assert v1_words[0] & 0xFF == 0x3F  # field 0 became 0xF and borrowed from field 1 (5 -> 3)
    data[KPROJ + ".qzeros"] = _words(v1_words).reshape(2, n // 8)
    write_tensors(model, data)
    edit_config(model, checkpoint_format="gptq", format="gptq")
    qw = checkpoints.load_layer(model, KPROJ).weight
    assert torch.equal(qw.zero_points.t().to(torch.int64), true_zeros)
    per_field = (unpack_bitstream(_words(v1_words[:1]), 4, 8).to(torch.int64) + 1) & 0xF
    assert per_field[:2].tolist() != [0, 5]  # the naive decode is wrong for this word


def test_gptq_sym_implicit_zero_point_equals_the_stored_one():
    layer = checkpoints.load_layer(fixture("gptq_4bit_sym_v1"), KPROJ)
    assert layer.weight.format.element == "int4" and layer.weight.zero_points is None
    raw = tensors(fixture("gptq_4bit_sym_v1"))[KPROJ + ".qzeros"]
    assert bool((raw == 0x77777777).all())  # 8 - 1 in every field


# ---------------------------------------------------------------------------------- 4. act-order
def test_actorder_permutes_k_and_reports_the_activation_gather():
    layer = checkpoints.load_layer(fixture("gptq_4bit_actorder_v1"), KPROJ)
    g_idx = tensors(fixture("gptq_4bit_actorder_v1"))[KPROJ + ".g_idx"].to(torch.int64)
    assert not torch.equal(g_idx, torch.arange(g_idx.numel()) // 128)
    assert layer.input_perm is not None and torch.equal(g_idx[layer.input_perm], torch.sort(g_idx).values)
    with pytest.raises(checkpoints.CheckpointError, match="act-order"):
        checkpoints.load(fixture("gptq_4bit_actorder_v1"), KPROJ)
    x = torch.randn(3, g_idx.numel(), dtype=torch.float64)
    w_file_order = reference("gptq_4bit_actorder_v1")[KPROJ].to(torch.float64)
    permuted = dequantize(layer.weight).to(torch.float16).to(torch.float64)  # in the reference's dtype
    assert torch.allclose(x[:, layer.input_perm] @ permuted.T, x @ w_file_order.T, rtol=0, atol=1e-9)


def test_plain_g_idx_with_desc_act_true_is_plain_grouping(tmp_path):
    model = copy_fixture("gptq_4bit_sym_v1", tmp_path)
    edit_config(model, desc_act=True)
    assert checkpoints.load_layer(model, KPROJ).input_perm is None


def test_missing_g_idx_is_accepted(tmp_path):
    model = copy_fixture("gptq_4bit_sym_v1", tmp_path)
    edit_tensors(model, **{KPROJ.replace(".", "__") + "__g_idx": None})
    with_g_idx = checkpoints.load(fixture("gptq_4bit_sym_v1"), KPROJ)
    assert torch.equal(dequantize(checkpoints.load(model, KPROJ)), dequantize(with_g_idx))


# --------------------------------------------------------------------------- 5. 3-bit and odd widths
def test_three_bit_gptq_and_ct_share_one_bitstream():
    for name, prefix in (("gptq_3bit_sym_v1", KPROJ), ("ct_w3a16", "proj")):
        qw = checkpoints.load(fixture(name), prefix)
        assert qw.format.element == "int3"


def test_ct_padded_three_bit_layout_is_detected(tmp_path):
    model = copy_fixture("ct_w3a16", tmp_path)
    data = tensors(model)
    n, k = data["proj.weight_shape"].tolist()
    codes = unpack_bitstream(data["proj.weight_packed"], 3, k).to(torch.int64)  # (N, K) offset codes
    padded = torch.zeros(n, -(-k // 10), dtype=torch.int64)
    for j in range(k):
        padded[:, j // 10] |= codes[:, j] << (3 * (j % 10))
    data["proj.weight_packed"] = padded.to(torch.int32)
    write_tensors(model, data)
    assert torch.equal(dequantize(checkpoints.load(model, "proj")), dequantize(checkpoints.load(fixture("ct_w3a16"),
                                                                                                "proj")))


@pytest.mark.parametrize("bits,fmt", [(5, "gptq"), (6, "gptq"), (3, "gptq_p")])
def test_planar_gptq_is_refused(tmp_path, bits, fmt):
    model = copy_fixture("gptq_3bit_sym_v1", tmp_path)
    edit_config(model, bits=bits, format=fmt, checkpoint_format=fmt)
    with pytest.raises(checkpoints.CheckpointError, match="planar|checkpoint_format"):
        checkpoints.load_layer(model, KPROJ)


# ------------------------------------------------------------------------------- 6. AWQ interleave
def test_awq_interleave_order():
    n = 16
    codes = torch.arange(n) % 16  # column c holds code c
    order = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column 8w + order[i]
    words = [sum(int(codes[8 * w + order[i]]) << (4 * i) for i in range(8)) for w in range(n // 8)]
    assert unpack_awq(_words(words).reshape(1, -1)).tolist() == [codes.tolist()]


def test_awq_zero_point_false_and_gemv_are_refused(tmp_path):
    model = copy_fixture("awq_gemm_4bit", tmp_path)
    edit_config(model, zero_point=False)
    with pytest.raises(checkpoints.CheckpointError, match="'zero_point'"):
        checkpoints.load_layer(model, KPROJ)
    edit_config(model, zero_point=True, version="gemv_fast")
    with pytest.raises(checkpoints.CheckpointError, match="'version'.*gemv_fast"):
        checkpoints.load_layer(model, KPROJ)


# ---------------------------------------------------------------------------- 7. scale direction
BANDS = {"int4": 0.15, "fp8": 0.03, "nvfp4": 0.11, "mxfp4": 0.13}


@pytest.mark.parametrize("name,prefix,band", [
    ("ct_nvfp4a16", "proj", "nvfp4"), ("ct_mxfp4a16", "proj", "mxfp4"), ("ct_w4a16", "proj", "int4"),
    ("fp8_block_float", KPROJ, "fp8"), ("hqq_4bit_g64_axis1", "proj", "int4"), ("modelopt_nvfp4_default", KPROJ,
                                                                                "nvfp4")])
def test_scale_direction_inside_band_and_inverted_outside(name, prefix, band):
    from ckpt_fixture_utils import original_weight

    original = original_weight(name, prefix)
    qw = checkpoints.load(fixture(name), prefix)
    assert _rel_error(dequantize(qw), original) < BANDS[band]
    import dataclasses

    if qw.global_scale is not None:  # the global scale as compressed-tensors stores it (divide)
        inverted = dataclasses.replace(qw, global_scale=1.0 / qw.global_scale)
    else:
        inverted = dataclasses.replace(qw, scales=1.0 / qw.scales)
    assert _rel_error(dequantize(inverted), original) > 1.0


# -------------------------------------------------------------------------- 8. cross-producer
def test_modelopt_layout_of_ct_nvfp4_bytes_decodes_identically(tmp_path):
    """The ModelOpt NVFP4 layout of the same bytes (weight_scale_2 = 1 / weight_global_scale)."""
    data = tensors(fixture("ct_nvfp4a16"))
    model = tmp_path / "modelopt"
    model.mkdir()
    gs = data["proj.weight_global_scale"].to(torch.float32)
    write_tensors(model, {"proj.weight": data["proj.weight_packed"], "proj.weight_scale": data["proj.weight_scale"],
                          "proj.weight_scale_2": (1.0 / gs).reshape(())})
    (model / "config.json").write_text("{}")
    (model / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "NVFP4", "group_size": 16}}')
    ct = checkpoints.load(fixture("ct_nvfp4a16"), "proj")
    mo = checkpoints.load(model, "proj")
    assert torch.equal(dequantize(ct), dequantize(mo))


def test_compressed_tensors_own_awq_converter_output_matches_the_awq_loader():
    """ct_from_awq_gemm_4bit: the AutoAWQ fixture converted by compressed-tensors 0.20.0's
    AutoAWQConverter (tools/checkpoint_fixtures/ct_converter_fixtures.py)."""
    awq = checkpoints.load(fixture("awq_gemm_4bit"), KPROJ)
    ct = checkpoints.load(fixture("ct_from_awq_gemm_4bit"), KPROJ)
    assert str(ct.format) == "uint4:g128:zp:s=float16"
    assert torch.equal(ct.codes, awq.codes) and torch.equal(ct.zero_points, awq.zero_points)
    assert torch.equal(dequantize(ct), dequantize(awq))


def test_awq_converted_to_ct_pack_quantized_matches(tmp_path):
    """AWQ's tensors rewritten in compressed-tensors' asymmetric pack-quantized layout (codes along
    K, zero points along N, both offset by +8 from signed) load to the same weight."""
    awq = checkpoints.load(fixture("awq_gemm_4bit"), KPROJ)
    n, k = awq.shape
    codes = awq.codes.to(torch.int64)
    packed = sum(codes[:, i::8] << (4 * i) for i in range(8))  # (N, K / 8)
    zeros = awq.zero_points.to(torch.int64)  # (N, G), unsigned = signed + 8
    zpacked = sum(zeros[i::8, :] << (4 * i) for i in range(8))  # (N / 8, G)
    model = tmp_path / "ct"
    model.mkdir()
    wrap = lambda t: ((t + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32)  # noqa: E731
    write_tensors(model, {KPROJ + ".weight_packed": wrap(packed), KPROJ + ".weight_zero_point": wrap(zpacked),
                          KPROJ + ".weight_scale": awq.scales.to(torch.float16),
                          KPROJ + ".weight_shape": torch.tensor([n, k])})
    cfg = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                           "group_size": 128}}}}
    import json

    (model / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    ct = checkpoints.load(model, KPROJ)
    assert torch.equal(dequantize(ct), dequantize(awq))


# ------------------------------------------------------------------------ 9. shapes and dtypes
def test_e8m0_scales_as_uint8_or_f8_e8m0(tmp_path):
    model = copy_fixture("fp8_block_ue8m0", tmp_path)
    data = tensors(model)
    name = KPROJ + ".weight_scale_inv"
    assert data[name].dtype == torch.float8_e8m0fnu
    data[name] = data[name].view(torch.uint8)
    write_tensors(model, data)
    assert torch.equal(dequantize(checkpoints.load(model, KPROJ)),
                       dequantize(checkpoints.load(fixture("fp8_block_ue8m0"), KPROJ)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_group_scales_in_any_float_dtype(tmp_path, dtype):
    model = copy_fixture("ct_w4a16", tmp_path)
    data = tensors(model)
    data["proj.weight_scale"] = data["proj.weight_scale"].to(dtype)
    write_tensors(model, data)
    qw = checkpoints.load(model, "proj")
    assert qw.format.scale_dtype == {torch.float16: "float16", torch.bfloat16: "bfloat16",
                                     torch.float32: "float32"}[dtype]


def test_weight_shape_with_k_not_a_multiple_of_the_word(tmp_path):
    """3-bit channel codes for K = 100: 300 bits in 10 words, the last one partly used."""
    n, k = 4, 100
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 8, (n, k), generator=gen)
    words = torch.zeros(n, 10, dtype=torch.int64)
    for j in range(k):
        bit = 3 * j
        words[:, bit // 32] |= (codes[:, j] << (bit % 32)) & 0xFFFFFFFF
        if bit % 32 > 29:
            words[:, bit // 32 + 1] |= codes[:, j] >> (32 - bit % 32)
    model = tmp_path / "ct3"
    model.mkdir()
    write_tensors(model, {"proj.weight_packed": ((words + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32),
                          "proj.weight_shape": torch.tensor([n, k]), "proj.weight_scale": torch.ones(n, 1)})
    import json

    cfg = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 3, "type": "int", "symmetric": True, "strategy": "channel"}}}}
    (model / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    qw = checkpoints.load(model, "proj")
    assert torch.equal(dequantize(qw), (codes - 4).to(torch.float32))


# ------------------------------------------------------------------------- 11. config routing
@pytest.mark.parametrize("name,schema", [
    ("gptq_4bit_sym_v1", "gptq"), ("awq_gemm_4bit", "awq"), ("ct_w4a16", "compressed-tensors"),
    ("fp8_block_float", "fp8"), ("gptoss_mxfp4", "mxfp4"), ("hqq_4bit_g64_axis1", "hqq")])
def test_schema_routing(name, schema):
    assert {row.schema for row in checkpoints.inspect(fixture(name))} == {schema}


@pytest.mark.parametrize("name,key,rule", [
    ("ct_w4a16", "ignore", ["re:.*proj$"]), ("awq_gemm_4bit", "modules_to_not_convert", ["k_proj"]),
    ("fp8_block_float", "modules_to_not_convert", ["self_attn"]),
    ("gptq_4bit_sym_v1", "dynamic", {r"-:.*\.k_proj": {}})])
def test_exclusion_rules_keep_layers_unquantized(tmp_path, name, key, rule):
    model = copy_fixture(name, tmp_path)
    before = checkpoints.quantized_layers(model)
    edit_config(model, **{key: rule})
    assert before and checkpoints.quantized_layers(model) == []
    with pytest.raises(checkpoints.CheckpointError, match="excluded"):
        checkpoints.load_layer(model, before[0])


@pytest.mark.parametrize("name,key,value,match", [
    ("ct_w4a16", "transform_config", {"config_groups": {"u": {}}}, "transform_config"),
    ("gptq_4bit_sym_v1", "pack_dtype", "int16", "pack_dtype"),
    ("awq_gemm_4bit", "version", "gemv", "version")])
def test_unservable_configs_are_refused(tmp_path, name, key, value, match):
    model = copy_fixture(name, tmp_path)
    edit_config(model, **{key: value})
    with pytest.raises(checkpoints.CheckpointError, match=match):
        checkpoints.load_layer(model, checkpoints.quantized_layers(model)[0])


def test_quantized_hqq_meta_and_axis_zero_are_refused(tmp_path):
    with pytest.raises(checkpoints.CheckpointError, match="axis"):
        checkpoints.load_layer(fixture("hqq_4bit_g64_axis0"), "proj")
    model = copy_fixture("hqq_4bit_g64_axis1", tmp_path)
    edit_tensors(model, proj__quant_zero=torch.tensor(1, dtype=torch.uint8))
    with pytest.raises(checkpoints.CheckpointError, match="quant_zero"):
        checkpoints.load_layer(model, "proj")


def test_sharded_checkpoint_with_index(tmp_path):
    import json

    model = copy_fixture("gptq_4bit_sym_v1", tmp_path)
    data = tensors(model)
    (model / "model.safetensors").unlink()
    names = sorted(data)
    from safetensors.torch import save_file

    save_file({k: data[k] for k in names[:2]}, str(model / "model-00001-of-00002.safetensors"))
    save_file({k: data[k] for k in names[2:]}, str(model / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {k: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, k in enumerate(names)}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(dequantize(checkpoints.load(model, KPROJ)),
                       dequantize(checkpoints.load(fixture("gptq_4bit_sym_v1"), KPROJ)))


# ------------------------------------------------------------------------------------ 12. gpt-oss
def test_gpt_oss_blocks_decode_like_transformers():
    layer = checkpoints.load_layer(fixture("gptoss_mxfp4"), "model.layers.0.mlp.experts.gate_up_proj")
    assert layer.weight.shape == (2, 64, 256) and str(layer.weight.format) == "mxfp4"
    expected = reference("gptoss_mxfp4")["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(dequantize(layer.weight).to(expected.dtype), expected)
    blocks = torch.tensor([[[0x21] + [0] * 15]], dtype=torch.uint8)  # low nibble first: e2m1 1 -> 0.5, 2 -> 1.0
    assert decode_blocks(blocks)[0, :2].tolist() == [1, 2]


def test_every_fixture_has_a_producer_note():
    from ckpt_fixture_utils import FIXTURES

    for path in FIXTURES.iterdir():
        if path.is_dir() and path.name != "llama_original":
            assert (path / "PRODUCER").exists(), path


# ------------------------------------------------------------------------------ 10. fused siblings
def _with_sibling(name: str, prefix: str, tmp_path, **replace):
    """A copy of fixture ``name`` whose layer ``prefix`` has a sibling ``prefix + '_b'`` with the
    same tensors except ``replace`` (suffix=tensor)."""
    model = copy_fixture(name, tmp_path)
    data = tensors(model)
    for key in [k for k in data if k.startswith(prefix + ".")]:
        suffix = key[len(prefix) + 1:]
        data[f"{prefix}_b.{suffix}"] = replace.get(suffix, data[key]).clone()
    write_tensors(model, data)
    return model


def test_fused_nvfp4_siblings_share_the_global_scale(tmp_path):
    model = _with_sibling("ct_nvfp4a16", "proj", tmp_path)
    fused = checkpoints.load_fused(model, ["proj", "proj_b"])
    one = dequantize(checkpoints.load(model, "proj"))
    assert torch.equal(dequantize(fused.weight), torch.cat([one, one]))


def test_fused_unequal_global_scales_are_refused(tmp_path):
    gs = tensors(fixture("ct_nvfp4a16"))["proj.weight_global_scale"]
    model = _with_sibling("ct_nvfp4a16", "proj", tmp_path, weight_global_scale=gs * 2)
    with pytest.raises(checkpoints.CheckpointError, match="global scales"):
        checkpoints.load_fused(model, ["proj", "proj_b"])


def test_fused_tensor_scales_become_channel_scales(tmp_path):
    scale = tensors(fixture("modelopt_fp8_default"))[KPROJ + ".weight_scale"]
    model = _with_sibling("modelopt_fp8_default", KPROJ, tmp_path, weight_scale=scale * 2)
    fused = checkpoints.load_fused(model, [KPROJ, KPROJ + "_b"])
    assert fused.weight.format.granularity.value == "channel"
    parts = [dequantize(checkpoints.load(model, p)) for p in (KPROJ, KPROJ + "_b")]
    assert torch.equal(dequantize(fused.weight), torch.cat(parts))


def test_fused_siblings_with_different_activation_steps_are_refused():
    with pytest.raises(checkpoints.CheckpointError, match="input_scale"):
        checkpoints.load_fused(fixture("modelopt_int4_awq"), [KPROJ, "model.layers.0.self_attn.o_proj"])


# --------------------------------------------------------------------------- 9. scalar shapes
def test_modelopt_scalars_as_0d_or_1_and_channel_as_n_or_n1(tmp_path):
    model = copy_fixture("modelopt_fp8_default", tmp_path)
    assert tensors(model)[KPROJ + ".weight_scale"].dim() == 0
    before = dequantize(checkpoints.load(model, KPROJ))
    edit_tensors(model, **{KPROJ.replace(".", "__") + "__weight_scale": tensors(model)[KPROJ + ".weight_scale"]
                           .reshape(1)})
    assert torch.equal(dequantize(checkpoints.load(model, KPROJ)), before)
    channel = copy_fixture("modelopt_fp8_per_channel_per_token", tmp_path)
    scale = tensors(channel)[KPROJ + ".weight_scale"]
    assert scale.dim() == 1
    before = dequantize(checkpoints.load(channel, KPROJ))
    edit_tensors(channel, **{KPROJ.replace(".", "__") + "__weight_scale": scale.reshape(-1, 1)})
    assert torch.equal(dequantize(checkpoints.load(channel, KPROJ)), before)


def test_ct_unpacked_int8_zero_points_of_older_releases(tmp_path):
    """compressed-tensors before PR #296 stored asymmetric zero points unpacked: int8 (N, G), signed."""
    model = copy_fixture("ct_w4a16_asym", tmp_path)
    before = checkpoints.load(model, "proj")
    signed = (before.zero_points.to(torch.int16) - 8).to(torch.int8)
    edit_tensors(model, proj__weight_zero_point=signed)
    after = checkpoints.load(model, "proj")
    assert torch.equal(after.zero_points, before.zero_points) and torch.equal(dequantize(after), dequantize(before))
