"""8-bit-activation MoE experts on the warp-specialized Hopper bodies (kernel/grouped_masked_scaled_ws.cuh
around kernel/dense_wgmma_w4a8.cuh and kernel/dense_wgmma_ss.cuh, sm90a): the grouped masked
schedule and its offsets form through every tile of humming_aot.moe.a8_launch.WS_TILES (int4,
uint4 with zero points and MXFP4 experts x float8), W8A8_WS_TILES (float8 x float8 and int8 x
int8 with channel scales) and W8A8_BLOCK_WS_TILES (DeepSeek-V3's float8 experts with 128 x 128
block scales x float8 rows with a scale per 128 of K, whose tiles of more than 16 rows gather
those scales and the weight-block scales into the ring from two more producer warps, taking
turns; and the block-scaled probe tiles outside the table). Each expert's rows against the
float64 product of its exact operands (the dense W4A8 sum bound), NaN-poisoned outputs whose rows past each count or of
no expert must stay NaN, skewed and empty routing, odd N (padded by pack), K off the K tile of
128, E past one window of the walk's table (256), the offsets and slab forms giving the same
bits, a bias with float16 output, and CUDA graph replays; and the row-expert form (DeepGEMM's
contiguous layout, the same schedule over row blocks: schedule/row_block_walk.cuh) of every one of
them. Fresh random data each run (seed printed)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from humming_aot import ops, quant, w4a8, w8a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.moe import a8 as moe_a8
from humming_aot.moe import a8_launch, gemm_grouped_a8_kernel, gemm_masked_a8_kernel, pack_a8_experts
from humming_aot.spec import GemmType
from humming_aot.testing.w8a8 import (
    assert_graph_replay_is_eager,
    assert_offsets_rows_match_slabs,
    assert_within_sum_bound,
)
from humming_aot.testing.w8a8 import fresh_seed as _seed

pytestmark = pytest.mark.gpu

_TILES = [label for _, label in a8_launch.WS_TILES]
_W8_TILES = [label for _, label in a8_launch.W8A8_WS_TILES]
# (each tile once, by rows: the 128-row tile takes two rows of the table, either side of the
# 160-row one, whose serial promotion reads the staged token scales pair by pair: log section 61)
_BLOCK_TILES = sorted(dict.fromkeys(label for _, label in a8_launch.W8A8_BLOCK_WS_TILES),
                      key=lambda label: parse_tile_field(label).block_m)
_FORMATS = {"int4": "int4:g128", "uint4": "uint4:g128:zp", "float4e2m1": "mxfp4", "float8e4m3": "float8e4m3:channel",
            "int8": "int8:channel", "blocks": "float8e4m3:b128x128"}
_W8 = ("float8e4m3", "int8", "blocks")


def _tiles(weight: str) -> list[str]:
    return _BLOCK_TILES if weight == "blocks" else _W8_TILES if weight in _W8 else _TILES


def _act(weight: str, granularity: str = "token") -> str:
    if weight == "blocks":
        return "float8e4m3:g128"  # (a scale per row and 128 of K)
    return f"{'int8' if weight == 'int8' else 'float8e4m3'}:{granularity}"


def _keys() -> list:
    keys = []
    for weight in _FORMATS:
        for label in _tiles(weight):
            for dtype in (torch.bfloat16, torch.float16):
                tile = parse_tile_field(label)
                element = "float8e4m3" if weight == "blocks" else weight
                key = (w8a8.kernel_key("sm90a", dtype, tile, weight == "blocks", element) if weight in _W8
                       else w4a8.kernel_key("sm90a", dtype, tile, "float8e4m3", weight))
                # (the row-expert form's tiles divide its 128-row alignment: a8_launch.row_expert_table)
                types = (GemmType.MASKED, GemmType.GROUPED) if 128 % tile.block_m == 0 else (GemmType.MASKED,)
                keys += [dataclasses.replace(key, spec=dataclasses.replace(key.spec, gemm_type=t)) for t in types]
    return keys


@pytest.fixture(autouse=True)
def _sm90a():
    from humming_aot import dispatch
    from humming_aot.catalog import installed_catalog
    from humming_aot.testing.jit import why_no_jit

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if "sm90a" not in dispatch.device_info(torch.cuda.current_device()).arches:
        pytest.skip("the wgmma-w4a8 MoE kernels run on sm90a (H100, H200) only")
    why = why_no_jit("the wgmma-w4a8 MoE kernels must come from the installed catalog",
                     "to build the wgmma-w4a8 MoE kernels")
    catalog = installed_catalog()
    if why is not None and (catalog is None or any(catalog.lookup(key.name) is None for key in _keys())):
        pytest.skip(why)


def _experts(weight: str, e: int, n: int, k: int, gen: torch.Generator, fmt: str | None = None):
    w = torch.randn(e, n, k, generator=gen) * (0.02 + 0.1 * torch.rand(e, n, 1, generator=gen))
    return pack_a8_experts(quant.quantize(w.cuda(), fmt or _FORMATS[weight]))


def _activations(shape, gen: torch.Generator, fmt: str = "float8e4m3:token"):
    x = torch.randn(*shape, generator=gen) * (0.5 + torch.rand(*shape[:-1], 1, generator=gen))
    return ops.quantize_activation(x.cuda().to(torch.bfloat16), fmt,
                                   **({"static_scale": 0.02} if fmt.endswith(":tensor") else {}))


def _check_rows(y, qa_rows, experts, e: int, bias=None, out_dtype=torch.bfloat16) -> None:
    assert_within_sum_bound(y, qa_rows, experts.expert(e), None if bias is None else bias[e], out_dtype)


def _check_offsets(y, qa, experts, offsets, bias=None) -> list[int]:
    """Each expert's rows of an offsets-form call (expert e owns rows [offsets[e], offsets[e + 1]));
    the experts with rows, in order."""
    torch.cuda.synchronize()
    bounds = offsets.tolist()
    held = [ex for ex in range(len(bounds) - 1) if bounds[ex + 1] > bounds[ex]]
    for ex in held:
        lo, hi = bounds[ex], bounds[ex + 1]
        _check_rows(y[lo:hi], moe_a8._rows(qa, slice(lo, hi)), experts, ex, bias)
    return held


def _check_slabs(y, qa, experts, counts, bias=None, out_dtype=torch.bfloat16) -> None:
    """Each expert's counted rows of a masked call's output (synchronized first)."""
    torch.cuda.synchronize()
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex, bias, out_dtype)


@pytest.mark.parametrize("weight", list(_FORMATS))
@pytest.mark.parametrize("index", range(6))
def test_masked_rows_match_float64_and_leave_the_rest(weight, index):
    """Slabs of 0 to more than two row tiles per expert (the 192-row tile: one partial), odd N."""
    if index >= len(_tiles(weight)):
        pytest.skip(f"the {weight} experts' table has {len(_tiles(weight))} tiles")
    tile = _tiles(weight)[index]
    gen = torch.Generator().manual_seed(_seed())
    block_m = parse_tile_field(tile).block_m
    e, n, k = 5, 150, 384
    max_m = 2 * block_m + 3
    experts = _experts(weight, e, n, k, gen)
    qa = _activations((e, max_m, k), gen, _act(weight))
    counts = torch.tensor([max_m, 0, 5, block_m, 1], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, out=out, tile=tile)
    torch.cuda.synchronize()
    assert y.shape == (e, max_m, n)
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex)
        assert torch.isnan(out[ex, count:]).all(), f"expert {ex}: rows past its count were written"


@pytest.mark.parametrize("weight, tile", [(w, _tiles(w)[i]) for w in _FORMATS for i in (0, 3, -1)]
                         + [("blocks", a8_launch.W8A8_BLOCK_WS_TILES[-1][1])])  # (the tile past the table's rows)
def test_offsets_rows_match_float64_and_the_slab_form_bit_for_bit(weight, tile):
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 4, 256, 512
    experts = _experts(weight, e, n, k, gen)
    bounds = [3, 3, 140, 141, 260]
    rows = 264
    qa = _activations((rows, k), gen, _act(weight))
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=64, out=out, tile=tile)
    torch.cuda.synchronize()
    assert torch.isnan(y[:3]).all() and torch.isnan(y[260:]).all(), "rows of no expert were written"
    assert_offsets_rows_match_slabs(y, qa, experts, bounds, tile)
    if weight not in _W8:
        with pytest.raises(ValueError, match="one K slice"):
            gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=64, tile=tile, splits=2)
        return
    for splits in (2, 4):  # wgmma-ss slices K (4 K tiles: 2 x 2, 4 x 1): within the bound, the same bits twice
        sliced = [gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=64, tile=tile, splits=splits)
                  for _ in range(2)]
        torch.cuda.synchronize()
        assert torch.equal(sliced[0], sliced[1]), f"{splits} K slices: two runs differ"
        for ex in range(e):
            lo, hi = bounds[ex], bounds[ex + 1]
            if hi > lo:
                _check_rows(sliced[0][lo:hi], moe_a8._rows(qa, slice(lo, hi)), experts, ex)


@pytest.mark.parametrize("weight", [w for w in _FORMATS if w != "blocks"])
def test_k_off_the_k_tile_and_channel_scales(weight):
    """K = 400 (416 for MXFP4): the maps read zeros past the codes' own K inside the last K tile;
    per-channel scales for the integer formats; the default tile of 9 expected rows. (Block-scaled
    rows need K a multiple of their group of 128: test_block_scales_on_long_k.)"""
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 3, 24, 128, 416 if weight == "float4e2m1" else 400
    fmt = {"int4": "int4:channel", "uint4": "uint4:channel:zp"}.get(weight, _FORMATS[weight])
    experts = _experts(weight, e, n, k, gen, fmt)
    qa = _activations((e, max_m, k), gen, _act(weight))
    counts = torch.tensor([24, 3, 0], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, out=out, expected_m=9)
    torch.cuda.synchronize()
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex)
        assert torch.isnan(out[ex, count:]).all()


def test_many_experts_skewed_past_one_walk_window():
    """E = 300, 40 tokens top-4: most rows on two experts, many experts empty, by offsets."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k, tokens, top_k = 300, 128, 256, 40, 4
    experts = _experts("int4", e, n, k, gen)
    hot = torch.tensor([7, 299])
    ids = torch.stack([torch.cat([hot, torch.randperm(e, generator=gen)[:top_k]])[:top_k] if t % 3 else
                       torch.randperm(e, generator=gen)[:top_k] for t in range(tokens)]).reshape(-1)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=e)
    bounds = [0] + torch.cumsum(counts, 0).tolist()
    x = _activations((tokens, k), gen)
    rows = dataclasses.replace(x, codes=x.codes[order // top_k].contiguous(),
                               scales=x.scales[order // top_k].contiguous())
    offsets = torch.tensor(bounds, dtype=torch.int64, device="cuda")
    for expected in (1, 32):
        y = gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=expected,
                                   tile=a8_launch.ws_tile(experts, expected))
        torch.cuda.synchronize()
        for ex in torch.nonzero(counts).reshape(-1).tolist():
            lo, hi = bounds[ex], bounds[ex + 1]
            _check_rows(y[lo:hi], moe_a8._rows(rows, slice(lo, hi)), experts, ex)


def test_bias_float16_and_a_per_tensor_scale():
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 3, 70, 96, 256
    experts = _experts("uint4", e, n, k, gen)
    qa = _activations((e, max_m, k), gen, "float8e4m3:tensor")
    bias = (torch.randn(e, n, generator=gen) * 0.1).to(torch.float16).cuda()
    counts = torch.tensor([70, 7, 0], dtype=torch.int32, device="cuda")
    for tile in (_TILES[1], _TILES[4]):
        y = gemm_masked_a8_kernel(qa, experts, counts, bias=bias, out_dtype=torch.float16, tile=tile)
        assert y.dtype == torch.float16
        _check_slabs(y, qa, experts, counts, bias, torch.float16)
    experts = _experts("float8e4m3", e, n, k, gen)  # and W8A8 (channel x tensor scales)
    for tile in (_W8_TILES[0], _W8_TILES[3]):
        y = gemm_masked_a8_kernel(qa, experts, counts, bias=bias, out_dtype=torch.float16, tile=tile)
        _check_slabs(y, qa, experts, counts, bias, torch.float16)


def test_a_cuda_graph_replays_both_forms():
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 8, 40, 128, 256
    experts = _experts("float4e2m1", e, n, k, gen)
    qa = _activations((e, max_m, k), gen)
    counts = torch.randint(0, max_m + 1, (e,), generator=gen, dtype=torch.int32).cuda()
    assert_graph_replay_is_eager(lambda: gemm_masked_a8_kernel(qa, experts, counts, expected_m=20))
    rows = dataclasses.replace(qa, codes=qa.codes.reshape(e * max_m, k), scales=qa.scales.reshape(e * max_m, 1))
    offsets = torch.arange(0, e * max_m + 1, max_m, dtype=torch.int32, device="cuda")
    assert_graph_replay_is_eager(lambda: gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=40))


def test_the_default_tile_is_the_ws_table_and_int8_stays_portable():
    gen = torch.Generator().manual_seed(_seed())
    experts = _experts("int4", 2, 128, 256, gen)
    qa = _activations((2, 16, 256), gen)
    for rows in (1, 16, 100, 2000):
        tile, loaded = a8_launch.select_kernel(qa, experts, torch.bfloat16, rows, None, "test")
        assert tile == a8_launch.ws_tile(experts, rows) and "wgmma-w4a8" in loaded.name
    w8 = _experts("int8", 2, 128, 256, gen)
    tile, loaded = a8_launch.select_kernel(_activations((2, 16, 256), gen, "int8:token"), w8, torch.bfloat16, 100,
                                           None, "test")
    assert tile == a8_launch.ws_tile(w8, 100) and "wgmma-ss" in loaded.name
    q8 = _activations((2, 16, 256), gen, "int8:token")
    tile, _ = a8_launch.select_kernel(q8, experts, torch.bfloat16, 100, None, "test")
    assert tile.mma.value == "mma-w4a8"
    with pytest.raises(ValueError, match="wgmma-w4a8 tiles on sm90a in the masked schedule"):
        a8_launch.select_kernel(q8, experts, torch.bfloat16, 100, _TILES[0], "test")


@pytest.mark.parametrize("weight", _W8)
def test_few_rows_on_long_k_slice_k_on_the_wgmma_ss_schedule(weight):
    """W8A8 experts by offsets with a handful of rows on K = 7168 (DeepSeek-V3 TP8's gate_up at one
    token): the default call slices K on the wgmma-ss schedule (no portable float8 kernel on
    sm90a), matches float64 with a bias, gives the same bits twice and replays in a CUDA graph."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k, rows = 16, 256, 7168, 5
    experts = _experts(weight, e, n, k, gen)
    qa = _activations((rows, k), gen, _act(weight))
    bias = (torch.randn(e, n, generator=gen) * 0.1).to(torch.bfloat16).cuda()
    offsets = torch.tensor([0] * 3 + [1, 2, 4, 5] + [5] * 10, dtype=torch.int32, device="cuda")
    call = lambda: gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=1, bias=bias)  # noqa: E731
    y, again = call(), call()
    torch.cuda.synchronize()
    assert torch.equal(y, again)
    assert _check_offsets(y, qa, experts, offsets, bias) == [2, 3, 4, 5]
    assert_graph_replay_is_eager(call)


def test_k_slices_with_many_experts_and_fewer_ctas_than_tiles():
    """K slices (forced 4 on K = 1024) with E = 300 skewed by offsets (several experts per bucket of
    the walk's table) and more tiles than CTAs (each CTA walks several tiles per slice): every
    tile's slices meet once (the same bits twice, within the bound)."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k, tokens, top_k = 300, 256, 1024, 40, 4
    experts = _experts("float8e4m3", e, n, k, gen)
    ids = torch.stack([torch.cat([torch.tensor([7, 299]), torch.randperm(e, generator=gen)])[:top_k] if t % 3 else
                       torch.randperm(e, generator=gen)[:top_k] for t in range(tokens)]).reshape(-1)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=e)
    bounds = [0] + torch.cumsum(counts, 0).tolist()
    x = _activations((tokens, k), gen)
    rows = dataclasses.replace(x, codes=x.codes[order // top_k].contiguous(), scales=x.scales[order // top_k].contiguous())
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    tile = _W8_TILES[0]
    from humming_aot.moe import kernels as moe_kernels

    bound = moe_kernels.offsets_tile_bound(tokens * top_k, e, n, parse_tile_field(tile))  # (20 + 160) x 2
    assert bound > 2 * 132 // 4  # more tiles than CTAs per slice (two an SM, 132 SMs, 4 slices)
    runs = [gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=1, tile=tile, splits=4) for _ in range(2)]
    torch.cuda.synchronize()
    assert torch.equal(runs[0], runs[1])
    for ex in torch.nonzero(counts).reshape(-1).tolist():
        lo, hi = bounds[ex], bounds[ex + 1]
        _check_rows(runs[0][lo:hi], moe_a8._rows(rows, slice(lo, hi)), experts, ex)


def _few_rows_on_long_k():
    """DeepSeek-V3 TP8's gate_up at one token's shape: four experts of one row each on K = 7168
    (experts 2, 3, 4 and 5 own rows 0, 1, 2 and 3)."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 16, 256, 7168
    experts = _experts("int4", e, n, k, gen)
    qa = _activations((4, k), gen)
    offsets = torch.tensor([0] * 3 + [1, 2, 3, 4] + [4] * 10, dtype=torch.int32, device="cuda")
    return experts, qa, offsets


def test_few_rows_on_long_k_take_the_portable_k_slices():
    """The offsets form with a handful of rows on long K runs the portable body's K slices
    (a8_launch.portable_slices_win: the wgmma-w4a8 schedule runs one K slice a tile) and matches
    float64; so does the wgmma-w4a8 tile, forced."""
    experts, qa, offsets = _few_rows_on_long_k()
    pick = a8_launch.portable_slices_win(qa, experts, torch.bfloat16, 4, 1, 7168 // 128, "test")
    assert pick is not None and pick[0].mma.value == "mma-w4a8"
    y = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=1)
    assert _check_offsets(y, qa, experts, offsets) == [2, 3, 4, 5]
    ws = a8_launch.ws_tile(experts, 1)
    assert ws.mma.value == "wgmma-w4a8"
    y = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=1, tile=ws)
    assert _check_offsets(y, qa, experts, offsets) == [2, 3, 4, 5]


@pytest.mark.parametrize("splits", [1, 2, 4, 7, 8, 14, 56])
def test_few_rows_on_long_k_on_the_portable_k_slices(splits):
    """The same rows on the portable body's table tile in 1 to 56 forced K slices (an H100 run of
    session 53 compared each row with the expert after its own and took that for a bug of the
    slices: log section 58): float64's sums, the same bits twice."""
    experts, qa, offsets = _few_rows_on_long_k()
    tile = moe_a8.sync_tile(experts, 1)
    y = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=1, tile=tile, splits=splits)
    again = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=1, tile=tile, splits=splits)
    assert _check_offsets(y, qa, experts, offsets) == [2, 3, 4, 5]
    assert torch.equal(y, again)


@pytest.mark.parametrize("tile", _BLOCK_TILES)
def test_block_scales_on_long_k(tile):
    """DeepSeek-V3's block-scaled experts through each tile of the table on K = 2048
    (16 K tiles: the ring laps within a tile, so the gathering warps' fills must follow the
    producer's), rows past one tile and not on its bound, odd N: every K block weighed by its own
    scales, against float64."""
    gen = torch.Generator().manual_seed(_seed())
    block_m = parse_tile_field(tile).block_m
    e, n, k = 3, 200, 2048
    max_m = block_m + 5
    experts = _experts("blocks", e, n, k, gen)
    qa = _activations((e, max_m, k), gen, _act("blocks"))
    counts = torch.tensor([max_m, 3, block_m - 1], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, out=out, tile=tile)
    torch.cuda.synchronize()
    for ex, count in enumerate(counts.tolist()):
        _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex)
        assert torch.isnan(out[ex, count:]).all(), f"expert {ex}: rows past its count were written"


def test_block_scales_with_a_bias_float16_and_the_default_tile():
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 3, 70, 256, 512
    experts = _experts("blocks", e, n, k, gen)
    qa = _activations((e, max_m, k), gen, _act("blocks"))
    bias = (torch.randn(e, n, generator=gen) * 0.1).to(torch.float16).cuda()
    counts = torch.tensor([70, 7, 0], dtype=torch.int32, device="cuda")
    for expected in (7, 70):
        tile, loaded = a8_launch.select_kernel(qa, experts, torch.float16, expected, None, "test")
        assert tile == a8_launch.ws_tile(experts, expected) and "wgmma-ss" in loaded.name
        assert tile.label == w8a8.table_tile(a8_launch.W8A8_BLOCK_WS_TILES, expected).label
        y = gemm_masked_a8_kernel(qa, experts, counts, bias=bias, out_dtype=torch.float16, expected_m=expected)
        _check_slabs(y, qa, experts, counts, bias, torch.float16)


def test_the_block_scaled_layer_matches_its_reference_path_and_replays():
    """QuantizedMoE with DeepSeek-V3's formats (float8e4m3:b128x128 experts, float8e4m3:g128 rows)
    on sm90a, both GEMMs on the offsets form of the wgmma-ss schedule, against the same module's
    CPU path (a few code steps of the output's scale: the intermediate re-quantization may round
    a code the other way), then a CUDA graph replay of the forward."""
    from humming_aot.nn import QuantizedMoE

    gen = torch.Generator().manual_seed(_seed())
    e, h, i, tokens, top_k = 16, 512, 256, 64, 4
    gate_up = torch.randn(e, 2 * i, h, generator=gen) * 0.05
    down = torch.randn(e, h, i, generator=gen) * 0.05
    layer = QuantizedMoE.from_experts(gate_up, down, "float8e4m3:b128x128", activations="float8e4m3:g128")
    x = torch.randn(tokens, h, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    expected = layer(x, ids, weights).double()
    layer = layer.to("cuda")
    args = (x.cuda(), ids.cuda(), weights.cuda())
    y = layer(*args)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert (y.double().cpu() - expected).abs().max().item() <= 2.0**-4 * expected.abs().max().item()
    assert_graph_replay_is_eager(lambda: layer(*args))


def _row_layout(counts: list[int], align: int, tail_blocks: int = 1):
    """DeepGEMM's contiguous layout: each expert's rows from a multiple of `align`, padded with row
    expert -1 to the next one, then `tail_blocks` blocks of padding only; (row_expert on the GPU,
    each expert's first row, R)."""
    row_expert, starts, at = [], [], 0
    for ex, count in enumerate(counts):
        starts.append(at)
        size = -(-count // align) * align
        row_expert += [ex] * count + [-1] * (size - count)
        at += size
    row_expert += [-1] * (align * tail_blocks)
    return torch.tensor(row_expert, dtype=torch.int32, device="cuda"), starts, len(row_expert)


@pytest.mark.parametrize("weight", list(_FORMATS))
@pytest.mark.parametrize("index", range(5))
def test_the_row_expert_form_matches_float64_and_the_offsets_form(weight, index):
    """Every tile of the table: experts' rows padded to 128 (blocks of padding only inside and
    after them skipped, their NaN-poisoned rows left; padding rows inside an expert's last block
    computed), odd N, the real rows against float64 and bit for bit the offsets form's at the same
    tile (one K slice: the same K loop). The tiles of the form's table (a8_launch.row_expert_table:
    W4A8's 192-row tile does not divide the 128-row alignment)."""
    tiles = [label for label in _tiles(weight) if 128 % parse_tile_field(label).block_m == 0]
    if index >= len(tiles):
        pytest.skip(f"the {weight} experts' row-expert table has {len(tiles)} tiles")
    tile = tiles[index]
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 5, 150, 384
    experts = _experts(weight, e, n, k, gen)
    counts = [70, 0, 130, 5, 128]
    row_expert, starts, rows = _row_layout(counts, 128)
    row_expert[-64:] = e  # (an id past the experts in the tail's padding block: skipped as padding)
    qa = _activations((rows, k), gen, _act(weight))
    out = torch.full((rows, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_grouped_a8_kernel(qa, experts, row_expert=row_expert, expected_m=64, out=out, tile=tile)
    torch.cuda.synchronize()
    block_m = parse_tile_field(tile).block_m
    for ex, (count, start) in enumerate(zip(counts, starts)):
        end = start + -(-count // block_m) * block_m  # (the expert's blocks of this tile)
        assert torch.isnan(out[end:starts[ex + 1] if ex + 1 < e else rows]).all(), f"expert {ex}: padding blocks"
        if count:
            assert not torch.isnan(out[start:end]).any(), f"expert {ex}: rows of its blocks were left"
            _check_rows(y[start:start + count], moe_a8._rows(qa, slice(start, start + count)), experts, ex)
            sub = moe_a8._rows(qa, slice(start, start + count))
            offsets = torch.tensor([0] * (ex + 1) + [count] * (e - ex), dtype=torch.int32, device="cuda")
            by_offsets = gemm_grouped_a8_kernel(sub, experts, offsets, expected_m=64, tile=tile, splits=1)
            assert torch.equal(by_offsets, y[start:start + count]), f"expert {ex}: the two forms' bits differ"


def test_the_row_expert_form_with_many_experts_a_bias_and_the_default_tile():
    """E 256 at top-8 decode sizes (mostly empty experts: blocks of padding only far outnumber the
    real ones, skipped 32 at a time), more tiles than CTAs, a bias with float16 output, rows cut
    at R inside the last block, the default tile (grouped_a8_block_m's rows) and a CUDA graph
    replay."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 256, 256, 512
    experts = _experts("blocks", e, n, k, gen)
    counts = torch.zeros(e, dtype=torch.int64)
    counts[torch.randperm(e, generator=gen)[:40]] = torch.randint(1, 20, (40,), generator=gen)
    counts[255] = 3  # (the last expert's rows end R: no padding after them)
    align = moe_a8.grouped_a8_block_m(experts, 2)
    assert align == a8_launch.ws_tile(experts, 2).block_m == 8
    row_expert, starts, rows = _row_layout(counts.tolist(), 128, tail_blocks=0)
    row_expert, rows = row_expert[:starts[255] + 3], starts[255] + 3
    qa = _activations((rows, k), gen, _act("blocks"))
    bias = (torch.randn(e, n, generator=gen) * 0.1).to(torch.float16).cuda()
    call = lambda: gemm_grouped_a8_kernel(qa, experts, row_expert=row_expert, expected_m=2, bias=bias,  # noqa: E731
                                          out_dtype=torch.float16)
    y = call()
    torch.cuda.synchronize()
    for ex in torch.nonzero(counts).reshape(-1).tolist():
        lo, hi = starts[ex], starts[ex] + int(counts[ex])
        _check_rows(y[lo:hi], moe_a8._rows(qa, slice(lo, hi)), experts, ex, bias, torch.float16)
    assert_graph_replay_is_eager(call)
