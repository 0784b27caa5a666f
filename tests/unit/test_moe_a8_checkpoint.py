"""QuantizedMoE.from_checkpoint(..., activations=...) without a GPU: a published checkpoint's
experts on the 8-bit-activation MoE GEMMs (humming_aot.moe.layer_a8.A8MoE). DeepSeek-V3's fp8
experts (one layer per expert, 128 x 128 blocks) with the producer's own scheme, a static
per-tensor fp8 scheme (each GEMM's largest input_scale over its experts), gpt-oss's stacked MXFP4
experts with float8 activations named by the caller, and the errors. Each layer against an
A8MoE made from the same QuantizedWeights (the loader's, bit for bit on the CPU path), and
against the float reference within the activations' quantization error."""
from __future__ import annotations

import json

import pytest
import torch
from test_moe import _seed, _write_deepseek_fp8_experts, _write_gptoss_experts

from humming_aot import checkpoints
from humming_aot.moe.a8 import PackedW4A8Experts, PackedW8A8Experts
from humming_aot.moe.layer_a8 import A8MoE
from humming_aot.nn import QuantizedMoE

PREFIX = "model.layers.3.mlp.experts"


def _routing(tokens: int, experts: int, top_k: int, gen: torch.Generator):
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    return ids, torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=1)


def _same_as_from_experts(layer: A8MoE, model, prefix: str, gen: torch.Generator, stacked: bool = False):
    """The layer's forward equals, bit for bit, an A8MoE made from the loader's own weights."""
    if stacked:
        gate_up, down = (checkpoints.load_layer(model, f"{prefix}.{name}") for name in ("gate_up_proj", "down_proj"))
        biases = [None if x.bias is None else x.bias.to(layer.out_dtype) for x in (gate_up, down)]
        weights = (gate_up.weight, down.weight)
    else:
        e = layer.num_experts
        fused = [checkpoints.load_fused(model, [f"{prefix}.{i}.gate_proj", f"{prefix}.{i}.up_proj"]).weight
                 for i in range(e)]
        downs = [checkpoints.load_layer(model, f"{prefix}.{i}.down_proj").weight for i in range(e)]
        from humming_aot.nn import _stack_weights

        weights = (_stack_weights(fused, "gate_up"), _stack_weights(downs, "down"))
        biases = [None, None]
    twin = A8MoE.from_experts(*weights, layer.activations, None, layer.activation, *biases, out_dtype=layer.out_dtype)
    if layer.static_scales is not None:
        twin.set_static_scales(*layer.static_scales.tolist())
    hidden = torch.randn(6, layer.hidden_size, generator=gen).to(layer.out_dtype)
    ids, weights_ = _routing(6, layer.num_experts, 2, gen)
    y = layer(hidden, ids, weights_)
    assert torch.equal(y, twin(hidden, ids, weights_))
    return hidden, ids, weights_, y


def _float_reference(gate_up: torch.Tensor, down: torch.Tensor, hidden, ids, weights) -> torch.Tensor:
    """float64 silu MoE on the dequantized experts (no activation quantization)."""
    x = hidden.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[t, slot])
            h = gate_up[e].double() @ x[t]
            i = h.shape[0] // 2
            out[t] += weights[t, slot].double() * (down[e].double() @ (torch.nn.functional.silu(h[:i]) * h[i:]))
    return out


def test_deepseek_fp8_experts_with_the_checkpoints_scheme(tmp_path):
    from humming_aot.quant.weight import dequantize

    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "deepseek"
    _write_deepseek_fp8_experts(model, 3, 256, 128, gen)
    layer = QuantizedMoE.from_checkpoint(model, PREFIX, activations="checkpoint")
    assert isinstance(layer, A8MoE) and isinstance(layer.gate_up, PackedW8A8Experts) and layer.gate_up.blocks
    assert (layer.activations, layer.activation, layer.out_dtype) == ("float8e4m3:g128", "silu", torch.bfloat16)
    assert layer.static_scales is None
    hidden, ids, weights, y = _same_as_from_experts(layer, model, PREFIX, gen)
    gate_up = torch.stack([dequantize(checkpoints.load_fused(
        model, [f"{PREFIX}.{e}.gate_proj", f"{PREFIX}.{e}.up_proj"]).weight) for e in range(3)])
    down = torch.stack([dequantize(checkpoints.load_layer(model, f"{PREFIX}.{e}.down_proj").weight) for e in range(3)])
    expected = _float_reference(gate_up, down, hidden, ids, weights)
    # two float8 activation roundings (up to 2^-4 relative each) and a bfloat16 output: 0.03-0.04 of
    # the largest output over three seeds
    assert (y.double() - expected).abs().max() <= 0.1 * expected.abs().max()
    half = QuantizedMoE.from_checkpoint(model, PREFIX, activations="float8e4m3:g128", act_dtype=torch.float16)
    assert half.out_dtype == torch.float16 and half(hidden.half(), ids, weights).dtype == torch.float16


def _write_static_fp8_experts(path, experts: int, hidden: int, intermediate: int, gen: torch.Generator,
                              scheme: str = "static") -> list:
    """fp8 experts with a per-tensor weight_scale and a static input_scale per layer (activation_scheme
    `scheme`); returns the input scales (gate, up, down) per expert."""
    from safetensors.torch import save_file

    tensors, scales = {}, []
    for e in range(experts):
        row = []
        for name, n, k in (("gate_proj", intermediate, hidden), ("up_proj", intermediate, hidden),
                           ("down_proj", hidden, intermediate)):
            prefix = f"{PREFIX}.{e}.{name}"
            tensors[prefix + ".weight"] = (torch.randn(n, k, generator=gen) * 8).to(torch.float8_e4m3fn)
            tensors[prefix + ".weight_scale"] = torch.rand(1, generator=gen) * 1e-3 + 1e-4
            row.append(float(torch.rand(1, generator=gen)) * 0.01 + 0.001)
            tensors[prefix + ".input_scale"] = torch.tensor([row[-1]])
        scales.append(row)
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "activation_scheme": scheme, "fmt": "e4m3"}}))
    return scales


def test_a_static_scheme_takes_each_gemms_largest_input_scale(tmp_path):
    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "static"
    scales = _write_static_fp8_experts(model, 3, 128, 128, gen)
    layer = QuantizedMoE.from_checkpoint(model, PREFIX, activations="checkpoint")
    assert layer.activations == "float8e4m3:tensor" and not layer.gate_up.blocks
    expected = torch.tensor([max(max(s[0], s[1]) for s in scales), max(s[2] for s in scales)])
    assert torch.equal(layer.static_scales, expected.to(torch.float32))
    _same_as_from_experts(layer, model, PREFIX, gen)


def test_gptoss_mxfp4_experts_with_float8_activations(tmp_path):
    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "gptoss"
    _write_gptoss_experts(model, 4, 128, 64, gen)
    prefix = "model.layers.0.mlp.experts"
    layer = QuantizedMoE.from_checkpoint(model, prefix, activations="float8e4m3:token")
    assert isinstance(layer, A8MoE) and isinstance(layer.gate_up, PackedW4A8Experts)
    assert (layer.activations, layer.activation) == ("float8e4m3:token", "swiglu_oai")
    assert layer.gate_up_bias is not None and layer.gate_up_bias.dtype == torch.bfloat16
    _same_as_from_experts(layer, model, prefix, gen, stacked=True)


def test_errors_name_the_layer_and_what_to_do(tmp_path):
    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "gptoss"
    _write_gptoss_experts(model, 2, 128, 64, gen)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts .* quantizes no activations: the checkpoint is "
                                         r"weight-only"):
        QuantizedMoE.from_checkpoint(model, "model.layers.0.mlp.experts", activations="checkpoint")
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts: A8MoE: activations 'float8e4m3:g128' do not "
                                         r"suit"):
        QuantizedMoE.from_checkpoint(model, "model.layers.0.mlp.experts", activations="float8e4m3:g128")
    dynamic = tmp_path / "dynamic"
    _write_static_fp8_experts(dynamic, 2, 128, 128, gen, scheme="dynamic")
    with pytest.raises(ValueError, match=r"per tensor, dynamically; the MoE GEMMs take per-tensor activations with "
                                         r"static scales only: name a format such as 'float8e4m3:token'"):
        QuantizedMoE.from_checkpoint(dynamic, PREFIX, activations="checkpoint")
    layer = QuantizedMoE.from_checkpoint(dynamic, PREFIX, activations="float8e4m3:token")
    assert layer.activations == "float8e4m3:token"


def test_inspect_status_of_stacked_experts_is_the_moe_gemms():
    """humming-aot inspect's W8A8 line for stacked experts whose producer quantizes activations:
    the masked MoE type of the pairing (what A8MoE runs), not a refusal of stacked weights."""
    from humming_aot import quant
    from humming_aot.checkpoints.activations import ActivationScheme
    from humming_aot.checkpoints.layer import CheckpointLayer
    from humming_aot.checkpoints.serving import w8a8_serving_status

    gen = torch.Generator().manual_seed(_seed())
    blocks = quant.quantize(torch.randn(4, 256, 256, generator=gen), "float8e4m3:b128x128")
    scheme = ActivationScheme(description="float8 e4m3 per token per 128 of K, dynamic", format="float8e4m3:g128")
    layer = CheckpointLayer(prefix="model.layers.3.mlp.experts.*.gate_up_proj", schema="fp8", weight=blocks,
                            activations=scheme)
    assert w8a8_serving_status(layer, "sm90a", None).startswith("JIT")  # (no installed catalog given)
    assert w8a8_serving_status(layer, "sm89", None).startswith("JIT")
    assert w8a8_serving_status(layer, "sm100", None).startswith("no: ")  # (emulated e4m3, no wgmma schedule)
    token = ActivationScheme(description="float8 e4m3 per token, dynamic", format="float8e4m3:token")
    mismatched = CheckpointLayer(prefix=layer.prefix, schema="fp8", weight=blocks, activations=token)
    assert w8a8_serving_status(mismatched, "sm90a", None).startswith("no: float8e4m3:token activations do not suit")
    int4 = quant.quantize(torch.randn(4, 256, 256, generator=gen), "int4:g128")
    w4 = CheckpointLayer(prefix=layer.prefix, schema="compressed-tensors", weight=int4, activations=token)
    assert w8a8_serving_status(w4, "sm90a", None).startswith("JIT")
    assert w8a8_serving_status(w4, "sm80", None).startswith("no: ")  # (float8 codes from sm89)
