"""humming_aot.moe on the CPU: stacked expert packing, the routing layouts against a plain statement
of vLLM's and DeepGEMM's conventions, the three GEMM types and QuantizedMoE against float64
references of the exact operands, under uniform, skewed and empty routing."""
from __future__ import annotations

import os

import pytest
import torch

import humming_aot
from humming_aot import moe
from humming_aot.nn import QuantizedMoE
from humming_aot.testing.moe import moe_layer_reference, random_moe_layer
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _routing(m: int, top_k: int, experts: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """(m, top_k) distinct expert ids per token: uniform, skewed (most tokens on experts 0-1), or
    leaving the upper half of the experts empty."""
    if kind == "uniform":
        scores = torch.rand(m, experts, generator=gen)
    elif kind == "skewed":
        scores = torch.rand(m, experts, generator=gen) + torch.tensor([4.0, 3.0] + [0.0] * (experts - 2))
    else:
        scores = torch.rand(m, experts, generator=gen) - torch.arange(experts).ge(experts // 2).float() * 10
    return scores.topk(top_k, dim=1).indices.to(torch.int32)


def _experts(e: int, n: int, k: int, fmt: str, gen: torch.Generator, act=torch.bfloat16):
    qw = humming_aot.quantize(torch.randn(e, n, k, generator=gen) * 0.05, fmt)
    return qw, moe.pack_experts(qw, act_dtype=act)


@pytest.mark.parametrize("fmt", ["int4:g128", "uint4:g64:zp", "nvfp4", "float8e4m3:channel"])
def test_pack_experts_packs_each_expert_as_pack_does(fmt):
    gen = torch.Generator().manual_seed(_seed())
    qw, packed = _experts(3, 128, 256, fmt, gen)
    assert packed.w.shape[0] == packed.w_scale.shape[0] == packed.experts == 3
    for e in range(3):
        dense = humming_aot.pack(moe.expert_weight(qw, e))
        view = packed.expert(e)
        assert torch.equal(view.w, dense.w) and torch.equal(view.w_scale, dense.w_scale)
        assert (view.w_zero_point is None) == (dense.w_zero_point is None)
        if dense.w_zero_point is not None:
            assert torch.equal(view.w_zero_point, dense.w_zero_point)
        assert view.global_scale == dense.global_scale == float(packed.global_scale_tensor[e])
    with pytest.raises(ValueError, match="expected stacked expert codes"):
        moe.pack_experts(humming_aot.quantize(torch.randn(128, 256), fmt))
    with pytest.raises(IndexError, match="expert 3 of 3"):
        packed.expert(3)


def test_pack_experts_names_the_expert_it_cannot_pack():
    qw = humming_aot.quantize(torch.randn(2, 96, 96), "int4:g48")  # K = 96 pads to 128, which 48 does not tile
    with pytest.raises(ValueError, match="^expert 0: cannot pack .* K=96 pads to 128 .* groups of 48 do not tile"):
        moe.pack_experts(qw)


@pytest.mark.parametrize("fmt", ["mxfp4", "uint4:g32:zp", "int8:channel"])
def test_unaligned_shards_are_padded_by_pack_and_computed_on_their_own_shape(fmt):
    """Qwen3-30B-A3B at TP8: gate_up (E, 192, 2048) and down (E, 2048, 96), K = 96 not a multiple
    of 64; and N = 96 (gate_up at TP16). pack pads both to 128 (PackedExperts.n_valid / k_valid)
    and every layout computes on the experts' own shapes, equal to the float64 reference of the
    unpadded operands; QuantizedMoE takes such experts."""
    gen = torch.Generator().manual_seed(5)
    for n, k in ((2048, 96), (96, 256)):
        w = torch.randn(3, n, k, generator=gen) * 0.05
        experts = moe.pack_experts(humming_aot.quantize(w, fmt))
        assert experts.padded and (experts.out_features, experts.in_features) == (n, k)
        assert experts.n % 64 == 0 and experts.k % 64 == 0
        a = torch.randn(3, 5, k, generator=gen).to(torch.bfloat16)
        counts = torch.tensor([5, 0, 2], dtype=torch.int32)
        out = moe.gemm_masked(a, experts, counts)
        assert out.shape == (3, 5, n)
        for e, count in enumerate(counts.tolist()):
            w_eff = experts.effective_weight(e)
            assert w_eff.shape == (n, k)
            ref = reference_gemm(a[e, :count], w_eff)
            assert_gemm_close(out[e, :count], ref, a=a[e, :count], w_eff=w_eff, context=f"{fmt} {n}x{k} expert {e}")
            assert not out[e, count:].any()
        grouped = moe.gemm_grouped(a.reshape(15, k), experts, offsets=torch.tensor([0, 5, 10, 15]))
        assert grouped.shape == (15, n)
    hidden = 128
    layer = QuantizedMoE.from_experts(torch.randn(4, 192, hidden, generator=gen) * 0.05,
                                      torch.randn(4, hidden, 96, generator=gen) * 0.05, fmt="mxfp4")
    assert (layer.hidden_size, layer.intermediate_size) == (hidden, 96)
    x = torch.randn(3, hidden, generator=gen).to(torch.bfloat16)
    topk_ids = torch.tensor([[0, 3], [1, 3], [2, 2]])
    weights = torch.full((3, 2), 0.5)
    y = layer(x, topk_ids, weights)
    assert y.shape == (3, hidden)
    _close(y, moe_layer_reference(layer, x, topk_ids, weights), f"padded intermediate {fmt}")


def _align_by_definition(topk_ids, experts, block, expert_map):
    """vLLM's moe_align_block_size, element by element."""
    flat = topk_ids.reshape(-1).tolist()
    slots = len(flat)
    sorted_ids, expert_ids = [], []
    for e in range(experts):
        mine = [t for t in range(slots) if flat[t] == e]
        if not mine:
            continue
        padded = -(-len(mine) // block) * block
        sorted_ids += mine + [slots] * (padded - len(mine))
        expert_ids += [e if expert_map is None else int(expert_map[e])] * (padded // block)
    return sorted_ids, expert_ids


@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty"])
@pytest.mark.parametrize("block", [1, 16, 64])
def test_align_block_size_is_vllms_layout(kind, block):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for m, top_k, experts in ((1, 1, 4), (7, 2, 8), (33, 4, 16)):
        topk_ids = _routing(m, top_k, experts, kind, gen)
        expert_map = torch.where(torch.arange(experts) % 3 == 1, -1, torch.arange(experts) // 2).to(torch.int32)
        for emap in (None, expert_map):
            r = moe.align_block_size(topk_ids, experts, block, emap)
            ids, blocks = _align_by_definition(topk_ids, experts, block, emap)
            total = int(r.num_tokens_post_padded[0])
            context = f"kind={kind} block={block} m={m} top_k={top_k} seed={seed}"
            assert total == len(ids), context
            assert r.sorted_token_ids[:total].tolist() == ids, context
            assert bool((r.sorted_token_ids[total:] == m * top_k).all()), context
            assert r.sorted_token_ids.shape[0] == m * top_k + experts * (block - 1), context
            assert r.expert_ids[: len(blocks)].tolist() == blocks and bool((r.expert_ids[len(blocks):] == -1).all())
            assert r.sorted_token_ids.dtype == r.expert_ids.dtype == torch.int32


def test_routing_rejects_bad_input():
    with pytest.raises(ValueError, match="outside \\[0, 3\\]"):
        moe.align_block_size(torch.tensor([[4]], dtype=torch.int32), 4, 16)
    with pytest.raises(ValueError, match="must be \\(M, top_k\\) int32 or int64"):
        moe.group_rows(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="block_size must be at least 1"):
        moe.align_block_size(torch.zeros(2, 1, dtype=torch.int32), 4, 0)


def test_group_rows_permute_and_unpermute_round_trip():
    gen = torch.Generator().manual_seed(_seed())
    topk_ids = _routing(9, 3, 6, "skewed", gen)
    r = moe.group_rows(topk_ids, 6)
    flat = topk_ids.reshape(-1).long()
    assert r.offsets[0] == 0 and r.offsets[-1] == 27 and bool((r.offsets[1:] >= r.offsets[:-1]).all())
    for e in range(6):
        rows = r.slot_of_row[r.offsets[e]:r.offsets[e + 1]]
        assert bool((flat[rows] == e).all()) and rows.tolist() == sorted(rows.tolist())
    hidden = torch.randn(9, 8)
    grouped = moe.permute(hidden, r)
    assert torch.equal(grouped, hidden[r.slot_of_row // 3])
    assert torch.equal(moe.unpermute(grouped, r), hidden.repeat_interleave(3, dim=0).reshape(9, 3, 8))


def _expert_ref(a_rows, packed, e, bias=None):
    return reference_gemm(a_rows, packed.effective_weight(e), bias)


@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty"])
def test_the_three_gemm_types_match_the_per_expert_reference(kind):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    experts, n, k, m, top_k = 6, 128, 256, 11, 2
    _, packed = _experts(experts, n, k, "int4:g128", gen)
    hidden = torch.randn(m, k, generator=gen).bfloat16()
    topk_ids = _routing(m, top_k, experts, kind, gen)
    weights = torch.rand(m, top_k, generator=gen)
    flat = topk_ids.reshape(-1).long()
    context = f"kind={kind} seed={seed}"

    # indexed, first GEMM (rows per token) with the routing weight, and the second (rows per slot)
    routing = moe.align_block_size(topk_ids, experts, 4)
    out = moe.gemm_indexed(hidden, packed, routing, a_rows_per_token=top_k, topk_weights=weights)
    ref = torch.stack([_expert_ref(hidden[t // top_k : t // top_k + 1], packed, int(flat[t]))[0]
                       * float(weights.reshape(-1)[t]) for t in range(m * top_k)])
    _close(out, ref, f"indexed {context}")
    slots_in = torch.randn(m * top_k, k, generator=gen).bfloat16()
    out2 = moe.gemm_indexed(slots_in, packed, routing, a_rows_per_token=1)
    ref2 = torch.stack([_expert_ref(slots_in[t : t + 1], packed, int(flat[t]))[0] for t in range(m * top_k)])
    _close(out2, ref2, context)

    # grouped contiguous, by offsets and by row index (with padding rows)
    grouping = moe.group_rows(topk_ids, experts)
    rows = moe.permute(hidden, grouping)
    bias = (torch.randn(experts, n, generator=gen) * 0.1).bfloat16()
    by_offsets = moe.gemm_grouped(rows, packed, offsets=grouping.offsets, bias=bias)
    ref3 = torch.cat([_expert_ref(rows[grouping.offsets[e]:grouping.offsets[e + 1]], packed, e, bias[e])
                      for e in range(experts)])
    _close(by_offsets, ref3, context)
    padded_index = torch.cat([grouping.row_expert, torch.full((3,), -1, dtype=torch.int32)])
    padded_rows = torch.cat([rows, torch.randn(3, k, generator=gen).bfloat16()])
    by_index = moe.gemm_grouped(padded_rows, packed, row_expert=padded_index, bias=bias)
    assert torch.equal(by_index[: rows.shape[0]], by_offsets) and not bool(by_index[rows.shape[0]:].any())

    # masked
    counts = torch.bincount(flat, minlength=experts)
    max_m = int(counts.max()) + 2
    masked_a = torch.randn(experts, max_m, k, generator=gen).bfloat16()
    masked = moe.gemm_masked(masked_a, packed, counts)
    for e in range(experts):
        c = int(counts[e])
        if c:
            _close(masked[e, :c], _expert_ref(masked_a[e, :c], packed, e), context)
        assert not bool(masked[e, c:].any()), context


def _close(out, ref, context):
    """The kernels' tolerance: the output rounded once to bf16 from an fp32 sum of exact products."""
    err = (out.double() - ref).abs()
    bound = 2**-7 * ref.abs() + 1e-2 * float(ref.abs().max()) + 1e-6
    assert bool((err <= bound).all()), f"max error {float(err.max()):g}: {context}"


@pytest.mark.parametrize("activation,fmt", [("silu", "int4:g128"), ("swiglu_oai", "mxfp4")])
@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty"])
def test_quantized_moe_matches_the_float64_layer(activation, fmt, kind):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    experts, hidden_size, m, top_k = 5, 128, 9, 2
    layer = random_moe_layer(experts, hidden_size, 128, fmt, activation, gen)
    hidden = torch.randn(m, hidden_size, generator=gen).bfloat16()
    topk_ids = _routing(m, top_k, experts, kind, gen)
    weights = torch.softmax(torch.randn(m, top_k, generator=gen), dim=1)
    out = layer(hidden, topk_ids, weights)
    assert out.shape == (m, hidden_size) and out.dtype == torch.bfloat16
    ref = moe_layer_reference(layer, hidden, topk_ids, weights)
    _close(out, ref, f"activation={activation} fmt={fmt} kind={kind} seed={seed}")
    three_d = layer(hidden.reshape(1, m, hidden_size), topk_ids, weights)
    assert torch.equal(three_d.reshape(m, hidden_size), out)


def test_quantized_moe_refuses_mismatched_experts_and_routing():
    gen = torch.Generator().manual_seed(_seed())
    gate_up = torch.randn(4, 128, 128, generator=gen)
    with pytest.raises(ValueError, match="gate_up must be \\(E, 2 I, H\\) and down \\(E, H, I\\)"):
        QuantizedMoE.from_experts(gate_up, torch.randn(4, 128, 128, generator=gen), fmt="int4:g64")
    with pytest.raises(ValueError, match="give fmt to quantize it"):
        QuantizedMoE.from_experts(gate_up, torch.randn(4, 128, 64, generator=gen))
    layer = QuantizedMoE.from_experts(gate_up, torch.randn(4, 128, 64, generator=gen), fmt="int4:g64")
    with pytest.raises(ValueError, match="topk_ids and topk_weights must be \\(3, top_k\\)"):
        layer(torch.randn(3, 128).bfloat16(), torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, 1))
    with pytest.raises(ValueError, match="activation 'gelu' is not one of"):
        QuantizedMoE(layer.gate_up, layer.down, activation="gelu")
    with pytest.raises(ValueError, match="their scales are now torch.float16: pack them again"):
        layer.half()(torch.randn(3, 128).half(), torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, 1))


def test_quantized_moe_state_dict_round_trips():
    gen = torch.Generator().manual_seed(_seed())
    gate_up, down = torch.randn(3, 256, 128, generator=gen) * 0.1, torch.randn(3, 128, 128, generator=gen) * 0.1
    layer = QuantizedMoE.from_experts(gate_up, down, fmt="nvfp4")
    other = QuantizedMoE.from_experts(torch.randn(3, 256, 128, generator=gen), torch.randn(3, 128, 128, generator=gen),
                                      fmt="nvfp4")
    assert {"gate_up_w", "gate_up_scale", "gate_up_global_scale", "down_w"} <= set(layer.state_dict())
    hidden = torch.randn(4, 128, generator=gen).bfloat16()
    topk_ids = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]], dtype=torch.int32)
    weights = torch.full((4, 2), 0.5)
    before = other(hidden, topk_ids, weights)  # caches the packed experts before the load
    other.load_state_dict(layer.state_dict())
    assert not torch.equal(before, other(hidden, topk_ids, weights))
    assert torch.equal(other(hidden, topk_ids, weights), layer(hidden, topk_ids, weights))
    assert other.gate_up.global_scales == layer.gate_up.global_scales


@pytest.mark.parametrize("m,experts,top_k,block", [(1, 8, 2, 8), (37, 16, 4, 16), (5, 256, 8, 64), (64, 4, 1, 8)])
def test_aligned_groups_are_group_rows_padded_to_whole_blocks(m, experts, top_k, block):
    """align_groups: the rows of group_rows in the same order, each expert's starting a block and
    padded to whole blocks (every block: one expert's rows then padding, or padding only), in a
    fixed size; permute_aligned gives zero padding rows and unpermute_aligned drops them."""
    gen = torch.Generator().manual_seed(m * 1000 + experts)
    topk_ids = torch.randn(m, experts, generator=gen).topk(top_k, dim=1).indices
    grouping, reference = moe.align_groups(topk_ids, experts, block), moe.group_rows(topk_ids, experts)
    rows = grouping.row_expert.numel()
    assert rows == m * top_k + experts * (block - 1) and grouping.slot_of_row.shape == (rows,)
    real = grouping.slot_of_row >= 0
    assert torch.equal(grouping.slot_of_row[real], reference.slot_of_row)
    assert torch.equal(grouping.row_expert[real], reference.row_expert)
    assert torch.equal(grouping.row_expert < 0, ~real)
    row_expert = grouping.row_expert.tolist()
    for start in range(0, rows, block):
        chunk = row_expert[start:start + block]
        owners = [x for x in chunk if x >= 0]
        assert not owners or (chunk[0] >= 0 and set(owners) == {chunk[0]}
                              and chunk == [chunk[0]] * len(owners) + [-1] * (len(chunk) - len(owners)))
    hidden = torch.randn(m, 32, generator=gen)
    grouped = moe.permute_aligned(hidden, grouping)
    assert torch.equal(grouped[real], moe.permute(hidden, reference)) and not grouped[~real].any()
    assert torch.equal(moe.unpermute_aligned(grouped, grouping, m),
                       moe.unpermute(moe.permute(hidden, reference), reference))
    with pytest.raises(ValueError, match="block must be a positive int"):
        moe.align_groups(topk_ids, experts, 0)


def test_aligned_padding_rows_are_zeros_whatever_the_tokens_hold():
    """permute_aligned's padding rows are zeros even where token 0 is not finite, and no token at
    all gives padding rows only."""
    topk_ids = torch.tensor([[0, 1], [1, 2]])
    grouping = moe.align_groups(topk_ids, 3, 4)
    hidden = torch.tensor([[float("nan"), 1.0], [2.0, float("inf")]])
    rows = moe.permute_aligned(hidden, grouping)
    padding = grouping.slot_of_row < 0
    assert padding.any() and torch.equal(rows[padding], torch.zeros(int(padding.sum()), 2))
    empty = moe.align_groups(torch.zeros(0, 2, dtype=torch.long), 3, 4)
    assert empty.row_expert.shape == (9,) and (empty.row_expert == -1).all()
    assert torch.equal(moe.permute_aligned(torch.zeros(0, 5), empty), torch.zeros(9, 5))
    assert moe.unpermute_aligned(torch.zeros(9, 5), empty, 0).shape == (0, 2, 5)


def _write_gptoss_experts(path, experts: int, hidden: int, intermediate: int, gen: torch.Generator) -> None:
    """A gpt-oss style MXFP4 checkpoint holding one layer's stacked experts and their biases."""
    import json

    from safetensors.torch import save_file

    tensors = {}
    for name, n, k in (("gate_up_proj", 2 * intermediate, hidden), ("down_proj", hidden, intermediate)):
        prefix = f"model.layers.0.mlp.experts.{name}"
        tensors[prefix + "_blocks"] = torch.randint(0, 256, (experts, n, k // 32, 16), dtype=torch.uint8, generator=gen)
        tensors[prefix + "_scales"] = torch.randint(118, 124, (experts, n, k // 32), dtype=torch.uint8, generator=gen)
        tensors[prefix + "_bias"] = (torch.randn(experts, n, generator=gen) * 0.1).to(torch.bfloat16)
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}))


def test_quantized_moe_from_a_gptoss_checkpoint(tmp_path):
    """QuantizedMoE.from_checkpoint on gpt-oss's stacked MXFP4 experts: both projections and their
    biases, the interleaved clamped SwiGLU, the experts exactly as the checkpoint loader reads them
    (pack's effective weight of its QuantizedWeight), and the layer against the float64 reference."""
    from humming_aot import checkpoints

    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "gptoss"
    _write_gptoss_experts(model, 4, 128, 64, gen)
    layer = QuantizedMoE.from_checkpoint(model, "model.layers.0.mlp.experts")
    assert (layer.activation, layer.num_experts, layer.hidden_size, layer.intermediate_size) == ("swiglu_oai", 4, 128, 64)
    loaded = checkpoints.load_layer(model, "model.layers.0.mlp.experts.gate_up_proj")
    expected = moe.pack_experts(loaded.weight, act_dtype=torch.bfloat16)
    assert torch.equal(layer.gate_up.effective_weight(2), expected.effective_weight(2))
    assert torch.equal(layer.gate_up_bias, loaded.bias.to(torch.bfloat16))
    hidden = torch.randn(5, 128, generator=gen).to(torch.bfloat16)
    topk_ids = torch.tensor([[0, 1], [3, 2], [1, 1], [0, 3], [2, 0]])
    weights = torch.softmax(torch.randn(5, 2, generator=gen), dim=1)
    _close(layer(hidden, topk_ids, weights), moe_layer_reference(layer, hidden, topk_ids, weights), "gpt-oss")
    with pytest.raises(checkpoints.CheckpointError, match="down_proj_blocks"):
        QuantizedMoE.from_checkpoint(_gate_up_only(model, tmp_path), "model.layers.0.mlp.experts")


def _gate_up_only(model, tmp_path):
    """A copy of the checkpoint without the down projection."""
    import shutil

    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(model, partial)
    tensors = {k: v for k, v in load_file(str(partial / "model.safetensors")).items() if "down_proj" not in k}
    save_file(tensors, str(partial / "model.safetensors"))
    return partial


def _write_deepseek_fp8_experts(path, experts: int, hidden: int, intermediate: int, gen: torch.Generator) -> None:
    """A DeepSeek-V3 style fp8 checkpoint (128 x 128 weight blocks, fp32 inverse scales): one layer
    per expert, gate_proj and up_proj (I, H) and down_proj (H, I)."""
    import json

    from safetensors.torch import save_file

    tensors = {}
    for e in range(experts):
        for name, n, k in (("gate_proj", intermediate, hidden), ("up_proj", intermediate, hidden),
                           ("down_proj", hidden, intermediate)):
            prefix = f"model.layers.3.mlp.experts.{e}.{name}"
            tensors[prefix + ".weight"] = (torch.randn(n, k, generator=gen) * 8).to(torch.float8_e4m3fn)
            tensors[prefix + ".weight_scale_inv"] = torch.rand(n // 128, k // 128, generator=gen) * 1e-3 + 1e-4
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}}))


def test_quantized_moe_from_a_checkpoint_of_one_layer_per_expert(tmp_path):
    """QuantizedMoE.from_checkpoint on DeepSeek-V3 style fp8 experts stored one layer per expert:
    gate and up fused per expert (gate rows first, "silu"), the experts stacked, each exactly as the
    checkpoint loader reads it; the layer against the float64 reference; a prefix without experts
    refused with what to give."""
    from humming_aot import checkpoints

    gen = torch.Generator().manual_seed(_seed())
    model = tmp_path / "deepseek"
    _write_deepseek_fp8_experts(model, 3, 256, 128, gen)
    layer = QuantizedMoE.from_checkpoint(model, "model.layers.3.mlp.experts")
    assert (layer.activation, layer.num_experts, layer.hidden_size, layer.intermediate_size) == ("silu", 3, 256, 128)
    fused = checkpoints.load_fused(model, ["model.layers.3.mlp.experts.1.gate_proj", "model.layers.3.mlp.experts.1.up_proj"])
    expected = humming_aot.pack(fused.weight, act_dtype=torch.bfloat16)
    assert torch.equal(layer.gate_up.effective_weight(1), expected.effective_weight())
    down = humming_aot.pack(checkpoints.load_layer(model, "model.layers.3.mlp.experts.2.down_proj").weight,
                            act_dtype=torch.bfloat16)
    assert torch.equal(layer.down.effective_weight(2), down.effective_weight())
    hidden = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    topk_ids = torch.tensor([[0, 1], [2, 1], [1, 1], [0, 2]])
    weights = torch.softmax(torch.randn(4, 2, generator=gen), dim=1)
    _close(layer(hidden, topk_ids, weights), moe_layer_reference(layer, hidden, topk_ids, weights), "deepseek fp8")
    with pytest.raises(ValueError, match="neither model.layers.3.mlp.gate_up_proj .* nor model.layers.3.mlp.0.gate_proj"):
        QuantizedMoE.from_checkpoint(model, "model.layers.3.mlp")


def test_model_catalog_of_per_expert_layers_holds_the_grouped_moe_gemms(tmp_path):
    """humming-aot build --model on experts stored one layer per expert: their spec's dense
    kernels and its grouped masked and contiguous ones."""
    from humming_aot.aot.model_catalog import write_model_catalog
    from humming_aot.enumerate import enumerate_catalog
    from humming_aot.spec import GemmType

    model = tmp_path / "deepseek"
    _write_deepseek_fp8_experts(model, 2, 256, 128, torch.Generator().manual_seed(0))
    keys = enumerate_catalog(str(write_model_catalog(model, ["sm90a"], tmp_path / "m.toml")), ["sm90a"]).keys
    assert {k.spec.gemm_type for k in keys} == {GemmType.DENSE, GemmType.MASKED, GemmType.GROUPED}
    assert {k.spec.w_dtype for k in keys} == {"float8e4m3"}


def test_align_offsets_moves_each_experts_rows_to_a_block_start():
    """moe.align_offsets against its definition: expert e's rows offsets[e]..offsets[e + 1] land at
    the next multiple of the block after the previous expert's padded rows, in order; the rest of
    the fixed-size layout (rows + E * (block - 1)) is padding (-1), and so are rows of no expert;
    permute_aligned / unpermute_aligned carry the rows there and back."""
    gen = torch.Generator().manual_seed(_seed())
    for _ in range(200):
        experts = int(torch.randint(1, 9, (), generator=gen))
        block = [1, 2, 8, 16][int(torch.randint(0, 4, (), generator=gen))]
        bounds = sorted(torch.randint(0, 40, (experts + 1,), generator=gen).tolist())
        rows = bounds[-1] + int(torch.randint(0, 5, (), generator=gen))  # rows past the last expert's too
        grouping = moe.align_offsets(torch.tensor(bounds), rows, block)
        expected_expert, expected_slot = [], []
        for e in range(experts):
            count = bounds[e + 1] - bounds[e]
            expected_expert += [e] * count + [-1] * (-count % block)
            expected_slot += list(range(bounds[e], bounds[e + 1])) + [-1] * (-count % block)
        size = rows + experts * (block - 1)
        expected_expert += [-1] * (size - len(expected_expert))
        expected_slot += [-1] * (size - len(expected_slot))
        assert grouping.row_expert.tolist() == expected_expert, (bounds, rows, block)
        assert grouping.slot_of_row.tolist() == expected_slot, (bounds, rows, block)
        a = torch.randn(rows, 8, generator=gen)
        aligned = moe.permute_aligned(a, grouping)
        back = moe.unpermute_aligned(aligned, grouping, rows).reshape(rows, 8)
        owned = slice(bounds[0], bounds[-1])
        assert torch.equal(back[owned], a[owned])


def test_grouped_kernel_takes_row_experts_or_offsets_and_checks_offsets():
    experts = moe.pack_experts(humming_aot.quantize(torch.randn(3, 128, 128) * 0.05, "int4:g128"))
    a = torch.zeros(10, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="give the experts' rows as row_expert .* or as offsets .*, one of them"):
        moe.gemm_grouped_kernel(a, experts, expected_m=4)
    with pytest.raises(ValueError, match="one of them"):
        moe.gemm_grouped_kernel(a, experts, torch.zeros(10, dtype=torch.int32), offsets=torch.tensor([0, 1, 2, 3]),
                                expected_m=4)
    with pytest.raises(ValueError, match="offsets must be \\(4,\\) int32 or int64"):
        moe.gemm_grouped_kernel(a, experts, offsets=torch.tensor([0, 10]), expected_m=4)
