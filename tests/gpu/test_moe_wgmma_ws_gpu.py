"""The grouped masked MoE GEMM and its offsets form on the warp-specialized TMA body
(kernel/grouped_masked_ws.cuh, sm_90a), through forced wgmma-ws tiles (the moe_tiles rows' and
others): against the float64 reference of each expert's operands, with NaN-poisoned outputs,
and with more tiles than resident CTAs, so that each CTA runs several tiles through one ring."""
from __future__ import annotations

import pytest
import torch
from test_moe_kernels_gpu import _WHY_NOT, _check, _forced_key, _seed  # the MoE kernels' GPU test helpers

import humming_aot
from humming_aot.moe import gemm_masked_kernel, pack_experts
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm, with_every_code

pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

# the moe_tiles rows' tiles (16 to 176 rows), a 32-row one of a single consumer warpgroup (two
# CTAs per SM), the 16- and 8-row ones (wgmma N = 16 and 8), and token counts that are not
# powers of two (48, 96, 144, and 176 with the most accumulators the register split holds), and
# consumer warpgroups of 256 channels (four units; 512 columns: a tile past N = 192; the decode
# rows' 8-, 16- and 32-row tiles of one such warpgroup, in the table's 4 stages and in 6 and 5;
# the 8-row one three CTAs per SM but for uint4 with zero points in 6; the 8-row tile of two such
# warpgroups, two CTAs per SM in 4 stages; the 48- and 64-row rows' one-warpgroup tiles of 4-bit
# codes, two CTAs per SM, the 64-row one in 3 stages as zero points take it; 24 and 40 rows, wgmma
# N = 24 / 40, of one and two warpgroups)
WS_TILES = ("wgmma-ws:64x256x64_w1x8_s4", "wgmma-ws:144x256x64_w1x8_s4", "wgmma-ws:128x256x64_w1x8_s4",
            "wgmma-ws:32x128x64_w1x4_s6", "wgmma-ws:32x256x64_w1x8_s4", "wgmma-ws:48x256x64_w1x8_s4",
            "wgmma-ws:16x256x64_w1x8_s4", "wgmma-ws:8x128x64_w1x4_s8", "wgmma-ws:96x256x64_w1x8_s4",
            "wgmma-ws:176x256x64_w1x8_s3", "wgmma-ws:16x256x64_w1x4_s6", "wgmma-ws:16x512x64_w1x8_s4",
            "wgmma-ws:8x256x64_w1x4_s6", "wgmma-ws:32x256x64_w1x4_s6", "wgmma-ws:32x256x64_w1x4_s5",
            "wgmma-ws:32x256x64_w1x4_s4", "wgmma-ws:32x256x64_w1x4_s3", "wgmma-ws:8x256x64_w1x4_s5",
            "wgmma-ws:80x256x64_w1x8_s4", "wgmma-ws:160x256x64_w1x8_s4", "wgmma-ws:160x256x64_w1x8_s3",
            "wgmma-ws:8x256x64_w1x4_s4", "wgmma-ws:16x256x64_w1x4_s4", "wgmma-ws:8x512x64_w1x8_s4",
            "wgmma-ws:48x256x64_w1x4_s4", "wgmma-ws:64x256x64_w1x4_s4", "wgmma-ws:64x256x64_w1x4_s3",
            "wgmma-ws:24x256x64_w1x8_s6", "wgmma-ws:40x256x64_w1x8_s6", "wgmma-ws:24x256x64_w1x4_s6",
            "wgmma-ws:40x256x64_w1x4_s4")


def _sm90a() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not _sm90a(), reason="the wgmma-ws body is sm_90a's")
@pytest.mark.parametrize("fmt", ("int4:g128", "uint4:g64:zp", "mxfp4"))
@pytest.mark.parametrize("tile", WS_TILES)
def test_masked_schedule_on_the_wgmma_ws_body(fmt, tile):
    """kernel/grouped_masked_ws.cuh through forced wgmma-ws tiles: the masked layout under uniform,
    skewed and empty counts and the offsets form, with bias, experts whose global scales differ and
    a last column tile past N, against the float64 reference of each expert's operands; rows past
    each count (slabs) and rows of no expert (offsets) untouched in a NaN-poisoned output, though
    the activation boxes read other experts' rows there."""
    from humming_aot.moe import gemm_grouped_kernel

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k = 6, 192, 512
    w = torch.randn(e, n, k, device="cuda", generator=gen) * 0.05
    w[1] *= 100
    experts = pack_experts(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=torch.bfloat16)
    bias = (torch.randn(e, n, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    for max_m, counts in ((40, [0, 40, 1, 17, 0, 39]), (130, [130, 0, 0, 0, 0, 3]), (64, [64] * 6),
                          (16, [16, 0, 5, 16, 1, 0]), (8, [0] * 6)):  # (a map of fewer rows than a box; no tile)
        key = _forced_key(experts, max_m, tile)
        context = f"{key.name} max_m={max_m} counts={counts} seed={seed}"
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm_masked_kernel(a, experts, masked_m, bias=bias, out=out, tile=tile)
        _check(out, a, experts, masked_m, bias, key, context)
        for i, count in enumerate(counts):
            assert out[i, count:].isnan().all(), context
    offsets = torch.tensor([3, 20, 20, 41, 70, 70, 75], device="cuda", dtype=torch.int32)
    a = torch.randn(80, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((80, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=16, bias=bias, out=out, tile=tile)
    key = _forced_key(experts, 16, tile)
    for x in range(e):
        lo, hi = offsets[x].item(), offsets[x + 1].item()
        if hi > lo:
            w_eff = experts.effective_weight(x, scales_in_fp32=key.scales_in_fp32)
            assert_gemm_close(out[lo:hi], reference_gemm(a[lo:hi], w_eff, bias[x]), a=a[lo:hi], w_eff=w_eff,
                              bias=bias[x], context=f"{key.name} offsets expert {x} seed={seed}")
    assert out[:3].isnan().all() and out[75:].isnan().all()
    with pytest.raises(ValueError, match="the tile is a wgmma-ws one"):
        gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=16, tile=tile, splits=2)


@pytest.mark.skipif(not _sm90a(), reason="the wgmma-ws body is sm_90a's")
@pytest.mark.parametrize("tile", WS_TILES)
def test_wgmma_ws_schedule_runs_many_tiles_per_cta(tile):
    """More tiles than resident CTAs (110 of 128 experts with 65-100 rows, N = 512: 440 tiles of
    64 x 256 and 220 of 96 to 176 x 256 against 132 resident CTAs, 1760 of 32 x 128 against 264): each
    CTA runs several tiles through one mbarrier ring, filling the next tile's stages while it
    stores this one; every expert against the float64 reference, in both forms, twice (the same
    bits: no race between a tile's staged store and the next tile's)."""
    from humming_aot.moe import gemm_grouped_kernel

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e, n, k, max_m = 128, 512, 256, 100
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    counts = torch.randint(65, max_m + 1, (e,), device="cuda", generator=gen, dtype=torch.int32)
    counts[::7] = 0  # empty experts among them
    a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
    key = _forced_key(experts, max_m, tile)
    runs = [gemm_masked_kernel(a, experts, counts, tile=tile) for _ in range(2)]
    assert torch.equal(runs[0], runs[1]), f"{key.name}: two runs differ (seed={seed})"
    _check(runs[0], a, experts, counts, None, key, f"{key.name} many experts seed={seed}")
    offsets = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
    rows = torch.cat([a[x, :c] for x, c in enumerate(counts.tolist())])
    grouped = gemm_grouped_kernel(rows, experts, offsets=offsets, expected_m=max_m, tile=tile)
    expect = torch.cat([runs[0][x, :c] for x, c in enumerate(counts.tolist())])
    assert torch.equal(grouped, expect), f"{key.name}: the offsets form differs from the slabs (seed={seed})"


@pytest.mark.skipif(not _sm90a(), reason="the wgmma-ws body is sm_90a's")
@pytest.mark.parametrize("tile", ("wgmma-ws:32x256x64_w1x4_s6", "wgmma-ws:8x256x64_w1x4_s6"))
@pytest.mark.parametrize("e", (256, 300))
def test_walk_table_at_and_past_256_experts(tile, e):
    """The walk's table in shared memory (schedule/expert_table.cuh ExpertTable): 256 experts, one a
    bucket (the table's last start, written apart), and 300, two a bucket (the experts of a bucket
    walked one by one): counts at the buckets' and the lanes' edges among empty experts, in both
    forms, every real row against the float64 reference and every other row untouched (NaN)."""
    from humming_aot.moe import gemm_grouped_kernel

    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k, max_m = 256, 256, 40
    experts = pack_experts(humming_aot.quantize(torch.randn(e, n, k, device="cuda", generator=gen) * 0.05,
                                                "int4:g128"), act_dtype=torch.bfloat16)
    sparse = [0] * e
    for expert, count in ((0, 3), (1, 40), (7, 1), (8, 9), (254, 17), (255, 40), (e - 2, 5), (e - 1, 33)):
        sparse[expert] = count
    counts = torch.tensor(sparse, dtype=torch.int32, device="cuda")
    a = torch.randn(e, max_m, k, device="cuda", generator=gen).to(torch.bfloat16)
    key = _forced_key(experts, max_m, tile)
    out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_masked_kernel(a, experts, counts, out=out, tile=tile)
    _check(out, a, experts, counts, None, key, f"{key.name} e={e} seed={seed}")
    for i, count in enumerate(sparse):
        assert out[i, count:].isnan().all(), f"{key.name} e={e} expert {i} seed={seed}"
    offsets = torch.cat([torch.ones(1, device="cuda", dtype=torch.int32), 1 + counts.cumsum(0).to(torch.int32)])
    rows = torch.cat([a[x, :c] for x, c in enumerate(sparse)])
    flat = torch.cat([rows.new_zeros(1, k), rows, rows.new_zeros(2, k)])  # a row of no expert each side
    grouped = torch.full((flat.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_grouped_kernel(flat, experts, offsets=offsets, expected_m=max_m, tile=tile, out=grouped)
    expect = torch.cat([out[x, :c] for x, c in enumerate(sparse)])
    assert torch.equal(grouped[1:-2], expect), f"{key.name} e={e}: the offsets form differs (seed={seed})"
    assert grouped[0].isnan().all() and grouped[-2:].isnan().all()
