"""The MoE GEMMs' tile choice without a GPU (humming_aot.heuristics.select_masked_tile, the
moe_tiles table, and the offsets form's choice of its decode tile's K depth in
humming_aot/moe/kernels.py): which tile serves which rows, K and codes, the CTAs per SM the
masked TMA tiles are given stages for, and the launches the choice leads to."""
from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import pytest
import torch

import humming_aot
from humming_aot import heuristics
from humming_aot.enumerate import parse_tile_field
from humming_aot.moe import decode_tiles, pack_experts
from humming_aot.moe import kernels as moe_kernels
from humming_aot.spec import MmaKind


def _experts(fmt="uint4:g64:zp", e=3, n=192, k=256):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(0)) * 0.05
    return pack_experts(humming_aot.quantize(w, fmt), act_dtype=torch.bfloat16)


def test_the_grouped_row_expert_tile_is_an_mma_sync_tile_for_the_expected_rows():
    for arch in ("sm90a", "sm80", "sm120"):
        for m in (1, 8, 16, 17, 64, 1024):
            tile = heuristics.select_masked_tile(arch, m, 4096, 128, 4, masked=False)
            assert tile.body.params_type == "GemmParams" and tile.mma in (MmaKind.MMA_SYNC, MmaKind.MMA_SWAPPED)
            own = heuristics.select_tile(arch, m, 4096, 128, 4)
            if arch != "sm90a" and own.mma is MmaKind.MMA_SYNC:  # without moe_tiles, the arch's own
                assert tile == own  # tile wherever it is an mma.sync one
            if arch != "sm90a":  # the masked schedule takes the same tiles there
                assert heuristics.select_masked_tile(arch, m, 4096, 128, 4) == tile
    assert heuristics.select_masked_tile("sm90a", 1, 4096, 128, 4, masked=False).block_m == 8
    assert (heuristics.select_masked_tile("sm90a", 64, 4096, 128, 4, masked=False)
            == heuristics.select_tile("sm90", 64, 4096, 128, 4))


def test_the_masked_schedule_runs_the_tma_body_from_5_rows_on_sm90a():
    # tiles.toml's moe_tiles of sm90a: the warp-specialized TMA body from 5 rows per expert at any
    # K (up to 4 rows only where K is short), its rows by the expected rows and their spread; below
    # it the same rows as the grouped row-expert schedule
    for k, group in ((256, 128), (768, 128), (1536, 128), (2048, 128), (2880, 32), (7168, 128)):
        for m in (1, 4, 5, 8, 10, 11, 12, 16, 17, 28):
            tile = heuristics.select_masked_tile("sm90a", m, k, group, 4)
            if k <= 256 or m > 4 or (m > 1 and k <= 4096):  # one warpgroup of four units
                rows = 8 if m <= 4 else 16 if m <= 10 else 24 if m <= 16 else 32
                # 4 stages for every code width (log section 67), but 6 for the 24-row tile of
                # 4-bit codes (log section 87)
                assert tile.label == f"wgmma-ws:{rows}x256x64_w1x4_s{6 if rows == 24 else 4}", (m, k)
            else:
                assert tile == heuristics.select_masked_tile("sm90a", m, k, group, 4, masked=False), (m, k)
            # wider codes: the 16-row tile to 10 rows, the 32-row one to 16, in 4 stages
            if m > 4:
                wide = heuristics.select_masked_tile("sm90a", m, k, group, 8)
                height, warps = (16, 4) if m <= 10 else (32, 4) if m <= 16 else (48, 8)
                assert wide.label == f"wgmma-ws:{height}x256x64_w1x{warps}_s4", (m, k, wide.label)
        for m, rows in ((29, 48), (38, 48), (39, 64), (52, 64), (53, 80), (66, 80), (67, 96), (85, 96), (86, 144),
                        (124, 144), (125, 160), (139, 160), (140, 176), (190, 176), (191, 144), (265, 144), (266, 160),
                        (295, 160), (296, 176), (100000, 176)):
            label = f"wgmma-ws:{rows}x256x64_w1x8_s{3 if rows == 176 else 4}"
            # 4-bit codes: 48 and 64 rows on one consumer warpgroup of 256 channels, two CTAs per SM
            # (log section 70); with zero points the 64-row one in 3 stages, so that two fit
            narrow = label.replace("w1x8", "w1x4") if rows in (48, 64) else label
            tile = heuristics.select_masked_tile("sm90a", m, k, group, 4)
            assert tile.label == narrow and heuristics.tile_fits(tile, k, group), (m, tile.label)
            zero_point = heuristics.select_masked_tile("sm90a", m, k, group, 4, zero_point=True)
            assert zero_point.label == (narrow.replace("_s4", "_s3") if rows == 64 else narrow), (m, zero_point.label)
            # 8-bit codes: 144 and 160 rows in 3 stages (4 exceed the shared memory); from 17 rows 48
            wide = heuristics.select_masked_tile("sm90a", m, k, group, 8)
            assert wide.label == (label if rows not in (144, 160) else f"wgmma-ws:{rows}x256x64_w1x8_s3"), (m, wide.label)
        assert heuristics.select_masked_tile("sm90a", 17, k, group, 8).label == "wgmma-ws:48x256x64_w1x8_s4"
    # the plain arch (no wgmma) keeps the mma.sync tiles
    assert heuristics.select_masked_tile("sm90", 64, 4096, 128, 4).mma is MmaKind.MMA_SYNC


def _expected_tiles(r: float, rows: int) -> float:
    """E[ceil(X / rows)] for X ~ Normal(r, sqrt(r)): the tiles an expert of about r rows runs."""
    spread = NormalDist(r, math.sqrt(r))
    return sum(1 - spread.cdf(j * rows) for j in range(int((r + 8 * math.sqrt(r)) / rows) + 2))


def test_the_moe_rows_above_36_rows_follow_the_spread_rule_of_tiles_toml():
    # tiles.toml's rule: from 37 rows per expert, the TMA tile of least E[ceil(rows / bm)] x
    # (256 + bm) among the table's row counts, recomputed here; a boundary may sit where two tiles
    # cost within 1 %; above 295 rows the table keeps 176 (the rule's pick wanders among 144-176
    # within 6 %, and 176 measured fastest at 512: docs/performance/log.md sections 31 and 52)
    heights = sorted({tile.block_m for tile in heuristics.moe_tile_table("sm90a", 4) if tile.block_m >= 48})
    assert {80, 160} <= set(heights)
    for r in range(37, 400):
        picked = heuristics.select_masked_tile("sm90a", r, 7168, 128, 4).block_m
        if r > 295:
            assert picked == 176, r
            continue
        cost = {bm: _expected_tiles(r, bm) * (256 + bm) for bm in heights}
        assert cost[picked] <= 1.01 * min(cost.values()), (r, picked, cost)


def test_the_moe_table_picks_small_ctas_for_short_k_and_the_decode_tiles_for_long_k():
    # tiles.toml's moe_tiles of sm90a: a short K (a TP shard's down projection) is bound by each
    # tile's latency, so 4-warp CTAs of 128-wide stages; a long K keeps the dense decode tile
    for k in (768, 2048):
        assert heuristics.select_masked_tile("sm90a", 1, k, 128, 4).label == "8x128x128_w1x2x2_s2"
    for k in (768, 2048, 7168):  # 16 rows from 5 rows per expert, on the TMA body at any K; the
        for m in (5, 9, 10):      # grouped row-expert schedule keeps the swapped tile
            assert heuristics.select_masked_tile("sm90a", m, k, 128, 4).label == "wgmma-ws:16x256x64_w1x4_s4"
        assert (heuristics.select_masked_tile("sm90a", 5, k, 128, 4, masked=False).label
                == "mma-sw:16x256x128_w1x4x2_s2")
    # K = 256 (DeepSeek-V3 TP8 down): the TMA body's 8- and 16-row tiles of one consumer warpgroup
    # of four units, whose ring runs across tiles (four stages for codes over 4 bits); from 11 rows
    # its 24-row tile in 6 stages for 4-bit codes, the 32-row one for wider codes, at any K; the
    # grouped row-expert schedule keeps the swapped tiles
    assert heuristics.select_masked_tile("sm90a", 1, 256, 128, 4).label == "wgmma-ws:8x256x64_w1x4_s4"
    assert heuristics.select_masked_tile("sm90a", 8, 256, 128, 4).label == "wgmma-ws:16x256x64_w1x4_s4"
    assert heuristics.select_masked_tile("sm90a", 8, 256, 128, 8).label == "wgmma-ws:16x256x64_w1x4_s4"
    for k in (256, 768, 2048, 7168):
        assert heuristics.select_masked_tile("sm90a", 16, k, 128, 4).label == "wgmma-ws:24x256x64_w1x4_s6"
        assert heuristics.select_masked_tile("sm90a", 16, k, 128, 8).label == "wgmma-ws:32x256x64_w1x4_s4"
    assert (heuristics.select_masked_tile("sm90a", 16, 256, 128, 4, masked=False).label
            == "mma-sw:16x256x128_w1x4x2_s2")
    # 2-4 rows: the TMA body's 8-row tile up to K 4096 (log section 69), the dense decode tile past it
    assert heuristics.select_masked_tile("sm90a", 4, 4096, 128, 4).label == "wgmma-ws:8x256x64_w1x4_s4"
    assert heuristics.select_masked_tile("sm90a", 4, 7168, 128, 4) == heuristics.select_tile("sm90a", 4, 7168, 128, 4)
    for k in (4096, 7168):
        assert heuristics.select_masked_tile("sm90a", 8, k, 128, 4).label == "wgmma-ws:16x256x64_w1x4_s4"
        assert (heuristics.select_masked_tile("sm90a", 12, k, 128, 4, masked=False).label
                == "mma-sw:16x64x128_w1x1x2_s4")
    # a K that no row's stages tile (gpt-oss 2880) takes a 64-wide twin, which fits it
    for m in (1, 16):
        tile = heuristics.select_masked_tile("sm90a", m, 2880, 32, 4)
        assert tile.block_k == 64 and heuristics.tile_fits(tile, 2880, 32)
    # above the table's 16 rows the grouped row-expert schedule takes the mma.sync table of sm90
    assert (heuristics.select_masked_tile("sm90a", 17, 256, 128, 4, masked=False)
            == heuristics.select_tile("sm90", 17, 256, 128, 4))
    # every tile picked is in moe_tile_table (the catalog's MoE families), or its 64-wide twin
    for masked in (True, False):
        table = heuristics.moe_tile_table("sm90a", 4, masked=masked)
        assert any(t.mma is MmaKind.WGMMA_WS for t in table) == masked
        for m in (1, 8, 9, 16, 17, 200):
            for k, group in ((256, 128), (768, 128), (2048, 64), (2880, 32), (7168, 128), (192, 64)):
                tile = heuristics.select_masked_tile("sm90a", m, k, group, 4, masked=masked)
                assert tile in table or any(tile == heuristics.narrow_twin(t) for t in table)


def test_a_moe_row_of_a_body_without_run_tile_is_refused(monkeypatch):
    from humming_aot.heuristics import tiles

    real = tiles.load_toml

    def with_wgmma_row(name):
        data = real(name)
        if name != "tiles.toml":
            return data
        data = {**data, "arch": {**data["arch"]}}
        data["arch"]["sm90a"] = {**data["arch"]["sm90a"], "moe_tiles": [
            {"max_m": 64, "mma": "wgmma", "block_m": 64, "block_n": 128, "warps_m": 1, "warps_n": 8, "stages": 6}]}
        return data

    monkeypatch.setattr(tiles, "load_toml", with_wgmma_row)
    tiles._moe_rows_all.cache_clear()
    tiles._moe_rows.cache_clear()
    try:
        with pytest.raises(ValueError, match="moe_tiles of sm90a holds .* the MoE schedules wrap"):
            heuristics.select_masked_tile("sm90a", 1, 256, 128, 4)
    finally:
        monkeypatch.undo()
        tiles._moe_rows_all.cache_clear()
        tiles._moe_rows.cache_clear()


def test_the_offsets_form_picks_the_deep_decode_tile_where_its_tiles_fit_one_wave(monkeypatch):
    """The offsets form's choice between the 8-row tile of 128 of K per stage (2 K warps) and its
    256-deep twin (4 K warps) of sm90a's moe_tiles (heuristics.offsets_depth_pair): the deep one
    where the reachable experts' tiles (min(E, R) x N tiles) fit one wave of its resident CTAs and
    K holds DEPTH_MIN_K_STAGES of its stages, else the shallow one, whichever of the two the table
    named; other tiles, and a K the deep one does not divide, left alone. On a short K (sm90a's
    table takes its two-row wgmma-ws tile up to 4096) the shallow tile gives way to that one once
    the reachable experts' shallow tiles make three quarters of a wave."""
    from types import SimpleNamespace

    from humming_aot import dispatch

    shallow, deep = parse_tile_field("8x128x128_w1x2x2_s2"), parse_tile_field("8x128x256_w1x2x4_s2")
    wide = parse_tile_field("wgmma-ws:8x256x64_w1x4_s4")
    ring = parse_tile_field("8x128x128_w1x2x2_s4")  # (never taken here: the rows make under a wave)
    resident = {shallow: 20, deep: 10, wide: 8, ring: 15}

    lookups = []

    def kernel(a, experts, gemm_type, rows, what, loop, forced=None):
        lookups.append(forced)
        return forced, f"kernel {forced.label}"

    monkeypatch.setattr(dispatch, "device_info", lambda index: SimpleNamespace(arches=("sm90a", "sm90")))
    monkeypatch.setattr(moe_kernels, "_kernel", kernel)
    monkeypatch.setattr(decode_tiles, "_TWINS", {})
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: resident[tile])
    assert decode_tiles.DEPTH_MIN_K_STAGES == 8
    long_k = _experts("int4:g128", e=8, n=256, k=4352)  # 17 stages of 256; 2 N tiles of 128
    short_k = _experts("int4:g128", e=8, n=256, k=1792)  # 7
    for table_tile in (shallow, deep):
        table = (table_tile, f"kernel {table_tile.label}", resident[table_tile])
        for experts, reach, wanted in ((long_k, 1, deep), (long_k, 5, deep), (long_k, 6, shallow),
                                       (long_k, 8, shallow), (short_k, 1, shallow)):
            a = torch.zeros(300, experts.k, dtype=torch.bfloat16)
            for _ in range(2):
                got = decode_tiles.offsets_depth(a, experts, *table, reach, "w")
                assert got == (wanted, f"kernel {wanted.label}", resident[wanted]), (table_tile.label, experts.k, reach)
        # each table kernel looks its twin up once, however many calls follow (the 4-stage one only
        # where the rows' tiles pass a wave of the shallow tile: never here)
        assert lookups == [deep if table_tile == shallow else shallow], (table_tile.label, lookups)
        lookups.clear()
    # K 768 (3 deep stages): 2 shallow tiles an expert, 20 resident CTAs: from 8 experts (16 tiles,
    # 3 quarters of 20 at least) the wide one, looked up once
    assert decode_tiles.WIDE_WAVE_QUARTERS == 3
    short = _experts("int4:g128", e=16, n=256, k=768)
    a = torch.zeros(300, 768, dtype=torch.bfloat16)
    table = (shallow, f"kernel {shallow.label}", resident[shallow])
    for reach, wanted in ((1, shallow), (7, shallow), (8, wide), (16, wide), (8, wide)):
        assert decode_tiles.offsets_depth(a, short, *table, reach, "w") == (wanted, f"kernel {wanted.label}",
                                                                              resident[wanted]), reach
    assert lookups == [wide]
    uint4 = _experts("uint4:g128:zp", e=16, n=256, k=768)  # zero points: the table's 4 stages fit
    assert decode_tiles.two_row_tile("sm90a", uint4).label == "wgmma-ws:8x256x64_w1x4_s4"
    assert decode_tiles.two_row_tile("sm90a", _experts("int4:g128", e=2, n=256, k=4096)).label == "wgmma-ws:8x256x64_w1x4_s4"
    assert decode_tiles.two_row_tile("sm90a", long_k) is None and decode_tiles.two_row_tile("sm89", short) is None
    a = torch.zeros(3, long_k.k, dtype=torch.bfloat16)
    ws = parse_tile_field("wgmma-ws:8x256x64_w1x4_s6")
    assert decode_tiles.offsets_depth(a, long_k, ws, "k", 396, 3, "w") == (ws, "k", 396)
    narrow = _experts("int4:g128", e=3, n=256, k=2048 + 128)  # 256-wide stages do not divide K
    a = torch.zeros(3, 2048 + 128, dtype=torch.bfloat16)
    assert decode_tiles.offsets_depth(a, narrow, shallow, "k", 20, 3, "w") == (shallow, "k", 20)


def test_expected_row_tiles_and_wave_cost_follow_their_definitions():
    # two rows over two experts: both on one expert (1 tile) or one each (2), equally likely
    assert decode_tiles.expected_row_tiles(2, 2, 8) == pytest.approx(1.5)
    assert decode_tiles.expected_row_tiles(1, 256, 8) == pytest.approx(1.0)
    assert decode_tiles.expected_row_tiles(20, 1, 8) == 3.0 and decode_tiles.expected_row_tiles(0, 8, 8) == 0.0
    gen = torch.Generator().manual_seed(1)
    for rows, experts in ((192, 256), (100, 8), (32, 128), (1024, 256)):
        counts = torch.stack([torch.bincount(torch.randint(experts, (rows,), generator=gen), minlength=experts)
                              for _ in range(400)])
        sampled = (-(-counts // 8)).sum(dim=1).double().mean().item()
        assert decode_tiles.expected_row_tiles(rows, experts, 8) == pytest.approx(sampled, rel=0.01), (rows, experts)
    floor = decode_tiles.TAIL_FLOOR
    assert decode_tiles.wave_cost(300, 528) == 300 and decode_tiles.wave_cost(1056, 528) == 1056
    assert decode_tiles.wave_cost(540, 528) == pytest.approx(528 + floor * 528)  # 12 CTAs alone in a last wave
    assert decode_tiles.wave_cost(540, 396) == 540 and decode_tiles.wave_cost(20, 528) == pytest.approx(floor * 528)


def test_the_offsets_form_takes_the_four_stage_twin_where_a_last_wave_holds_a_few_ctas(monkeypatch):
    """The shallow 8-row tile's 4-stage twin (heuristics.offsets_ring_twin: 4-bit codes, sm90a's
    moe_tiles pair, any K that pair fits; in the catalog's MoE table) where the expected tiles pass
    a wave of the shallow tile's CTAs and cost at most RING_GAIN of theirs in its own waves; the
    shallow tile under a wave or where the twin saves less; the deep one first where it fits."""
    from types import SimpleNamespace

    from humming_aot import dispatch

    shallow, deep = parse_tile_field("8x128x128_w1x2x2_s2"), parse_tile_field("8x128x256_w1x2x4_s2")
    ring = parse_tile_field("8x128x128_w1x2x2_s4")
    assert heuristics.offsets_ring_twin("sm90a", shallow, 7168, 128, 4) == ring
    assert heuristics.offsets_ring_twin("sm90a", shallow, 7168, 128, 8) is None  # 8-bit codes have none
    assert heuristics.offsets_ring_twin("sm90a", deep, 7168, 128, 4) is None
    assert heuristics.offsets_ring_twin("sm90a", shallow, 2048 + 128, 128, 4) is None  # no deep twin fits K
    assert heuristics.offsets_ring_twin("sm89", shallow, 7168, 128, 4) is None  # no moe_tiles pair
    assert ring in heuristics.moe_tile_table("sm90a", 4) and ring not in heuristics.moe_tile_table("sm90a", 8)
    assert ring not in heuristics.moe_tile_table("sm90a", 4, masked=False)

    resident = {shallow: 20, deep: 10, ring: 15}
    monkeypatch.setattr(dispatch, "device_info", lambda index: SimpleNamespace(arches=("sm90a", "sm90")))
    monkeypatch.setattr(moe_kernels, "_kernel", lambda a, experts, gemm_type, rows, what, loop, forced=None:
                        (forced, f"kernel {forced.label}"))
    monkeypatch.setattr(decode_tiles, "_TWINS", {})
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: resident[tile])
    experts = _experts("int4:g128", e=16, n=256, k=4096 + 256)  # 2 N tiles an expert; K past the TMA tile's rows
    a = torch.zeros(3, experts.k, dtype=torch.bfloat16)
    table = (shallow, f"kernel {shallow.label}", resident[shallow])
    # 3 rows: 3 experts' 6 tiles fit the deep tile's 10; 12 rows: ~17 tiles, under a wave of 20;
    # 16 rows: ~21 (20 + the floor's 6 against 15 + 6: the twin); 40 rows: ~31 (20 + 11 against 30
    # + the floor's 4.5: the shallow tile)
    for rows, wanted in ((3, deep), (12, shallow), (16, ring), (40, shallow)):
        tiles = decode_tiles.expected_row_tiles(rows, 16, 8) * 2
        got = decode_tiles.offsets_depth(a, experts, *table, rows, "w")
        assert got == (wanted, f"kernel {wanted.label}", resident[wanted]), (rows, tiles)
    wide = _experts("int8:g128", e=16, n=256, k=4096 + 256)
    assert decode_tiles.offsets_depth(a, wide, *table, 16, "w")[0] == shallow


def test_the_offsets_form_call_takes_the_depth_rule_unless_a_tile_or_split_is_forced(monkeypatch):
    """gemm_grouped_kernel(offsets=...) up to the launch (CPU tensors made to look like CUDA ones):
    the table's tile goes through decode_tiles.offsets_depth with the routed rows (R, or
    routed_rows where the rows hold padding), and the launch runs the tile it returns; a forced
    tile or forced slices skip it; a routed_rows outside [0, R], or given to the aligned form, is
    refused."""
    from humming_aot.moe import gemm_grouped_kernel

    experts = _experts("int4:g128", e=6, n=256, k=2048)
    table, deep = parse_tile_field("8x128x128_w1x2x2_s2"), parse_tile_field("8x128x256_w1x2x4_s2")
    launched, reached = [], []

    class Loaded:
        def __init__(self, tile):
            self.tile = tile

        def launch(self, grid, stream, params):
            launched.append(self.tile)

    def depth(a, experts, tile, loaded, resident, rows, what):
        reached.append(rows)
        return deep, Loaded(deep), 264

    def kernel(a, experts, gemm_type, rows, what, loop, forced=None):
        tile = table if forced is None else parse_tile_field(forced)
        return tile, Loaded(tile)

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(moe_kernels, "_kernel", kernel)
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: 528)
    monkeypatch.setattr(moe_kernels, "_stream", lambda a: 7)
    monkeypatch.setattr(decode_tiles, "offsets_depth", depth)
    a = torch.zeros(11, 2048, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 2, 2, 4, 6, 8, 11], dtype=torch.int32)
    cases = [({}, deep, 11), ({"routed_rows": 3}, deep, 3), ({"routed_rows": 0}, deep, 0),
             ({"tile": "8x128x128_w1x2x2_s2"}, table, None), ({"splits": 2}, table, None)]
    for kwargs, tile, reach in cases:
        launched.clear()
        reached.clear()
        gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, out=torch.zeros(11, 256, dtype=a.dtype),
                            **kwargs)
        assert launched == [tile] and reached == ([] if reach is None else [reach]), kwargs
    for bad in (-1, 12, 2.0):
        with pytest.raises(ValueError, match=f"routed_rows={bad!r} must be an int in \\[0, R = 11\\]"):
            gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, routed_rows=bad)
    with pytest.raises(ValueError, match="routed_rows is for the offsets form"):
        gemm_grouped_kernel(a, experts, torch.zeros(11, dtype=torch.int32), expected_m=1, routed_rows=3)


def test_one_warpgroup_tma_tiles_keep_two_or_three_ctas_per_sm_for_every_code():
    # heuristics.fit_ctas_per_sm: a moe_tiles row's one-warpgroup wgmma-ws tile, sized for 4-bit
    # codes without zero points, takes fewer stages where its shared memory would leave one CTA
    # per SM (8-bit codes with zero points: the 32-row tile's 4 stages -> 3), and the 8-row tile
    # one fewer (not under 5) where that lets three CTAs share an SM (none since the table's rows
    # run 4 stages, log section 67); the rows' tiles that fit keep their stages, and the catalog's
    # MoE table lists what is picked
    from humming_aot.bodies.wgmma_ws import masked_ctas_per_sm, masked_smem_bytes

    capacity = heuristics.smem_limit("sm90a") + 1024
    assert heuristics.select_masked_tile("sm90a", 17, 256, 128, 4).label == "wgmma-ws:32x256x64_w1x4_s4"
    assert (heuristics.select_masked_tile("sm90a", 17, 256, 128, 4, zero_point=True).label
            == "wgmma-ws:32x256x64_w1x4_s4")
    for zero_point in (False, True):  # the 24-row tile's 6 stages leave two CTAs an SM with zero points too
        assert (heuristics.select_masked_tile("sm90a", 16, 256, 128, 4, zero_point=zero_point).label
                == "wgmma-ws:24x256x64_w1x4_s6")
    assert (heuristics.select_masked_tile("sm90a", 16, 256, 128, 8, zero_point=True).label
            == "wgmma-ws:32x256x64_w1x4_s3")
    assert heuristics.select_masked_tile("sm90a", 1, 256, 128, 4).label == "wgmma-ws:8x256x64_w1x4_s4"
    assert (heuristics.select_masked_tile("sm90a", 1, 256, 128, 4, zero_point=True).label
            == "wgmma-ws:8x256x64_w1x4_s4")
    assert heuristics.select_masked_tile("sm90a", 1, 256, 128, 8).label == "wgmma-ws:8x256x64_w1x4_s4"
    # the three-per-SM search on a deeper 8-row tile than the table's (a forced or probe row): uint4
    # with zero points gives up one of 6 stages for a third CTA; int4 holds three at 6
    from humming_aot.heuristics.tiles import fit_ctas_per_sm

    six = parse_tile_field("wgmma-ws:8x256x64_w1x4_s6")
    assert masked_ctas_per_sm(six, 4, True) == 2
    assert fit_ctas_per_sm("sm90a", six, 4, True).stages == 5
    assert fit_ctas_per_sm("sm90a", six, 4, False) == six
    for w_bits in range(1, 9):
        for zero_point in (False, True):
            table = heuristics.moe_tile_table("sm90a", w_bits, zero_point=zero_point)
            for m in (1, 4, 8, 16, 17, 64, 200):
                for k in (256, 768, 2048, 7168):
                    tile = heuristics.select_masked_tile("sm90a", m, k, 128, w_bits, zero_point=zero_point)
                    assert tile in table, (w_bits, zero_point, m, k, tile.label)
                    if tile.mma is MmaKind.WGMMA_WS and tile.threads == 256:
                        smem = masked_smem_bytes(tile, w_bits, zero_point)
                        assert 2 * (smem + 2048) <= capacity, (w_bits, zero_point, m, tile.label, smem)
                        bigger = masked_smem_bytes(dataclasses.replace(tile, stages=tile.stages + 1), w_bits,
                                                   zero_point)
                        row = heuristics.select_masked_tile("sm90a", m, k, 128, w_bits)
                        three = masked_ctas_per_sm(tile, w_bits, zero_point) == 3
                        assert three == (tile.block_m == 8 and (masked_ctas_per_sm(row, w_bits, zero_point) == 3
                                                                 or tile.stages == row.stages - 1 >= 5)), tile.label
                        assert (tile.stages == row.stages or 2 * (bigger + 2048) > capacity
                                or (three and tile.stages == row.stages - 1)), (tile.label, row.label)


def test_the_producer_keeps_the_walk_registers_except_where_the_consumers_need_them():
    # bodies/wgmma_ws.masked_producer_registers (kernel/grouped_masked_ws.cuh kProducerRegisters,
    # which the generated source static_asserts against it): 56 registers for the expert walk, but
    # 24 where 56 would leave the consumers of a tile at its most accumulators too few to keep
    # their wgmma in flight (ptxas warning C7512): among the table's rows the 176-row tile, and the
    # 64-row one-warpgroup tile of 4-bit codes (128 accumulators, its limit); one-warpgroup tiles at
    # their limit too
    from humming_aot.bodies.wgmma_ws import masked_producer_registers

    least = {(tile.label, bits, zero_point) for bits in (4, 8) for zero_point in (False, True)
             for tile in heuristics.moe_tile_table("sm90a", bits, zero_point=zero_point)
             if tile.mma is MmaKind.WGMMA_WS and masked_producer_registers(tile, bits, zero_point) == 24}
    assert {label for label, _, _ in least} == {"wgmma-ws:176x256x64_w1x8_s3", "wgmma-ws:64x256x64_w1x4_s4",
                                                "wgmma-ws:64x256x64_w1x4_s3"}
    # the 176-row tile for every code width and zero point; the 64-row one for 4-bit codes (3 stages
    # with zero points)
    assert len(least) == 6
    for field, registers in (("160x256x64_w1x8_s4", 56), ("144x128x64_w1x4_s4", 24), ("64x256x64_w1x4_s4", 24),
                             ("32x256x64_w1x4_s6", 56), ("8x256x64_w1x4_s6", 56)):
        assert masked_producer_registers(parse_tile_field(f"wgmma-ws:{field}"), 4, False) == registers, field
