"""The offsets form of the grouped contiguous layout on the GPU (gemm_grouped_kernel(...,
offsets=...): the masked kernel's walk over rows grouped expert after expert with no alignment):
unaligned rows, K slices summed through the workspace, and its decode tile choice
(moe.decode_tiles), each against the float64 reference of each expert's operands. Helpers and the
skip rule are test_moe_kernels_gpu.py's.
"""
from __future__ import annotations

import pytest
import torch
from test_moe_kernels_gpu import _WHY_NOT, _forced_key, _key, _seed

import humming_aot
from humming_aot import dispatch, heuristics
from humming_aot.moe import pack_experts
from humming_aot.spec import GemmType
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm

pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


@pytest.mark.parametrize("fmt", ("int4:g128", "mxfp4"))
def test_grouped_kernel_on_unaligned_rows_given_by_offsets(fmt):
    """gemm_grouped_kernel(offsets=...), the masked schedule's walk over the offsets: rows grouped
    expert after expert with no alignment (an empty expert, rows before the first expert's and
    after the last one's) equal to the expert loop (moe.gemm_grouped with the same offsets) within
    the kernels' tolerance; rows of no expert zero in a new output and untouched (NaN) in a
    caller's; int32 and int64 offsets alike; offsets past the rows clamped to them."""
    from humming_aot.moe import gemm_grouped, gemm_grouped_kernel

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 4, 192, 512
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05, fmt),
                           act_dtype=torch.bfloat16)
    offsets = torch.tensor([3, 20, 20, 41, 70], device="cuda")
    a = torch.randn(75, k, device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(e, n, device="cuda", generator=gen).to(torch.bfloat16)
    for expected in (1, 16, 64):
        got = gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=expected, bias=bias)
        into = torch.full((75, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm_grouped_kernel(a, experts, offsets=offsets.to(torch.int32), expected_m=expected, bias=bias, out=into)
        loop = gemm_grouped(a, experts, offsets=offsets, bias=bias)
        assert torch.equal(got[3:70], into[3:70]) and not got[:3].any() and not got[70:].any()
        assert into[:3].isnan().all() and into[70:].isnan().all()
        for x in range(e):
            lo, hi = offsets[x].item(), offsets[x + 1].item()
            if hi > lo:
                key = _key(experts, expected, GemmType.MASKED)
                w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
                assert_gemm_close(got[lo:hi], reference_gemm(a[lo:hi], w_eff, bias[x]), a=a[lo:hi], w_eff=w_eff,
                                  bias=bias[x], context=f"offsets {fmt} expected={expected} expert {x} seed={seed}")
        assert loop.shape == got.shape
    # offsets past the rows: the last expert's rows end at R, nothing outside a and out is touched
    beyond = torch.tensor([0, 30, 60, 90, 1000], device="cuda", dtype=torch.int32)
    clipped = torch.tensor([0, 30, 60, 75, 75], device="cuda", dtype=torch.int32)
    assert torch.equal(gemm_grouped_kernel(a, experts, offsets=beyond, expected_m=16, bias=bias),
                       gemm_grouped_kernel(a, experts, offsets=clipped, expected_m=16, bias=bias))


@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g64:zp"))
@pytest.mark.parametrize("tile,splits", [
    (None, None),                          # the automatic tile (the 256-deep twin: 10 tiles) in 2 slices
    ("8x128x128_w1x2x2_s2", 3),            # slices of 6, 6 and 4 K tiles
    ("8x128x256_w1x2x4_s2", 8),            # one K tile per slice, swapped with 4 K warps
    ("mma-sw:16x64x128_w1x1x2_s2", 2),     # the 16-token swapped tile
    ("32x128x64_w1x2_s6", 5),              # the CTA-shared pipeline's writer
])
def test_offsets_form_sums_k_slices_in_a_workspace(fmt, tile, splits):
    """The offsets form with K slices (kernel/grouped_masked.cuh: CTAs (x, y) walk the same tiles
    with slice y, the dense body sums the slices through the workspace): equal to the float64
    reference of each expert's operands, the same bits twice, rows of no expert untouched, and the
    split-K counters left at zero for the next launch."""
    from humming_aot.moe import gemm_grouped_kernel
    from humming_aot.moe.kernels import offsets_splits, offsets_tile_bound

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 4, 256, 2048
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05, fmt),
                           act_dtype=torch.bfloat16)
    offsets = torch.tensor([1, 4, 4, 8, 10], device="cuda", dtype=torch.int32)  # an empty expert, a row of none
    a = torch.randn(11, k, device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(e, n, device="cuda", generator=gen).to(torch.bfloat16)
    expected = 1 if tile is None else (16 if tile.startswith("mma-sw") else 32 if tile.startswith("32") else 1)
    if tile is None:  # the automatic choice slices this K: few tiles for the resident CTAs (of the deep
        # twin of the table's tile on sm90a: moe.decode_tiles.offsets_depth)
        chosen = heuristics.select_masked_tile(dispatch.device_info(0).arches[0], 1, k, experts.group_size, 4)
        pair = heuristics.offsets_depth_pair(dispatch.device_info(0).arches[0], chosen, k, experts.group_size, 4)
        chosen = pair[1] if pair else chosen
        assert offsets_splits(offsets_tile_bound(11, e, n, chosen), k // chosen.block_k, 264) > 1
    runs = []
    for _ in range(2):
        out = torch.full((11, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=expected, bias=bias, out=out, tile=tile,
                            splits=splits)
        runs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(runs[0][1:10], runs[1][1:10]), f"slices not summed in a fixed order: seed={seed}"
    assert runs[0][0].isnan().all() and runs[0][10].isnan().all()
    assert not dispatch._split_k_counters(a.device, dispatch.current_stream(0)).any()
    key = _key(experts, expected) if tile is None else _forced_key(experts, expected, tile)
    for x in range(e):
        lo, hi = offsets[x].item(), offsets[x + 1].item()
        if hi > lo:
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(runs[0][lo:hi], reference_gemm(a[lo:hi], w_eff, bias[x]), a=a[lo:hi], w_eff=w_eff,
                              bias=bias[x], context=f"{fmt} tile={tile} splits={splits} expert {x} seed={seed}")


@pytest.mark.parametrize("rows", (8, 64))
def test_one_row_an_expert_on_a_short_k_takes_the_two_row_tile_from_most_of_a_wave(monkeypatch, rows):
    """The offsets form at one row an expert (expected_m 1) on K 768: the table's shallow 8-row tile
    while the experts the rows reach make under three quarters of a wave of its CTAs (10 rows reach
    10 experts: 80 tiles of 128 columns), the table's two-row tile once they make more (64: 512)
    where that one is a wgmma-ws tile (sm90a), each matching float64 with rows of no expert left
    alone (moe.decode_tiles.offsets_depth, log section 61)."""
    from humming_aot.moe import decode_tiles, gemm_grouped_kernel
    from humming_aot.moe import kernels as moe_kernels

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 64, 1024, 768
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    chosen = []
    depth = decode_tiles.offsets_depth
    monkeypatch.setattr(decode_tiles, "offsets_depth", lambda *args: chosen.append(depth(*args)) or chosen[-1])
    offsets = torch.arange(1, rows + 2, device="cuda", dtype=torch.int32)[: rows + 1]  # rows 1 .. rows, one each
    offsets = torch.cat([offsets, offsets.new_full((e - rows,), rows + 1)])  # the other experts empty
    a = torch.randn(rows + 2, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((rows + 2, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, out=out)
    torch.cuda.synchronize()
    (tile, _, _), = chosen
    arch = dispatch.device_info(0).arches[0]
    wide = decode_tiles.two_row_tile(arch, experts)
    shallow = heuristics.select_masked_tile(arch, 1, k, experts.group_size, 4)
    _, shallow_loaded = moe_kernels._kernel(a, experts, GemmType.MASKED, 1, "test", "gemm_grouped", shallow)
    reach = min(e, a.shape[0])  # the experts R rows can reach
    share = 4 * reach * (n // shallow.block_n) / (decode_tiles.WIDE_WAVE_QUARTERS *
                                                  moe_kernels._resident(shallow_loaded, shallow, 0))
    assert tile == (wide if wide is not None and share >= 1 else shallow), (tile.label, share)
    if arch == "sm90a":  # 10 experts' tiles are under three quarters of a wave there, 64 experts' over
        assert (tile == wide) == (rows == 64), tile.label
    assert out[0].isnan().all() and out[rows + 1].isnan().all(), "rows of no expert were written"
    key = _forced_key(experts, 1, tile.label)
    for x in range(rows):
        w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
        assert_gemm_close(out[x + 1:x + 2], reference_gemm(a[x + 1:x + 2], w_eff), a=a[x + 1:x + 2], w_eff=w_eff,
                          context=f"expert {x} of {rows} tile={tile.label} seed={seed}")


def test_a_last_wave_of_a_few_ctas_takes_the_four_stage_twin(monkeypatch):
    """The offsets form at DeepSeek-V3 TP8's gate_up geometry (256 experts, N 512) on a K past the
    two-row TMA tile's rows, 192 routed rows (24 tokens): ~541 tiles of 8 x 128, a wave of the
    shallow tile's CTAs and 13 more, so the rule (moe.decode_tiles.offsets_depth, wave_cost)
    takes its 4-stage twin given the real resident CTAs (on sm90a with 132 SMs: 528 and 396, the
    twin), and the result matches float64 with rows of no expert left alone."""
    from humming_aot.moe import decode_tiles, gemm_grouped_kernel
    from humming_aot.moe import kernels as moe_kernels

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k, rows = 256, 512, 4352, 192
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    chosen = []
    depth = decode_tiles.offsets_depth
    monkeypatch.setattr(decode_tiles, "offsets_depth", lambda *args: chosen.append(depth(*args)) or chosen[-1])
    ids = torch.randint(e, (rows,), device="cuda", generator=gen)
    offsets = torch.zeros(e + 1, device="cuda", dtype=torch.int32)
    offsets[1:] = torch.cumsum(torch.bincount(ids, minlength=e), 0).to(torch.int32)
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((rows + 1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_grouped_kernel(torch.cat([a, a[:1]]), experts, offsets=offsets, expected_m=1, out=out)  # last row: no expert's
    torch.cuda.synchronize()
    (tile, _, _), = chosen
    arch = dispatch.device_info(0).arches[0]
    table = heuristics.select_masked_tile(arch, 1, k, experts.group_size, 4)
    pair = heuristics.offsets_depth_pair(arch, table, k, experts.group_size, 4)
    shallow = table if pair is None else pair[0]
    ring = heuristics.offsets_ring_twin(arch, shallow, k, experts.group_size, 4)

    def resident(t):
        return moe_kernels._resident(moe_kernels._kernel(a, experts, GemmType.MASKED, 1, "test", "gemm_grouped", t)[1],
                                     t, 0)

    tiles = decode_tiles.expected_row_tiles(rows + 1, e, 8) * (n // 128)
    wanted = shallow
    if ring is not None and tiles > resident(shallow) and (decode_tiles.wave_cost(tiles, resident(ring))
                                                           <= decode_tiles.RING_GAIN * decode_tiles.wave_cost(
                                                               tiles, resident(shallow))):
        wanted = ring
    assert tile == wanted, (tile.label, tiles)
    if arch == "sm90a" and dispatch.device_info(0).num_sms == 132:
        assert tile == ring, tile.label
    assert out[rows].isnan().all(), "the row of no expert was written"
    key = _forced_key(experts, 1, tile.label)
    for x in range(e):
        lo, hi = offsets[x].item(), offsets[x + 1].item()
        if hi > lo:
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(out[lo:hi], reference_gemm(a[lo:hi], w_eff), a=a[lo:hi], w_eff=w_eff,
                              context=f"expert {x} tile={tile.label} seed={seed}")


def test_offsets_form_refuses_more_slices_than_k_tiles():
    from humming_aot.moe import gemm_grouped_kernel

    experts = pack_experts(humming_aot.quantize(torch.randn(2, 128, 256, device="cuda") * 0.05, "int4:g128"),
                           act_dtype=torch.bfloat16)
    a = torch.randn(4, 256, device="cuda").to(torch.bfloat16)
    offsets = torch.tensor([0, 2, 4], device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match=r"splits=3 must be an int in \[1, K / 128 = 2\]"):
        gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, tile="8x128x128_w1x2x2_s2", splits=3)


def test_offsets_form_runs_several_sliced_tiles_per_cta():
    """K slices where each CTA walks several tiles (more tiles than resident CTAs per slice): the
    arrival flag, the stash, the workspace and counter pointers and the next tile's prefetch reused
    tile after tile; 5 forced slices of 16 K tiles run as 4 (none left empty)."""
    from humming_aot.moe import gemm_grouped_kernel

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k, rows = 5, 1024, 2048, 300
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    offsets = torch.tensor([0, 70, 71, 150, 150, 300], device="cuda", dtype=torch.int32)
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    for splits in (5, 8):
        out = gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, tile="8x128x128_w1x2x2_s2",
                                  splits=splits)
        again = gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, tile="8x128x128_w1x2x2_s2",
                                    splits=splits)
        torch.cuda.synchronize()
        assert torch.equal(out, again), f"splits={splits} seed={seed}"
        assert not dispatch._split_k_counters(a.device, dispatch.current_stream(0)).any()
        for x in range(e):
            lo, hi = offsets[x].item(), offsets[x + 1].item()
            if hi > lo:
                key = _forced_key(experts, 1, "8x128x128_w1x2x2_s2")
                w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
                assert_gemm_close(out[lo:hi], reference_gemm(a[lo:hi], w_eff), a=a[lo:hi], w_eff=w_eff,
                                  context=f"splits={splits} expert {x} seed={seed}")
