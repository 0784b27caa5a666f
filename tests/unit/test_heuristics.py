"""Tile tables and the K-stage fit rule: which tile serves a problem, and the 64-wide twin that
takes over where a 128-wide tile does not line up with K or the scale groups."""
from __future__ import annotations

import dataclasses

import pytest

from humming_aot import heuristics
from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.heuristics.tiles import DEFAULT_SPLIT_CTAS_PER_SM
from humming_aot.spec import GemmType, KernelKey, MmaKind

WIDE = parse_tile_field("16x128x128_w1x2x4_s4")


@pytest.mark.parametrize(
    "k,group,fits",
    [
        (8192, 128, True), (8192, 64, True), (8192, 32, True), (8192, 16, True), (8192, 256, True),
        (8192, 8192, True),  # per channel, K a multiple of 128
        (1088, 64, False),  # K = 17 x 64: the last 128-wide stage would be half empty
        (1152, 192, False),  # a group that straddles 128-wide stages
        (1088, 1088, False),
    ],
)
def test_tile_fits_128_wide_stages(k, group, fits):
    assert heuristics.tile_fits(WIDE, k, group) is fits
    assert heuristics.tile_fits(heuristics.narrow_twin(WIDE), k, group)  # the twin takes every legal shape


def test_narrow_twin_is_64_wide_with_at_least_three_stages():
    twin = heuristics.narrow_twin(WIDE)
    assert twin.label == "16x128x64_w1x2x4_s4"
    assert heuristics.narrow_twin(twin) == twin
    assert heuristics.narrow_twin(parse_tile_field("16x128x256_w1x2x4_s2")).label == "16x128x64_w1x2x4_s3"


def test_the_swapped_tiles_twin_keeps_32_of_k_per_warp_and_half_the_k_in_flight():
    """The 8-row tile runs one pipeline per K warp: its twin has at most 2 K warps (32 of each 64-wide
    stage) and stages for half the wide tile's K in flight (log section 25)."""
    assert heuristics.narrow_twin(parse_tile_field("8x128x256_w1x2x4_s2")).label == "8x128x64_w1x2x2_s4"
    assert heuristics.narrow_twin(parse_tile_field("8x128x512_w1x2x4_s2")).label == "8x128x64_w1x2x2_s8"
    assert heuristics.narrow_twin(parse_tile_field("8x64x256_w1x1x4_s3")).label == "8x64x64_w1x1x2_s6"
    assert heuristics.narrow_twin(parse_tile_field("8x128x128_w1x2_s2")).label == "8x128x64_w1x2_s3"


def test_decode_tiles_split_a_partial_second_wave_in_two():
    """Up to 1.5 waves of output tiles on the slots, a decode tile (at most 16 rows) takes 2 K slices;
    past that, and for larger tiles, whole tiles (log section 25)."""
    tile = heuristics.select_tile("sm90a", 1)
    args = dict(m=1, k=7168, tile=tile, num_sms=132, max_tiles=4096, ctas_per_sm=2, target_ctas_per_sm=2)
    assert heuristics.split_k_factor(n=36864, **args) == 2  # 288 tiles on 264 slots
    assert heuristics.split_k_factor(n=128 * 396, **args) == 2  # exactly 1.5 waves
    assert heuristics.split_k_factor(n=128 * 397, **args) == 1
    assert heuristics.split_k_factor(n=57344, **args) == 1  # 448 tiles: 1.7 waves
    assert heuristics.split_k_factor(n=36864, **{**args, "k": 256}) == 1  # no 2 slices of 256
    big = parse_tile_field("64x128x64_w1x2_s4")
    assert heuristics.split_k_factor(n=128 * 300, **{**args, "tile": big, "m": 64}) == 1


def test_select_tile_falls_back_to_the_twin_for_shapes_the_table_tile_does_not_fit():
    table_tile = heuristics.select_tile("sm90a", 1)
    assert heuristics.select_tile("sm90a", 1, k=8192, group=128) == table_tile
    fallback = heuristics.select_tile("sm90a", 1, k=1088, group=64)
    assert heuristics.tile_fits(fallback, 1088, 64)
    assert fallback == heuristics.narrow_twin(table_tile)


def test_rows_for_narrow_codes_override_the_general_row():
    """sm90a stages 512 of K at a time for 1- and 2-bit codes at M <= 8; where K is not a multiple
    of 512, the general row's 256-wide tile serves them (not the 64-wide twin); wider codes and
    larger M never see the narrow-code row."""
    narrow = heuristics.select_tile("sm90a", 1, k=8192, group=128, w_bits=1)
    assert (narrow.block_m, narrow.block_k) == (8, 512)
    assert heuristics.select_tile("sm90a", 8, k=8192, group=128, w_bits=2) == narrow
    assert heuristics.select_tile("sm90a", 1, w_bits=2) == narrow
    general = heuristics.select_tile("sm90a", 1, k=8192, group=128, w_bits=3)
    assert (general.block_m, general.block_k) == (8, 256)
    assert heuristics.select_tile("sm90a", 1, k=11008, group=128, w_bits=1) == general  # 43 x 256
    assert heuristics.select_tile("sm90a", 1, k=1088, group=64, w_bits=1) == heuristics.narrow_twin(narrow)
    assert heuristics.select_tile("sm90a", 9, w_bits=1) == heuristics.select_tile("sm90a", 9, w_bits=8)
    assert narrow not in [tile for _, tile in heuristics.arch_tile_table("sm90a", 3)]


def test_the_catalog_builds_narrow_code_tiles_for_narrow_codes_only():
    keys = enumerate_keys("default", ["sm90a"])
    narrow = [key for key in keys if key.tile.block_m == 8 and key.tile.block_k == 512]
    assert {key.spec.w_bits for key in narrow} == {1, 2}
    assert {key.spec.w_dtype for key in narrow} >= {"int1", "int2", "uint1", "uint2"}


def test_every_catalog_with_a_wide_tile_holds_its_twin():
    keys = enumerate_keys("default")
    names = {key.name for key in keys}
    wide = [key for key in keys if key.tile.block_k > 64]
    assert wide, "the default catalog has no tile wider than 64 in K: this test no longer checks anything"
    skipped = set()
    for key in wide:
        twin = KernelKey(arch=key.arch, spec=key.spec, tile=heuristics.narrow_twin(key.tile))
        if key.spec.gemm_type is GemmType.DENSE and not heuristics.twin_reachable(key.arch, key.spec.w_bits, key.tile,
                                                                                  key.spec.w_is_float):
            skipped.add(key.tile.label)  # a later row of its M interval takes what the wide tile does not fit
            assert twin.name not in names, f"{twin.name}: built, though no selection picks it"
            continue
        assert twin.name in names, f"{key.name} has no 64-wide twin in the default catalog"
    assert skipped == {"mma-sw:32x64x256_w1x1x4_s3"}, skipped


@pytest.mark.parametrize(
    "label,match",
    [
        ("16x128x32_w1x2_s4", "64, 128, 256 or 512 K per stage"),
        ("wgmma:128x128x128_w1x8_s4", "the wgmma body 64"),
    ],
)
def test_block_k_rules(label, match):
    with pytest.raises(ValueError, match=match):
        parse_tile_field(label)


def test_smem_grows_with_block_k():
    # one K warp: no parked accumulators, so the pipeline alone sets the size
    for label in ("16x128x128_w1x2_s4", "16x128x256_w1x2_s3", "16x128x512_w1x2_s2"):
        wide = parse_tile_field(label)
        narrow = dataclasses.replace(wide, block_k=wide.block_k // 2)
        assert heuristics.smem_bytes(wide, 4, False) == 2 * heuristics.smem_bytes(narrow, 4, False), label
    assert parse_tile_field("wgmma:128x128x64_w1x8_s4").mma is MmaKind.WGMMA


def test_split_k_aims_at_the_rows_resident_ctas():
    tile = heuristics.select_tile("sm90a", 1)
    target = heuristics.split_ctas_per_sm("sm90a", 1, tile)
    assert target == 2  # tiles.toml: 8-warp decode tiles, two CTAs per SM
    # 64 output tiles of 8192 columns on 132 SMs: 264 slots / 64 tiles -> 4 slices
    assert heuristics.split_k_factor(m=1, n=8192, k=8192, tile=tile, num_sms=132, max_tiles=4096,
                                     ctas_per_sm=4, target_ctas_per_sm=target) == 4
    # what fits on the SM caps the target; never fewer than 256 of K per slice, never over 16
    assert heuristics.split_k_factor(m=1, n=8192, k=8192, tile=tile, num_sms=132, max_tiles=4096,
                                     ctas_per_sm=1, target_ctas_per_sm=target) == 2
    assert heuristics.split_k_factor(m=1, n=128, k=1024, tile=tile, num_sms=132, max_tiles=4096,
                                     ctas_per_sm=4, target_ctas_per_sm=4) == 4
    assert heuristics.split_k_factor(m=1, n=128, k=65536, tile=tile, num_sms=132, max_tiles=4096,
                                     ctas_per_sm=4, target_ctas_per_sm=4) == 16
    # a tile that only serves as a twin takes its original's row, scaled by its original's warps
    # over its own (the 8-row twin has 2 K warps instead of 4: twice the CTAs); unknown tiles the default
    twin = heuristics.narrow_twin(tile)
    assert tile.warps_k == 4 and twin.warps_k == 2
    assert heuristics.split_ctas_per_sm("sm90a", 1, twin) == 2 * target
    wide16 = heuristics.select_tile("sm90a", 16)
    assert heuristics.split_ctas_per_sm("sm90a", 16, heuristics.narrow_twin(wide16)) == \
        heuristics.split_ctas_per_sm("sm90a", 16, wide16) * wide16.warps_k // heuristics.narrow_twin(wide16).warps_k
    assert heuristics.split_ctas_per_sm("sm90a", 1, parse_tile_field("64x64x64_w1x1_s2")) == \
        DEFAULT_SPLIT_CTAS_PER_SM


def test_rows_of_one_m_are_chosen_by_output_tiles_per_sm():
    """sm90a at M = 128: the two-warpgroup tile (one CTA per SM) while the output tiles are at most
    0.4 per SM, else the one-warpgroup tile (two CTAs per SM); without N the first row."""
    few = heuristics.select_tile("sm90a", 128, k=4096, group=128, w_bits=4, n=6144, num_sms=132)  # 48 tiles
    many = heuristics.select_tile("sm90a", 128, k=4096, group=128, w_bits=4, n=10240, num_sms=132)  # 80 tiles
    assert few.mma is many.mma is MmaKind.WGMMA_WS
    assert (few.block_m, few.block_n, few.threads) == (128, 128, 384)
    assert (many.block_m, many.block_n, many.threads) == (128, 128, 256)
    assert heuristics.select_tile("sm90a", 128, k=4096, group=128, w_bits=4) == few
    # the rule scales with the device: the same 80 tiles are few on a 264-SM part
    assert heuristics.select_tile("sm90a", 128, k=4096, group=128, w_bits=4, n=10240, num_sms=264) == few


def test_up_to_32_tokens_layers_of_few_tiles_take_the_swapped_32_token_tile():
    """sm90a at 17-32 tokens, codes of at most 4 bits: the swapped 32-token tile (mma.sync,
    split-K) while its 64-column tiles are at most one per SM, else the one-warpgroup TMA tile with
    stream-K; a K that 256 does not divide goes to the TMA tile too, not to the swapped tile's
    64-wide twin, and so do wider codes (measured for 4-bit codes only). The MoE schedules keep
    their own choice (the rule is measured on dense layers)."""
    def pick(m, n, k=4096, bits=4, sms=132):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=sms).label

    for m in (17, 24, 32):
        assert pick(m, 4096) == pick(m, 8192, 8192) == pick(m, 8192, 28672, 2) == "mma-sw:32x64x256_w1x1x4_s3"
        assert pick(m, 4096, bits=5) == pick(m, 4096, bits=8) == "wgmma-ws:32x128x64_w1x4_s8"
        assert pick(m, 10240, 8192) == pick(m, 28672) == "wgmma-ws:32x128x64_w1x4_s8"  # 160, 448 tiles
        assert pick(m, 8192, 29568) == "wgmma-ws:32x128x64_w1x4_s8"
    assert pick(16, 4096).startswith("mma-sw:16x") and pick(33, 6144).startswith("wgmma-ws:48x")
    assert pick(32, 10240, 8192, sms=264) == "mma-sw:32x64x256_w1x1x4_s3"  # 160 tiles on 264 SMs
    for m in (17, 32):  # the grouped row-expert GEMM: the plain sm90 table's mma.sync row
        grouped = heuristics.select_masked_tile("sm90a", m, 256, 128, 4, masked=False)
        assert grouped == heuristics.select_tile("sm90", m, 256, 128, 4) and grouped.mma is MmaKind.MMA_SYNC


def test_65_to_96_tokens_take_a_tile_of_their_rows():
    """From 65 tokens to 96, codes of up to 4 bits take one consumer warpgroup of 80 or 96 rows at
    two CTAs an SM on every layer (the 128-row tiles computed up to 63 rows of padding there: H100,
    docs/performance/log.md section 72, 8192 x 8192 at 72 / 96 tokens 28.0 / 32.1 us against 42.5 /
    39.7 on the table's 128-row tiles; the two-warpgroup 128-row tile of few-tile layers lost too,
    4096 x 14336 at 72 tokens 26.7 against 32.9). Codes of 5 to 8 bits take the same rows since
    log section 74 (int8 channel, 8192 x 8192 at 72 / 96 tokens 36.3 / 39.3 us against 49.7 / 47.0
    on the 128-row tile). 97 tokens up keep the 128-row rows, but 8-bit codes take 128 x 256 of two
    warpgroups where the 128-row tiles pass 0.4 an SM (log section 78), and codes of up to 4 bits
    take 72 x 128 up to 72 tokens and 120 x 128 from 97 to 120 (log section 84:
    test_97_to_120_tokens_take_120_rows_for_narrow_codes)."""
    def pick(m, n, k, bits=4):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=132).label

    for n, k in ((8192, 8192), (4096, 14336), (6144, 4096), (57344, 8192)):
        for bits in (4, 5, 8):
            for m in (65, 72, 80):
                want = "wgmma-ws:72x128x64_w1x4_s4" if bits == 4 and m <= 72 else "wgmma-ws:80x128x64_w1x4_s4"
                assert pick(m, n, k, bits) == want, (m, n, k, bits)
            for m in (81, 88, 96):
                assert pick(m, n, k, bits) == "wgmma-ws:96x128x64_w1x4_s4", (m, n, k, bits)
            wide = bits == 8 and (n, k) in ((8192, 8192), (57344, 8192))  # 64 and 448 tiles of 128 x 128
            rows120 = bits == 4 and (n, k) in ((8192, 8192), (57344, 8192))
            want = "wgmma-ws:128x256x64" if wide else "wgmma-ws:120x128x64" if rows120 else "wgmma-ws:128x128x64"
            assert pick(97, n, k, bits).startswith(want), (n, k, bits)


def test_97_to_120_tokens_take_120_rows_for_narrow_codes():
    """From 97 to 120 tokens, codes of up to 4 bits take 120 x 128 of one warpgroup where
    the one-warpgroup 128 x 128 tile served (past 0.4 of its tiles an SM): H100, docs/performance/
    log.md section 84, int4 g128 at 120 tokens, 8192 x 8192 34.6 us against 38.0, 57344 x 8192
    186.7 against 198.3 (float codes untimed). Few-tile layers keep the two-warpgroup 128 x 128,
    wider codes their rows, and 121 tokens up the 128-row tiles."""
    def pick(m, n, k, bits=4, float_codes=False):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=132,
                                      float_codes=float_codes).label

    for n, k in ((8192, 8192), (10240, 8192), (28672, 4096), (57344, 8192)):
        for m in (97, 104, 113, 120):
            for bits in (1, 2, 3, 4):
                assert pick(m, n, k, bits) == "wgmma-ws:120x128x64_w1x4_s4", (m, n, k, bits)
            assert pick(m, n, k, 4, float_codes=True) == "wgmma-ws:120x128x64_w1x4_s4"
            assert pick(m, n, k, 5) == "wgmma-ws:128x128x64_w1x4_s4"
        assert pick(121, n, k) == "wgmma-ws:128x128x64_w1x4_s4"
    for n, k in ((4096, 14336), (6144, 4096)):  # 32 and 48 tiles of 128 x 128: at most 0.4 an SM
        assert pick(120, n, k) == "wgmma-ws:128x128x64_w1x8_s6"


def test_129_to_192_tokens_take_tiles_of_their_rows_not_the_256_row_tile():
    """From 129 tokens to 192, codes of up to 4 bits take tiles of two consumer warpgroups whose
    rows fit the problem, where the 256-row tile computed up to 127 rows of padding (H100,
    docs/performance/log.md section 73, int4 g128, 8192 x 8192 at 144 / 160 / 192 tokens 41.5 /
    47.2 / 47.5 us against 65.9 / 65.1 / 63.5): 192 x 128 (5 stages) on every layer from 145 to
    192 but those of more than 1.5 of its tiles an SM or more than 10000 columns of K an SM (its
    tiles x K / SMs), which take 176 x 256 with integer codes up to 176 (57344 x 8192 at 160 tokens
    258.3 against 292.3; section 76, H200 / H100: 28672 x 4096 at 160 73.0 / 74.0 against 78.4 /
    79.3, 8192 x 28672 135.8 / 138.2 against 150.9 / 146.6, and 7168 x 18432, 0.42 tiles and 7820
    columns, the other way: 89.0 against 80.8 on the H100); from 129 to 144 the 144 x 256 tile (4
    stages), and where its tiles are at most 0.4 an SM 144 x 128 for codes of up to 4 bits (log
    section 81, H100, int4 g128, against 192 x 128 in one run: 4096 x 14336 at 144 tokens 38.1
    against 41.6, 6144 x 4096 18.8 against 24.7, 3584 x 18944 42.7 against 46.4), 192 x 128 for
    wider codes (section 73: 4096 x 14336 41.5 against 42.5 for 144 x 256, 28672 x 4096 59.5
    against 75.7 the other way). Codes of 5 to 8 bits take the same rows but 176 x 256 (log
    section 74, int8 channel, 8192 x 8192 at 144 / 176 tokens 49.4 / 53.7 us against 72.2 / 69.5
    on the 256-row tile), and from 145 to 176 8-bit codes (integer or float) take 176 x 256 past
    the same bounds (log section 78); 193 tokens up keep the 256-row tile. Within the 192 x 128
    row's bounds, codes of up to 4 bits take 160 x 128 from 145 to 160 tokens (log sections 81
    and 84: 4096 x 14336 at 160 tokens 39.8 against 42.6, 3584 x 18944 45.7 against 51.4)."""
    def pick(m, n, k, bits=4, float_codes=False):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=132,
                                      float_codes=float_codes).label

    t144, t192, t176, t256 = ("wgmma-ws:144x256x64_w1x8_s4", "wgmma-ws:192x128x64_w1x8_s5",
                              "wgmma-ws:176x256x64_w1x8_s4", "wgmma-ws:256x128x64_w1x8_s5")
    t144_128, t160_128 = "wgmma-ws:144x128x64_w1x8_s5", "wgmma-ws:160x128x64_w1x8_s5"
    for n, k in ((8192, 8192), (10240, 8192), (28672, 4096), (57344, 8192)):
        for m in (129, 136, 144):
            assert pick(m, n, k) == pick(m, n, k, float_codes=True) == t144, (m, n, k)
    for n, k in ((4096, 14336), (6144, 4096), (5120, 5120), (3584, 18944)):  # at most 0.4 tiles an SM
        for m in (129, 144):
            for bits in (1, 2, 3, 4):
                assert pick(m, n, k, bits) == pick(m, n, k, bits, float_codes=True) == t144_128, (m, n, k, bits)
        for m in (145, 160, 176, 192):
            assert pick(m, n, k) == (t160_128 if m <= 160 else t192), (m, n, k)
    # up to 1.5 tiles of 192 x 128 an SM and 10000 columns of K an SM (tiles x K / SMs); within
    # them, 160 x 128 for codes of up to 4 bits from 145 to 160 tokens (log section 84)
    for n, k in ((8192, 8192), (10240, 8192), (13824, 5120), (7168, 18432)):
        for m in (145, 160, 176, 177, 192):
            assert pick(m, n, k) == pick(m, n, k, float_codes=True) == (t160_128 if m <= 160 else t192), (m, n, k)
            assert pick(m, n, k, 5) == t192, (m, n, k)
    # past either (28672 x 4096: 1.7 tiles an SM; 8192 x 28672: 13902 columns; 57344 x 8192: both):
    # 4-bit integer codes take 176 x 256, the rest stay
    for n, k in ((57344, 8192), (28672, 4096), (8192, 28672), (36864, 7168)):
        for m in (145, 160, 176):
            assert pick(m, n, k) == t176 and pick(m, n, k, float_codes=True) == t192, (m, n, k)
        assert pick(177, n, k) == t192, (n, k)
    assert pick(177, 57344, 8192) == pick(192, 57344, 8192) == t192
    for bits in (5, 8):
        for n, k in ((8192, 8192), (10240, 8192), (28672, 4096), (57344, 8192)):
            assert pick(144, n, k, bits) == pick(144, n, k, bits, float_codes=True) == t144, (n, k, bits)
        for n, k in ((4096, 14336), (6144, 4096)):
            assert pick(144, n, k, bits) == t192, (n, k, bits)
        for n, k in ((4096, 14336), (8192, 8192), (28672, 4096), (57344, 8192), (8192, 28672)):
            wide = bits == 8 and (n, k) in ((28672, 4096), (57344, 8192), (8192, 28672))
            for m in (145, 160, 176):
                want = t176 if wide else t192
                assert pick(m, n, k, bits) == pick(m, n, k, bits, float_codes=True) == want, (m, n, k, bits)
            assert pick(192, n, k, bits) == t192, (n, k, bits)
    for n, k in ((8192, 8192), (4096, 14336), (57344, 8192)):
        assert pick(193, n, k) == pick(193, n, k, bits=8) == t256, (n, k)
        assert pick(128, n, k).startswith("wgmma-ws:128x128x64"), (n, k)


def test_33_to_64_tokens_take_the_swapped_32_token_tile_while_each_sms_k_share_is_short():
    """sm90a at 33-64 tokens, codes of at most 4 bits: the swapped 32-token tile (two token tiles
    per weight tile) while its output tiles are at most one per SM and those tiles times K over the
    SM count are short: at most 4864 columns up to 48 tokens (log section 43: 4096 x 4096 at 3972
    columns won, 4096 x 6144 at 5958 lost to the 48-token TMA tile), 6144 from 49 (section 42:
    4096 x 6144 won, 4096 x 8192 at 7944 lost). Else the 48-token TMA tile up to 48 tokens (8-bit
    codes keep the 64-token one: 48 rows of 8 stages fit one CTA per SM there, and lost), the
    64-token TMA tile above. Without N or the SM count the condition cannot be judged and the first
    row of the interval is taken, as for max_tiles_per_sm alone."""
    def pick(m, n, k, bits=4, sms=132):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=sms).label

    swapped, tma48, tma = "mma-sw:32x64x256_w1x1x4_s3", "wgmma-ws:48x128x64_w1x4_s8", "wgmma-ws:64x128x64_w1x4_s6"
    for m in (33, 40, 48, 49, 56, 64):
        wide = tma48 if m <= 48 else tma
        for n, k in ((4096, 4096), (3584, 3584), (2048, 4096), (2048, 8192)):
            assert pick(m, n, k) == swapped, (m, n, k)
        assert pick(m, 4096, 6144) == (tma48 if m <= 48 else swapped), m
        for n, k in ((4096, 8192), (4096, 11008), (3584, 18944), (6144, 4096), (8192, 8192), (28672, 4096)):
            assert pick(m, n, k) == wide, (m, n, k)
        assert pick(m, 4096, 4096, bits=8) == pick(m, 8192, 8192, bits=5) == tma  # 48 rows: 4-bit codes only
        assert pick(m, 4096, 4096 + 64) == wide  # a K that 256 does not divide: a TMA tile, not the twin
        assert pick(m, 4096, 8192, sms=264) == swapped  # 128 tiles x 8192 on 264 SMs: 3972 columns each
        assert heuristics.select_tile("sm90a", m, k=4096, group=128, w_bits=4, dense_rows=False).label == wide
        # N or the SM count unknown: the interval's first row, the swapped tile
        assert heuristics.select_tile("sm90a", m, k=4096, group=128, w_bits=4).label == swapped
        assert pick(m, 8192, 8192, sms=None) == swapped
    assert pick(65, 4096, 4096) == "wgmma-ws:72x128x64_w1x4_s4"  # past 64: the 72-token row
    fill = heuristics.tiles.FillCondition(max_tiles_per_sm=1.0, max_k_per_sm=6144)
    tile = parse_tile_field("mma-sw:32x64x256_w1x1x4_s3")
    assert fill.admits(tile, 64, 4096, 6144, 132) and not fill.admits(tile, 64, 4096, 6400, 132)  # 128 x 6400 > 132 x 6144
    assert fill.admits(tile, 64, 4096, 10**6, None) and fill.admits(tile, 64, 4096, None, 132)
    assert not fill.admits(tile, 64, 4224 + 64, None, 132)  # 134 tiles on 132 SMs


def test_a_wide_rows_twin_is_built_only_where_the_table_can_pick_it():
    """The 32-token swapped rows (up to 32, 48 and 64 tokens) are each followed in their M
    interval by a TMA tile (64-wide stages, no fill condition), which takes every K the wide
    tile does not fit: its twin is never
    picked and the default catalog does not build it; the 16-token rows' twin is reachable (no
    64-wide row follows them) and is built."""
    wide32 = heuristics.select_tile("sm90a", 32, k=4096, group=128, w_bits=4, n=4096, num_sms=132)
    wide16 = heuristics.select_tile("sm90a", 16, k=4096, group=128, w_bits=4)
    assert not heuristics.twin_reachable("sm90a", 4, wide32)
    assert heuristics.twin_reachable("sm90a", 4, wide16)
    assert heuristics.twin_reachable("sm90a", 4, parse_tile_field("mma-sw:32x64x512_w1x1x4_s2"))  # in no row
    for k in (4096 + 128, 4096 + 64):  # K the wide tile does not fit: the next row, never the twin
        assert heuristics.select_tile("sm90a", 32, k=k, group=64, w_bits=4, n=4096, num_sms=132).block_k == 64
        assert heuristics.select_tile("sm90a", 32, k=k, group=64, w_bits=4, n=4096, num_sms=132) != \
            heuristics.narrow_twin(wide32)
    labels = {key.tile.label for key in enumerate_keys("default", ["sm90a"]) if key.spec.w_dtype == "int4"}
    assert wide32.label in labels and heuristics.narrow_twin(wide32).label not in labels
    assert heuristics.narrow_twin(wide16).label in labels


def test_stream_k_runs_below_one_wave_of_tiles():
    def ctas(tiles, k_tiles, slots):
        return heuristics.stream_k_ctas(tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=4096)

    assert ctas(48, 64, 264) == 264  # 48 tiles on 264 slots: every slot, ranges cut inside tiles
    assert ctas(131, 64, 132) == 132
    assert ctas(132, 64, 132) == 0  # a whole wave: the tail split (no fix-up)
    assert ctas(2, 64, 264) == 0  # fewer K tiles than slots: nothing to spread
    assert ctas(5000, 64, 132) == 0  # more tiles than counters


def test_a_nearly_full_wave_of_whole_tiles_skips_the_fix_up_where_the_idle_slots_cost_less():
    """With fixup_k_tiles (the 16-bit body's one-warpgroup tiles), below one wave: whole tiles (0)
    where the tail split keeps them whole and the slots they leave idle, (1 - tiles / slots) x
    k_tiles, cost less than the fix-up's K tiles; stream-K otherwise (log section 80, H100, int4 at
    96-128 tokens)."""
    fixup = heuristics.STREAM_K_FIXUP_K_TILES

    def ctas(tiles, k_tiles, slots=264):
        return heuristics.stream_k_ctas(tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=4096,
                                        fixup_k_tiles=fixup)

    # 28672 x 4096 and 30720 x 4096 (224 / 240 tiles of 128 channels, 64 K tiles), 28672 x 3584,
    # 27648 x 5120: whole tiles were 2-17 % faster at 96-128 tokens
    assert ctas(224, 64) == ctas(240, 64) == ctas(224, 56) == ctas(216, 80) == 0
    # few tiles (8192 x 8192, 6144 x 4096, 7168 x 18432, 8192 x 28672): the tail split would cut
    # them, so stream-K stays, whatever K
    assert ctas(64, 128) == ctas(48, 64) == ctas(56, 288) == ctas(64, 448) == 264
    # the bound: idle slots worth exactly the fix-up keep stream-K; one tile more, whole tiles
    bound = 264 - fixup * 264 // 64  # 198 tiles of 64 K tiles
    assert ctas(bound, 64) == 264 and ctas(bound + 1, 64) == 0
    # a longer K makes the idle slots dearer: of 128 K tiles, 231 tiles keep stream-K, 232 not
    assert ctas(220, 128) == ctas(231, 128) == 264 and ctas(232, 128) == 0
    # the rule is opt-in: without fixup_k_tiles (the W8A8 / W4A8 schedules) stream-K as before
    assert heuristics.stream_k_ctas(tiles=224, k_tiles=64, slots=264, max_tiles=4096) == 264
    # the dispatcher's fixup_k_tiles: the fit's 16 for 128 rows of one warpgroup, scaled by the
    # rows (the partial a CTA stores), none for two warpgroups (one CTA an SM, not measured) or
    # other bodies
    assert heuristics.stream_k_fixup_k_tiles(parse_tile_field("wgmma-ws:128x128x64_w1x4_s4")) == fixup == 16
    assert heuristics.stream_k_fixup_k_tiles(parse_tile_field("wgmma-ws:64x128x64_w1x4_s6")) == 8
    assert heuristics.stream_k_fixup_k_tiles(parse_tile_field("wgmma-ws:144x256x64_w1x8_s4")) == 0
    assert heuristics.stream_k_fixup_k_tiles(parse_tile_field("16x128x256_w1x2x4_s2")) == 0
    # so 28672 x 4096 (224 tiles, 9.7 idle K tiles) runs whole tiles from 65 tokens (80 rows), not
    # at 64 rows (measured level there), and 27648 x 5120 (14.5 idle) only with 128 rows
    for m, whole in ((64, False), (80, True), (96, True), (128, True)):
        tile = heuristics.select_tile("sm90a", m, k=4096, group=128, w_bits=4, n=28672, num_sms=132)
        got = heuristics.stream_k_ctas(tiles=224, k_tiles=64, slots=264, max_tiles=4096,
                                       fixup_k_tiles=heuristics.stream_k_fixup_k_tiles(tile))
        assert got == (0 if whole else 264), (m, tile.label)
    for m, whole in ((96, False), (128, True)):
        tile = heuristics.select_tile("sm90a", m, k=5120, group=128, w_bits=4, n=27648, num_sms=132)
        got = heuristics.stream_k_ctas(tiles=216, k_tiles=80, slots=264, max_tiles=4096,
                                       fixup_k_tiles=heuristics.stream_k_fixup_k_tiles(tile))
        assert got == (0 if whole else 264), (m, tile.label)


def test_stream_k_ranges_shorter_than_the_bound_give_way_to_the_tail_split():
    """With min_range_k_tiles (the 16-bit body's one-warpgroup tiles of at least 72 rows), below
    one wave: the tail split (0) where stream-K's ranges, tiles x k_tiles / slots, would be shorter
    than that; stream-K from the bound up (log section 83, H100, int4 at 72 and 96 tokens: the
    tail split 6-50 % faster on seven layers of 3.9-7.8 K tiles a range, stream-K level or faster
    from 9.7)."""
    bound = heuristics.STREAM_K_MIN_RANGE_K_TILES

    def ctas(tiles, k_tiles, bound=bound, slots=264):
        return heuristics.stream_k_ctas(tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=4096,
                                        min_range_k_tiles=bound)

    # 128-channel tiles: 4096 x 4096 (7.8 K tiles a range), 2048 x 4096, 3584 x 3584, 4096 x 2048,
    # 1280 x 8192, 8192 x 1024: the tail split
    assert ctas(32, 64) == ctas(16, 64) == ctas(28, 56) == ctas(32, 32) == ctas(10, 128) == ctas(64, 16) == 0
    # 5120 x 4096 (9.7), 6144 x 4096 (11.6), 8192 x 3584, 4096 x 14336, 8192 x 8192: stream-K
    assert ctas(40, 64) == ctas(48, 64) == ctas(64, 56) == ctas(32, 224) == ctas(64, 128) == 264
    # the bound itself: ranges of exactly `bound` K tiles keep stream-K, one K tile less of work not
    assert ctas(33, bound * 8) == 264 and ctas(33, bound * 8 - 1) == 0
    # opt-in: without it (W8A8, W4A8) stream-K as before
    assert ctas(32, 64, bound=0) == 264
    # which tiles opt in: one warpgroup of 72 rows or more, not fewer rows or two warpgroups
    pick = heuristics.stream_k_min_range_k_tiles
    for label in ("wgmma-ws:72x128x64_w1x4_s4", "wgmma-ws:80x128x64_w1x4_s4", "wgmma-ws:96x128x64_w1x4_s4", "wgmma-ws:128x128x64_w1x4_s4"):
        assert pick(parse_tile_field(label)) == bound, label
    for label in ("wgmma-ws:64x128x64_w1x4_s6", "wgmma-ws:48x128x64_w1x4_s8", "wgmma-ws:128x128x64_w1x8_s6",
                  "16x128x256_w1x2x4_s2"):
        assert pick(parse_tile_field(label)) == 0, label
    # through the table: 4096 x 4096 at 72 and 96 tokens (72 / 96 rows of one warpgroup) runs the
    # tail split; at 120 tokens its two-warpgroup 128-row tile keeps stream-K (not measured)
    for m, tail in ((72, True), (96, True), (120, False)):
        tile = heuristics.select_tile("sm90a", m, k=4096, group=128, w_bits=4, n=4096, num_sms=132)
        slots = 264 if tile.warps_n == 4 else 132
        got = heuristics.stream_k_ctas(tiles=4096 // tile.block_n, k_tiles=64, slots=slots, max_tiles=4096,
                                       fixup_k_tiles=heuristics.stream_k_fixup_k_tiles(tile),
                                       min_range_k_tiles=pick(tile))
        assert (got == 0) == tail, (m, tile.label, got)


def test_above_512_tokens_integer_codes_take_176_tokens_by_256_channels_where_the_k_share_is_long():
    """sm90a above 512 tokens: the 256-token x 128-channel TMA tile while its output tiles times K
    over the SM count are at most 26000 columns (each SM's share of the K loop); past that, integer
    codes of at most 4 bits (int / uint, with zero points too) take 176 tokens x 256 channels, 4
    stages (log section 53: int4 on 8192 x 8192 at 2048 tokens, 3.9 tiles x 8192 per SM, 2.4 %
    faster; 4096 x 4096 at 2048, 7944 columns, 9 % slower), while float codes (MXFP4 lost 2-9 %
    with it) and wider codes (int8 lost 2-13 %) keep the 256-token tile everywhere."""
    def pick(m, n, k, bits=4, float_codes=False, sms=132):
        return heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=sms,
                                      float_codes=float_codes).label

    wide, tall = "wgmma-ws:176x256x64_w1x8_s4", "wgmma-ws:256x128x64_w1x8_s5"
    for m in (1024, 2048, 4096, 8192, 65536):
        assert pick(m, 57344, 8192) == pick(m, 8192, 28672) == pick(m, 7168, 18432) == wide, m
        assert pick(m, 57344, 8192, bits=1) == pick(m, 57344, 8192, bits=3) == wide, m
        for bits, float_codes in ((4, True), (8, True), (8, False), (5, False)):
            assert pick(m, 57344, 8192, bits, float_codes) == tall, (m, bits, float_codes)
    for m in (193, 256, 512):  # from 193 up to 512 tokens the 256-token tile whatever the share of K
        assert pick(m, 57344, 8192) == tall, m
    # 4096 x 4096: 32 x 4096 / 132 = 993 columns per 256 tokens; 26000 passed above 6656 tokens
    assert pick(6656, 4096, 4096) == tall and pick(6657, 4096, 4096) == pick(8192, 4096, 4096) == wide
    assert pick(2048, 8192, 8192) == wide and pick(1536, 8192, 8192) == tall  # 31775 and 23831 columns
    assert pick(2048, 8192, 8192, sms=264) == tall  # the share halves on twice the SMs
    # without N, K or the SM count the condition is not judged: the first row of the interval
    assert heuristics.select_tile("sm90a", 8192, w_bits=4) == parse_tile_field(tall)
    # the grouped row-expert GEMM never reaches the TMA rows (the plain sm90 table's instead)
    assert heuristics.select_masked_tile("sm90a", 4096, 7168, 128, 4, masked=False).mma is MmaKind.MMA_SYNC


def test_a_row_of_unknown_codes_is_refused(monkeypatch):
    from humming_aot.heuristics import tiles

    table = {"arch": {"sm90a": {"smem_limit": 232448, "tiles": [
        {"max_m": 10**9, "codes": "floats", "block_m": 64, "block_n": 128, "warps_m": 1, "warps_n": 2, "stages": 4}]}}}
    monkeypatch.setattr(tiles, "load_toml", lambda name: table)
    tiles._table_rows.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"codes = 'floats'.*'any', 'integer'"):
            tiles._table_rows("sm90a")
    finally:
        tiles._table_rows.cache_clear()
        tiles.arch_tile_table.cache_clear()


def test_the_dense_producer_keeps_40_registers_except_where_the_consumers_need_them():
    """bodies/wgmma_ws.dense_producer_registers (kernel/dense_wgmma_ws.cuh kProducerRegisters, which
    the generated source static_asserts against it): 40, or setmaxnreg's least, 24, where 40 would
    leave the consumers fewer registers than their accumulators, the dequantization's 48 and 16
    more (ptxas warning C7512): among the sm90a table's tiles only 176 x 256."""
    from humming_aot.bodies.wgmma_ws import dense_producer_registers
    from humming_aot.codegen import kernel_source

    least = {tile.label for bits in (1, 4, 8) for float_codes in (False, True)
             for _, tile in heuristics.arch_tile_table("sm90a", bits, float_codes)
             if tile.mma is MmaKind.WGMMA_WS and dense_producer_registers(tile) == 24}
    assert least == {"wgmma-ws:176x256x64_w1x8_s4"}
    for field, registers in (("160x256x64_w1x8_s4", 40), ("256x128x64_w1x8_s5", 40), ("176x256x64_w1x8_s3", 24),
                             ("144x128x64_w1x4_s4", 40), ("64x128x64_w1x4_s6", 40)):
        assert dense_producer_registers(parse_tile_field(f"wgmma-ws:{field}")) == registers, field
    source = kernel_source(KernelKey.from_name("gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_176x256x64_w1x8_s4"))
    assert "static_assert(Kernel::kProducerRegisters == 24," in source


def test_a_row_behind_one_that_serves_every_problem_is_left_out():
    """A row of the table that select_tile never reaches for some codes (after a row of its M
    interval with no fill condition and 64-wide K stages) is not in their table, so the catalog does
    not build its tile for them: 8-bit codes' 128 x 256 and 176 x 256 rows come after rows for codes
    of up to 7 bits (max_w_bits = 7), and so serve 8-bit codes only."""
    def rows(bits, float_codes=False):
        return {(max_m, tile.label) for max_m, tile in heuristics.arch_tile_table("sm90a", bits, float_codes)}

    wide128, wide176 = (128, "wgmma-ws:128x256x64_w1x8_s4"), (176, "wgmma-ws:176x256x64_w1x8_s4")
    assert wide128 in rows(8) and wide176 in rows(8) and wide176 in rows(8, float_codes=True)
    for bits in (5, 6, 7):
        assert wide128 not in rows(bits) and wide176 not in rows(bits) and wide176 not in rows(bits, True), bits
    # 4-bit integer codes: 176 x 256 is their own row, the general rows behind it are left out
    assert wide176 in rows(4) and wide176 not in rows(4, float_codes=True)
    labels_176 = [tile.label for max_m, tile in heuristics.arch_tile_table("sm90a", 4) if max_m == 176]
    assert labels_176 == ["wgmma-ws:192x128x64_w1x8_s5", "wgmma-ws:176x256x64_w1x8_s4"]
    for m in (97, 128, 145, 176):  # and select_tile picks as before for the narrower codes
        for n, k in ((8192, 8192), (57344, 8192)):
            pick = heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=6, n=n, num_sms=132).label
            assert pick in ("wgmma-ws:128x128x64_w1x4_s4", "wgmma-ws:192x128x64_w1x8_s5"), (m, n, pick)
