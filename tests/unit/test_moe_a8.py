"""MoE experts with 8-bit activations (humming_aot/moe/a8.py) without a GPU: the stacked
packing against the dense one, the loops (grouped by offsets, masked) against a float64 product of
each expert's exact operands, the Params bytes the kernels launch with, the keys, the generated
source and the catalog, the errors raised before anything reaches a kernel, and nvcc (slow).
GPU runs: tests/gpu/test_moe_a8_gpu.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from humming_aot import codegen, ops, params_abi, quant, support, w4a8, w8a8
from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.formats import round_to
from humming_aot.moe import (
    PackedW4A8Experts,
    PackedW8A8Experts,
    gemm_grouped_a8,
    gemm_grouped_a8_kernel,
    gemm_masked_a8,
    gemm_masked_a8_kernel,
    pack_a8_experts,
)
from humming_aot.moe import a8 as moe_a8
from humming_aot.spec import GemmType, KernelKey
from humming_aot.testing.nvcc import needs_nvcc

# (weight format, activation format): every W4A8 weight element with each activation element it
# takes, and the three W8A8 scalings
PAIRS = [("int4:g128", "float8e4m3:token"), ("int4:channel", "int8:token"), ("uint4:g128:zp", "int8:token"),
         ("uint4:g256:zp", "float8e4m3:token"), ("mxfp4", "float8e4m3:token"),
         ("float8e4m3:channel", "float8e4m3:token"), ("float8e4m3:b128x128", "float8e4m3:g128"),
         ("int8:channel", "int8:token")]


def _experts(fmt: str, e: int = 4, n: int = 96, k: int = 256, seed: int = 0):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    qw = quant.quantize(w, fmt)
    return qw, pack_a8_experts(qw)


def _activations(shape: tuple[int, ...], fmt: str, seed: int = 1):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return ops.quantize_activation(x, fmt)


def _expected(qa_rows, experts, e: int, bias: torch.Tensor | None) -> torch.Tensor:
    """float64: the rows' exact values (codes x their scales) times expert e's effective weight."""
    from humming_aot.w8a8 import dequantized_activation

    out = dequantized_activation(qa_rows, experts.k) @ experts.expert(e).effective_weight().T
    return out if bias is None else out + bias[e].to(torch.float64)


@pytest.mark.parametrize("fmt,act", PAIRS)
def test_each_expert_packs_as_the_dense_weight(fmt, act):
    from humming_aot.moe import expert_weight

    qw, experts = _experts(fmt)
    w8 = fmt.split(":")[0] in w8a8.ELEMENTS
    assert isinstance(experts, PackedW8A8Experts if w8 else PackedW4A8Experts)
    assert experts.experts == 4 and experts.out_features == 96 and experts.in_features == 256
    assert experts.n == (96 if w8 else 128)  # (W8A8 pads N to 16, W4A8 to 64)
    assert experts.global_scale_tensor.tolist() == [1.0] * 4
    for e in range(4):
        dense = (w8a8 if w8 else w4a8).pack(expert_weight(qw, e))
        mine = experts.expert(e)
        assert type(mine) is type(dense) and torch.equal(mine.w, dense.w) and torch.equal(mine.w_scale, dense.w_scale)
        assert dataclasses.asdict(dataclasses.replace(mine, w=None, w_scale=None)) == \
            dataclasses.asdict(dataclasses.replace(dense, w=None, w_scale=None))
        assert mine.w.data_ptr() == experts.w[e].data_ptr()  # a view
    with pytest.raises(IndexError, match=r"expert 4 of 4"):
        experts.expert(4)


def test_packing_errors_name_the_expert_and_the_fix():
    from humming_aot.moe import pack_w4a8_experts, pack_w8a8_experts

    w = torch.randn(3, 64, 256) * 0.05
    with pytest.raises(ValueError, match=r"expected stacked expert codes \(E, N, K\)"):
        pack_w4a8_experts(quant.quantize(w[0], "int4:g128"))
    with pytest.raises(ValueError, match=r"expert 0: the W4A8 kernels take .* got int4:g64"):
        pack_w4a8_experts(quant.quantize(w, "int4:g64"))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        pack_w4a8_experts(w)
    with pytest.raises(ValueError, match=r"int4 x int4 \(W4A4\) has no MoE kernels"):
        pack_w8a8_experts(quant.quantize(w, "int4:channel"))
    with pytest.raises(ValueError, match="expert 0: "):
        pack_w8a8_experts(quant.quantize(w, "float8e4m3:g64"))


@pytest.mark.parametrize("fmt,act", PAIRS)
def test_the_grouped_loop_is_each_experts_exact_product(fmt, act):
    """Rows by prefix offsets: an empty expert, a skewed one, rows of no expert at both ends (zeros),
    a bias per expert; float16 and bfloat16 outputs."""
    _, experts = _experts(fmt)
    rows = 23
    qa = _activations((rows, 256), act)
    offsets = torch.tensor([2, 2, 17, 19, 21], dtype=torch.int64)  # expert 0 empty, rows 0-1 and 21-22 of none
    bias = (torch.randn(4, 96, generator=torch.Generator().manual_seed(3)) * 0.1).to(torch.bfloat16)
    for out_dtype, b in ((torch.bfloat16, bias), (torch.float16, None)):
        out = gemm_grouped_a8(qa, experts, offsets, bias=None if b is None else b.to(out_dtype), out_dtype=out_dtype)
        assert out.shape == (rows, 96) and out.dtype == out_dtype
        assert torch.equal(out[:2], torch.zeros_like(out[:2])) and torch.equal(out[21:], torch.zeros_like(out[21:]))
        bounds = offsets.tolist()
        for e in range(4):
            lo, hi = bounds[e], bounds[e + 1]
            if hi == lo:
                continue
            expected = _expected(moe_a8._rows(qa, slice(lo, hi)), experts, e,
                                 None if b is None else b.to(out_dtype))
            assert torch.equal(out[lo:hi], round_to(expected, out_dtype)), (fmt, act, e)


@pytest.mark.parametrize("fmt,act", PAIRS[:3])
def test_the_masked_loop_is_each_experts_exact_product(fmt, act):
    _, experts = _experts(fmt, e=3)
    qa = _activations((3, 9, 256), act)
    counts = torch.tensor([9, 0, 4], dtype=torch.int32)
    out = gemm_masked_a8(qa, experts, counts)
    assert out.shape == (3, 9, 96)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[2, 4:], torch.zeros_like(out[2, 4:]))
    for e, count in enumerate(counts.tolist()):
        if count:
            expected = _expected(moe_a8._rows(qa, (e, slice(0, count))), experts, e, None)
            assert torch.equal(out[e, :count], round_to(expected, torch.bfloat16))


def test_a_per_tensor_scale_serves_every_row():
    _, experts = _experts("int4:g128", e=2)
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(4))
    qa = ops.quantize_activation(x, "float8e4m3:tensor", static_scale=0.01)
    rows = moe_a8._rows(qa, slice(1, 4))
    assert rows.scales.shape == (3, 1) and torch.equal(rows.scales.reshape(-1), qa.scales.expand(3))
    out = gemm_grouped_a8(qa, experts, torch.tensor([0, 3, 6]))
    dense = w4a8.gemm(qa, experts.expert(1))
    assert torch.equal(out[3:], dense[3:])


def test_loop_errors_say_what_was_wrong():
    _, experts = _experts("mxfp4", e=2)
    qa = _activations((5, 256), "float8e4m3:token")
    with pytest.raises(ValueError, match=r"offsets must rise from >= 0 to <= R = 5"):
        gemm_grouped_a8(qa, experts, torch.tensor([0, 4, 3]))
    with pytest.raises(ValueError, match=r"offsets must be \(3,\) int32 or int64"):
        gemm_grouped_a8(qa, experts, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="MXFP4 weight .* takes float8e4m3 activations, got int8"):
        gemm_grouped_a8(_activations((5, 256), "int8:token"), experts, torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match="activations have K=128 but the weight has K=256"):
        gemm_grouped_a8(_activations((5, 128), "float8e4m3:token"), experts, torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match=r"masked_m must hold 2 counts in \[0, 5\]"):
        gemm_masked_a8(_activations((2, 5, 256), "float8e4m3:token"), experts, torch.tensor([6, 0]))
    with pytest.raises(ValueError, match="activation codes must have 3 dims"):
        gemm_masked_a8(qa, experts, torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="PackedW4A8Experts"):
        gemm_grouped_a8(qa, experts.expert(0), torch.tensor([0, 2, 5]))
    # the grouped kernel takes offsets or row experts, one of them; K slices are the offsets form's
    with pytest.raises(ValueError, match=r"give the experts' rows as offsets \(E \+ 1,\) or as row_expert"):
        gemm_grouped_a8_kernel(qa, experts, expected_m=2)
    with pytest.raises(ValueError, match="K slices are for the offsets form"):
        gemm_grouped_a8_kernel(qa, experts, row_expert=torch.zeros(5, dtype=torch.int32), expected_m=2, splits=2)
    with pytest.raises(ValueError, match=r"row_expert must be \(5,\) int32"):
        gemm_grouped_a8_kernel(qa, experts, row_expert=torch.zeros(5, dtype=torch.int64), expected_m=2)
    # the kernels, given CPU tensors, point at the loop
    with pytest.raises(ValueError, match=r"must be on one CUDA device; on the CPU, humming_aot.moe.gemm_grouped_a8"):
        gemm_grouped_a8_kernel(qa, experts, torch.tensor([0, 2, 5], dtype=torch.int32), expected_m=2)
    with pytest.raises(ValueError, match=r"must be on one CUDA device; on the CPU, humming_aot.moe.gemm_masked_a8"):
        gemm_masked_a8_kernel(_activations((2, 5, 256), "float8e4m3:token"), experts,
                                torch.tensor([1, 0], dtype=torch.int32))


def test_the_params_are_masked_gemm_params_then_the_row_scales():
    """MaskedScaledGemmParams (kernel/params.cuh, 208 bytes): expert 0's GemmParams with the codes
    (lda in bytes) and K in whole tiles of 128, the masked tail, then the rows' scales pointer, the
    floats between experts' slabs of them, the codes' own K (W4A8) and the floats between rows'
    scales; W8A8's group field is the codes' own K."""
    _, experts = _experts("uint4:g128:zp", e=3, n=192, k=384)
    bias = torch.zeros(3, 192, dtype=torch.bfloat16)
    params = moe_a8.scaled_params(codes=0x1000, lda=384, experts=experts, bias=bias, out=0x2000, m=20, splits=1,
                                  expert_rows=0x3000, a_stride=20 * 384, out_stride=20 * 192 * 2, offsets=0,
                                  a_scale=0x4000, a_scale_stride=20, a_scale_row_stride=1)
    assert len(params) == moe_a8.MASKED_SCALED_PARAMS_BYTES == 208 == params_abi.MASKED_PARAMS_BYTES + 24
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm == (0x1000, experts.w.data_ptr(), experts.w_scale.data_ptr(), 0, bias.data_ptr(), 0x2000, 0, 0,
                    384, 192, 20, 192, 384, 128, 1, 1.0)
    tail = params_abi.MASKED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:params_abi.MASKED_PARAMS_BYTES])
    assert tail[:2] == (0x3000, experts.global_scale_tensor.data_ptr())
    assert tail[2:6] == (experts.w[1].data_ptr() - experts.w[0].data_ptr(),
                         experts.w_scale[1].data_ptr() - experts.w_scale[0].data_ptr(), 0, 192 * 2)
    assert tail[6:] == (20 * 384, 20 * 192 * 2, 3, 0)
    assert moe_a8.SCALED_TAIL.unpack(params[params_abi.MASKED_PARAMS_BYTES:]) == (0x4000, 20, 384, 1)
    # K not a whole number of K tiles: the GEMM's K rounds up, the codes' own K stays
    _, odd = _experts("int4:channel", e=2, n=64, k=272)
    params = moe_a8.scaled_params(codes=0, lda=272, experts=odd, bias=None, out=0, m=5, splits=2, expert_rows=0,
                                  a_stride=0, out_stride=0, offsets=0x5000, a_scale=0, a_scale_stride=0,
                                  a_scale_row_stride=1, workspace=0x6000, counters=0x7000)
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[6:8] == (0x6000, 0x7000) and gemm[12:15] == (384, 384, 2)  # k, group (one spanning K), slices
    assert moe_a8.SCALED_TAIL.unpack(params[params_abi.MASKED_PARAMS_BYTES:])[2] == 272
    # W8A8 block scales: group = the codes' own K, no a_k, K / 128 scales a row
    _, blocks = _experts("float8e4m3:b128x128", e=2, n=256, k=400)
    params = moe_a8.scaled_params(codes=0, lda=400, experts=blocks, bias=None, out=0, m=7, splits=1, expert_rows=0x10,
                                  a_stride=7 * 400, out_stride=7 * 256 * 2, offsets=0, a_scale=0x20,
                                  a_scale_stride=7 * 4, a_scale_row_stride=4)
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[8:15] == (400, 256, 7, 256, 512, 400, 1)  # lda, ldo, m, n, K tiles x 128, the codes' K, slices
    assert moe_a8.SCALED_TAIL.unpack(params[params_abi.MASKED_PARAMS_BYTES:]) == (0x20, 28, 0, 4)
    assert blocks.w_scale.shape == (2, 2, 4) and params_abi.MASKED_TAIL.unpack(
        params[params_abi.GEMM_PARAMS.size:params_abi.MASKED_PARAMS_BYTES])[3] == 2 * 4 * 4  # bytes between experts'
    # block scales


def test_the_row_expert_form_packs_grouped_gemm_params_then_the_row_scales():
    """GroupedScaledGemmParams (176 bytes): GroupedGemmParams of every row with expert 0's weights
    (one K slice), the row experts, ExpertWeights and E, then the rows' scales, the codes' own K
    and the floats between rows' scales; the block rows the form needs for a table tile."""
    _, experts = _experts("mxfp4", e=3, n=192, k=416)
    params = moe_a8.grouped_scaled_params(codes=0x100, lda=416, experts=experts, bias=None, out=0x200, m=64,
                                          row_expert=0x300, a_scale=0x400, a_scale_row_stride=1)
    assert len(params) == moe_a8.GROUPED_SCALED_PARAMS_BYTES == 176 == params_abi.GROUPED_PARAMS_BYTES + 16
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm == (0x100, experts.w.data_ptr(), experts.w_scale.data_ptr(), 0, 0, 0x200, 0, 0,
                    416, 192, 64, 192, 512, 512, 1, 1.0)  # (MXFP4: K tiles x 128, group the fold's span: 4 K tiles)
    assert experts.group_size == 512
    tail = params_abi.GROUPED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:params_abi.GROUPED_PARAMS_BYTES])
    assert tail[:2] == (0x300, experts.global_scale_tensor.data_ptr())
    assert tail[2:] == (experts.w[1].data_ptr() - experts.w[0].data_ptr(),
                        experts.w_scale[1].data_ptr() - experts.w_scale[0].data_ptr(), 0, 0, 3)
    assert moe_a8.GROUPED_SCALED_TAIL.unpack(params[params_abi.GROUPED_PARAMS_BYTES:]) == (0x400, 416, 1)
    for m in (1, 16, 17, 64, 65, 4096):
        assert 128 % moe_a8.grouped_a8_block_m(experts, m) == 0
    _, w8 = _experts("int8:channel")
    assert moe_a8.grouped_a8_block_m(w8, 4096) == 64  # (W8A8_MAX_TILE_ROWS)
    text = (Path(__file__).resolve().parents[2] / "csrc/include/humming_aot/kernel/params.cuh").read_text()
    assert "static_assert(sizeof(GroupedScaledGemmParams) == 176," in text
    assert moe_a8.GROUPED_SCALED_TAIL.format == "<Q2i"


def test_the_params_struct_is_208_bytes_in_the_header():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "csrc/include/humming_aot/kernel/params.cuh").read_text()
    assert "static_assert(sizeof(MaskedScaledGemmParams) == 208," in text
    assert 'Packed as MaskedGemmParams\' bytes, then "<Qq2i" (208 bytes)' in text
    assert moe_a8.SCALED_TAIL.format == "<Qq2i"


def _masked_key(arch: str, weight: str, act: str, tile: str, gemm_type: GemmType = GemmType.MASKED) -> KernelKey:
    """A grouped masked (or contiguous) key: W4A8 for a 4-bit weight element, else W8A8 (weight
    "blocks": float8 per 128 x 128 block)."""
    if weight in ("int8", "float8e4m3", "blocks"):
        key = w8a8.kernel_key(arch, torch.bfloat16, parse_tile_field(tile), weight == "blocks", act)
    else:
        key = w4a8.kernel_key(arch, torch.bfloat16, parse_tile_field(tile), act, weight)
    return dataclasses.replace(key, spec=dataclasses.replace(key.spec, gemm_type=gemm_type))


def test_moe_keys_wrap_the_portable_8bit_bodies_on_scaled_params():
    cases = (("sm80", "uint4", "int8", "mma-w4a8:16x128x128_w1x4_s4", "DenseMmaW4a8"),
             ("sm89", "float4e2m1", "float8e4m3", "mma-w4a8:16x128x128_w1x4_s4", "DenseMmaW4a8"),
             ("sm90a", "int4", "float8e4m3", "mma-w4a8:16x128x128_w1x4_s4", "DenseMmaW4a8"),
             ("sm80", "int8", "int8", "mma-ss:16x128x128_w1x4_s4", "DenseMmaSs"),
             ("sm89", "blocks", "float8e4m3", "mma-ss:64x128x128_w2x2_s4", "DenseMmaSs"),
             ("sm120", "float8e4m3", "float8e4m3", "mma-ss:32x128x128_w1x4_s4", "DenseMmaSs"))
    schedules = {GemmType.MASKED: ("grouped_masked.cuh", "GroupedMasked", "MaskedScaledGemmParams"),
                 GemmType.GROUPED: ("grouped_contiguous.cuh", "GroupedContiguous", "GroupedScaledGemmParams")}
    for arch, weight, act, tile, body in cases:
        for gemm_type, (header, schedule, params) in schedules.items():
            key = _masked_key(arch, weight, act, tile, gemm_type)
            assert KernelKey.from_name(key.name) == key
            assert key.name.startswith(f"gemm_{gemm_type.value}_{arch}_{tile.split(':')[0]}_")
            source = codegen.kernel_source(key)
            assert f"humming_aot::kernel::{schedule}<humming_aot::kernel::{body}<" in source
            assert f"#include <humming_aot/kernel/{header}>" in source
            assert f"const __grid_constant__ humming_aot::kernel::{params} params" in source
            assert codegen.params_type(key) == params
            assert support.is_supported(key.spec, arch)
    # the wgmma bodies have no run_tile: both MoE types take them through the masked schedule (the
    # row-expert form over row blocks: tests/unit/test_moe_a8_ws.py), the mma.sync body's neither;
    # W4A4 has no MoE type; float8 W8A8 MoE on the portable body only where e4m3 mma.sync is native
    # (sm89, sm120: ptxas's emulation spills beside the walk elsewhere)
    with pytest.raises(ValueError, match=r"no kernel body takes float8e4m3 activations or a grouped GEMM yet on mma "
                                         r"tiles .*around mma-w4a8, mma-ss, wgmma-w4a8 and wgmma-ss"):
        codegen.kernel_source(_masked_key("sm90a", "int4", "float8e4m3", "16x256x64_w1x4_s4",
                                          GemmType.GROUPED))
    for weight, tile in (("float8e4m3", "wgmma-ss:64x128x128_w1x8_s6"), ("int4", "wgmma-w4a8:16x128x128_w1x4_s8")):
        assert "RowBlockWalk>;" in codegen.kernel_source(_masked_key("sm90a", weight, "float8e4m3", tile,
                                                                     GemmType.GROUPED))
    # block scales on the masked wgmma-ss schedule: their slots also hold 32 rows' scales, so the
    # channel table's 5-stage 32-row tile no longer fits two CTAs an SM
    with pytest.raises(ValueError, match="masked MoE schedule's ring, staging tile and walk table need 119312"):
        key = _masked_key("sm90a", "blocks", "float8e4m3", "wgmma-ss:32x128x128_w1x4_s5")
        key.tile.body.check_key(key)
    with pytest.raises(ValueError, match="ptxas emulates e4m3 mma.sync on sm90a"):
        key = _masked_key("sm90a", "float8e4m3", "float8e4m3", "mma-ss:16x128x128_w1x4_s4")
        key.tile.body.check_key(key)
    w4a4 = w8a8.kernel_key("sm80", torch.bfloat16, parse_tile_field("mma-ss:16x128x128_w1x4_s4"), False, "int4")
    assert not support.is_supported(dataclasses.replace(w4a4.spec, gemm_type=GemmType.MASKED), "sm80")
    for arch in ("sm90a", "sm100", "sm110"):
        spec = dataclasses.replace(w8a8.gemm_spec(torch.bfloat16, True, "float8e4m3"), gemm_type=GemmType.MASKED)
        # block-scaled and channel-scaled float8 experts: both MoE types on sm90a (its wgmma-ss
        # schedule and the same over row blocks), neither on sm100 / sm110
        channel = dataclasses.replace(w8a8.gemm_spec(torch.bfloat16, False, "float8e4m3"), gemm_type=GemmType.MASKED)
        for masked in (spec, channel):
            for gemm_type in (GemmType.MASKED, GemmType.GROUPED):
                typed = dataclasses.replace(masked, gemm_type=gemm_type)
                assert support.is_supported(typed, arch) == (arch == "sm90a")
                if arch != "sm90a":
                    assert "only on sm89, sm120" in support.why_unsupported(typed, arch)
        assert support.is_supported(_masked_key(arch, "int8", "int8", "mma-ss:16x128x128_w1x4_s4").spec, arch)


def test_the_default_catalog_holds_the_moe_keys_the_tables_pick():
    w4_tiles = {label for _, label in w4a8._SYNC_TILES}
    w8_tiles = {w8a8.select_sync_tile(m).label for m in (1, 16, 17, 32, 33, 64)}
    assert w8a8.select_sync_tile(moe_a8.W8A8_MAX_TILE_ROWS).label in w8_tiles
    for arch, acts, float8_weights in (("sm80", {"int8"}, False), ("sm89", {"int8", "float8e4m3"}, True),
                                       ("sm90a", {"int8", "float8e4m3"}, False),
                                       ("sm120", {"int8", "float8e4m3"}, True)):
        for gemm_type in (GemmType.MASKED, GemmType.GROUPED):
            moe = [k for k in enumerate_keys("default", [arch]) if k.spec.gemm_type is gemm_type]
            w4 = [k for k in moe if k.tile.mma.value == "mma-w4a8"]
            w8 = [k for k in moe if k.tile.mma.value == "mma-ss"]
            assert {k.tile.label for k in w4} == w4_tiles and {k.tile.label for k in w8} == w8_tiles
            assert {k.spec.a_dtype for k in w4} == acts
            assert {k.spec.w_dtype for k in w4} == ({"int4", "uint4"} if arch == "sm80" else
                                                    {"int4", "uint4", "float4e2m1"})
            assert {(k.spec.w_dtype, k.spec.w_scale.value) for k in w8} == (
                {("int8", "g"), ("float8e4m3", "g"), ("float8e4m3", "b")} if float8_weights else {("int8", "g")})
            assert {k.spec.out_dtype for k in moe if k.spec.a_is_quantized} == {"bfloat16", "float16"}
    for m in (1, 16, 17, 64, 65, 4096):
        assert w4a8.select_sync_tile(m).label in w4_tiles
    # and sm90a's default tiles of float8 W4A8 experts (both MoE types on the wgmma-w4a8 body;
    # tests/unit/test_moe_a8_ws.py checks every wgmma MoE key)
    from humming_aot.moe import a8_launch

    ws = [k for k in enumerate_keys("default", ["sm90a"]) if k.tile.mma.value == "wgmma-w4a8"
          and k.spec.gemm_type is not GemmType.DENSE]
    assert {(k.spec.gemm_type, k.spec.a_dtype) for k in ws} == {(GemmType.MASKED, "float8e4m3"),
                                                                 (GemmType.GROUPED, "float8e4m3")}
    assert {(k.tile.label, k.spec.w_dtype, k.spec.out_dtype) for k in ws} == {
        (label, w, o) for _, label in a8_launch.WS_TILES for w in ("int4", "uint4", "float4e2m1")
        for o in ("bfloat16", "float16")}


@pytest.mark.slow
@needs_nvcc
def test_nvcc_compiles_the_masked_keys_without_spills(tmp_path):
    from test_build_nvcc import _ptxas_report, _spill_bytes

    keys = [_masked_key(arch, weight, act, label) for _, label in w4a8._SYNC_TILES
            for arch, weight, act in (("sm80", "uint4", "int8"), ("sm89", "float4e2m1", "float8e4m3"))]
    keys += [_masked_key("sm90a", "int4", "float8e4m3", "mma-w4a8:64x128x128_w2x4_s4")]
    keys += [_masked_key(arch, weight, act, label, gemm_type)
             for label in ("mma-ss:16x128x128_w1x4_s4", "mma-ss:64x128x128_w2x2_s4")
             for arch, weight, act in (("sm80", "int8", "int8"), ("sm89", "blocks", "float8e4m3"),
                                       ("sm120", "float8e4m3", "float8e4m3"), ("sm90a", "int8", "int8"))
             for gemm_type in (GemmType.MASKED, GemmType.GROUPED)]
    keys += [_masked_key("sm90a", "float4e2m1", "float8e4m3", "mma-w4a8:32x128x128_w1x4_s4", GemmType.GROUPED)]
    for key in keys:
        report = _ptxas_report(key, tmp_path)
        assert _spill_bytes(report) == 0, (key.name, report)


@pytest.mark.parametrize("fmt,act", [PAIRS[0], PAIRS[2], PAIRS[4], PAIRS[6], PAIRS[7]])
def test_the_layer_is_the_routed_dense_steps(fmt, act):
    """QuantizedMoE.from_experts(..., activations=...) gives a A8MoE whose output is, bit for bit,
    the combine of each routed (token, expert) pair's dense steps: quantize, GEMM1, silu_and_mul,
    quantize, GEMM2 (per-row quantization and the float64 reference make every row independent)."""
    from humming_aot import moe
    from humming_aot.moe.layer_a8 import A8MoE
    from humming_aot.nn import QuantizedMoE

    gen = torch.Generator().manual_seed(7)
    e, h, i, tokens, top_k = 6, 256, 128, 5, 2
    gate_up = torch.randn(e, 2 * i, h, generator=gen) * 0.05
    down = torch.randn(e, h, i, generator=gen) * 0.05
    layer = QuantizedMoE.from_experts(gate_up, down, fmt, activations=act)
    assert isinstance(layer, A8MoE) and layer.activations == act
    x = torch.randn(tokens, h, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, e, (tokens, top_k), generator=gen)
    weights = torch.rand(tokens, top_k, generator=gen)
    y = layer(x, ids, weights)
    routing = moe.group_rows(ids, e)
    rows = []
    for slot in routing.slot_of_row.tolist():
        t, ex = slot // top_k, int(ids.reshape(-1)[slot])
        g = ops.gemm(ops.quantize_activation(x[t:t + 1], act), layer.gate_up.expert(ex))
        rows.append(ops.gemm(ops.quantize_activation(moe.silu_and_mul(g), act), layer.down.expert(ex)))
    expected = moe.combine(torch.cat(rows), routing, weights)
    assert y.shape == (tokens, h) and torch.equal(y, expected)
    # the state dict round trip, and the errors
    again = QuantizedMoE.from_experts(torch.zeros_like(gate_up), torch.zeros_like(down), fmt, activations=act)
    again.load_state_dict(layer.state_dict())
    assert torch.equal(again(x, ids, weights), y)
    with pytest.raises(ValueError, match=r"hidden must be \(\.\.\., 256\) torch.bfloat16"):
        layer(x.float(), ids, weights)
    with pytest.raises(ValueError, match=r"topk_ids and topk_weights must be \(5, top_k\)"):
        layer(x, ids[:4], weights[:4])


def test_layer_errors_say_what_to_do():
    from humming_aot.moe.layer_a8 import A8MoE

    gen = torch.Generator().manual_seed(8)
    gate_up, down = torch.randn(2, 256, 128, generator=gen), torch.randn(2, 128, 128, generator=gen)
    with pytest.raises(ValueError, match=r"activations 'float8e4m3:g128' do not suit the int4:g128 experts \(K = 128\): .* "
                                         r"quantize with 'float8e4m3:token'"):
        A8MoE.from_experts(gate_up, down, "float8e4m3:g128", "int4:g128")
    with pytest.raises(ValueError, match=r"gate_up must be \(E, 2 I, H\) and down \(E, H, I\)"):
        A8MoE.from_experts(gate_up, torch.randn(2, 128, 256), "int8:token", "int4:g128")
    with pytest.raises(ValueError, match="give fmt to quantize it"):
        A8MoE.from_experts(gate_up, down, "int8:token")
    with pytest.raises(ValueError, match=r"experts take 8-bit activations"):
        A8MoE.from_experts(gate_up, down, "nvfp4", "int4:g128")
    with pytest.raises(ValueError, match=r"do not suit the float8e4m3:b128x128 experts \(K = 128\): .* "
                                         r"'float8e4m3:g128'"):
        A8MoE.from_experts(gate_up, down, "float8e4m3:token", "float8e4m3:b128x128")
    # GEMM2's experts are checked too: another format, or an intermediate the groups do not divide
    from humming_aot.moe import pack_a8_experts

    blocks_gu = pack_a8_experts(quant.quantize(torch.randn(2, 192, 128, generator=gen), "float8e4m3:b128x128"))
    blocks_down = pack_a8_experts(quant.quantize(torch.randn(2, 128, 96, generator=gen), "float8e4m3:b128x128"))
    with pytest.raises(ValueError, match=r"do not suit the float8e4m3:b128x128 experts \(K = 96\)"):
        A8MoE(blocks_gu, blocks_down, "float8e4m3:g128")
    int8_down = pack_a8_experts(quant.quantize(torch.randn(2, 128, 128, generator=gen), "int8:channel"))
    blocks_gu = pack_a8_experts(quant.quantize(torch.randn(2, 256, 128, generator=gen), "float8e4m3:b128x128"))
    with pytest.raises(ValueError, match=r"do not suit the int8:channel experts"):
        A8MoE(blocks_gu, int8_down, "float8e4m3:g128")
    # W4A8 codes carry their packed layout version through the state dict
    layer = A8MoE.from_experts(gate_up, down, "int8:token", "int4:g128")
    state = layer.state_dict()
    assert int(state["packed_layout_version"]) == w4a8.LAYOUT_VERSION
    state["packed_layout_version"] = torch.tensor(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="holds W4A8 codes in packed layout version 1, but this humming_aot reads"):
        layer.load_state_dict(state)
    del state["packed_layout_version"]
    with pytest.raises(ValueError, match="records no packed layout version"):
        layer.load_state_dict(state)
    layer = A8MoE.from_experts(gate_up, down, "int8:tensor", "int4:g128")
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    ids, weights = torch.tensor([[0], [1], [1]]), torch.ones(3, 1)
    with pytest.raises(ValueError, match=r"per-tensor activations need static scales: call module.set_static_scales"):
        layer(x, ids, weights)
    layer.set_static_scales(0.05, 0.01)
    y = layer(x, ids, weights)
    assert y.shape == (3, 128)
    again = A8MoE.from_experts(gate_up, down, "int8:tensor", "int4:g128")
    again.load_state_dict(layer.state_dict())  # (the static scales are in it)
    assert torch.equal(again(x, ids, weights), y)
    # no token (one rank of several may have none): zeros of (0, H)
    assert layer(x[:0], ids[:0], weights[:0]).shape == (0, 128)


def test_a_cast_of_the_layer_keeps_the_packed_dtypes_and_moves_the_output_dtype():
    """module.to(torch.float16) (a whole model cast) leaves the codes, scales and global scales as
    packed (the kernels read them so) and moves the biases and the output dtype; the result is the
    float16 layer's."""
    from humming_aot.moe.layer_a8 import A8MoE

    gen = torch.Generator().manual_seed(9)
    gate_up, down = torch.randn(3, 256, 128, generator=gen) * 0.05, torch.randn(3, 128, 128, generator=gen) * 0.05
    bias = (torch.randn(3, 256, generator=gen) * 0.1).to(torch.bfloat16).float()  # (exact in both 16-bit dtypes)
    for fmt, act in (("float8e4m3:channel", "float8e4m3:token"), ("uint4:g128:zp", "int8:token")):
        layer = A8MoE.from_experts(gate_up, down, act, fmt, gate_up_bias=bias)
        dtypes = {name: b.dtype for name, b in layer.named_buffers() if "bias" not in name}
        layer = layer.to(torch.float16)
        assert {name: b.dtype for name, b in layer.named_buffers() if "bias" not in name} == dtypes
        assert layer.out_dtype == torch.float16 and layer.gate_up_bias.dtype == torch.float16
        half = A8MoE.from_experts(gate_up, down, act, fmt, gate_up_bias=bias, out_dtype=torch.float16)
        x = torch.randn(4, 128, generator=gen).to(torch.float16)
        ids, weights = torch.tensor([[0, 2], [1, 2], [2, 0], [1, 1]]), torch.rand(4, 2, generator=gen)
        assert torch.equal(layer(x, ids, weights), half(x, ids, weights))
        assert layer.half().out_dtype == torch.float16 and layer.float().out_dtype == torch.float16


def test_nvrtc_compiles_a_masked_key():
    """The JIT fallback builds the masked schedule around the mma-w4a8 body too (its source uses
    no header NVRTC lacks)."""
    from humming_aot import jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the test compiles with NVRTC", "to compile")
    if why is not None:
        pytest.skip(why)
    image = jit.compile_kernel(_masked_key("sm89", "uint4", "float8e4m3", "mma-w4a8:16x128x128_w1x4_s4"))
    assert len(image) > 10000


@pytest.mark.parametrize("fmt,act", [PAIRS[0], PAIRS[4], PAIRS[6]])
def test_the_indexed_layout_is_each_slots_dense_product(fmt, act):
    """gemm_indexed_a8 on align_block_size's layout (the loop on the CPU): each routed slot's row
    times its expert, times its routing weight, for both GEMMs' row forms; an id out of range's
    slot (dropped by a kernel-made routing) is zeros; a routing with an expert_map is refused."""
    from humming_aot.moe import align_block_size, gemm_indexed_a8

    _, experts = _experts(fmt, e=5)
    gen = torch.Generator().manual_seed(11)
    tokens, top_k = 7, 2
    ids = torch.stack([torch.randperm(5, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    routing = align_block_size(ids, 5, 16)
    for rows_per_token, shape in ((top_k, (tokens, 256)), (1, (tokens * top_k, 256))):
        qa = _activations(shape, act, seed=rows_per_token)
        for w in (None, weights):
            out = gemm_indexed_a8(qa, experts, routing, a_rows_per_token=rows_per_token, topk_weights=w)
            assert out.shape == (tokens * top_k, 96)
            for t in range(tokens * top_k):
                e = int(ids.reshape(-1)[t])
                row = ops.gemm(moe_a8._rows(qa, slice(t // rows_per_token, t // rows_per_token + 1)),
                               experts.expert(e))
                if w is not None:
                    row = (row.float() * w.reshape(-1)[t]).to(torch.bfloat16)
                assert torch.equal(out[t], row[0]), (fmt, t)
    with pytest.raises(ValueError, match="the routing holds no offsets of these 5 experts"):
        mapped = align_block_size(ids, 5, 16, expert_map=torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32))
        gemm_indexed_a8(_activations((tokens, 256), act), experts, mapped, a_rows_per_token=top_k)
    with pytest.raises(ValueError, match=r"a_rows_per_token must be the routing's top_k \(2"):
        gemm_indexed_a8(_activations((tokens, 256), act), experts, routing, a_rows_per_token=3)
