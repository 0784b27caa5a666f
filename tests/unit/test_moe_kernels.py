"""The MoE GEMMs' host side (humming_aot/moe/kernels.py: the grouped masked and the grouped
contiguous schedules) without a GPU: the tile they pick, the grid and Params bytes they launch
with, and the errors they raise before anything reaches a kernel."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import humming_aot
from humming_aot import heuristics, params_abi
from humming_aot.enumerate import parse_tile_field
from humming_aot.moe import decode_tiles, gemm_masked_kernel, pack_experts
from humming_aot.moe import kernels as moe_kernels
from humming_aot.moe.kernels import launch_arguments


def _experts(fmt="uint4:g64:zp", e=3, n=192, k=256):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(0)) * 0.05
    return pack_experts(humming_aot.quantize(w, fmt), act_dtype=torch.bfloat16)


def test_the_launch_passes_expert_zero_and_the_strides_between_experts():
    experts = _experts()
    e, max_m, k, n = 3, 20, 256, 192
    a = torch.zeros(e, max_m, k, dtype=torch.bfloat16)
    out = torch.zeros(e, max_m, n, dtype=torch.bfloat16)
    counts = torch.tensor([5, 0, 20], dtype=torch.int32)
    bias = torch.zeros(e, n, dtype=torch.bfloat16)
    tile = heuristics.select_masked_tile("sm90a", 16, k, 64, 4, masked=False)
    grid, params = launch_arguments(a, experts, counts, bias, out, tile, resident=1000)
    assert tile.block_m == 16
    # persistent: ceil(20 / 16) x ceil(192 / block_n) tiles of a full slab, per expert, at most the
    # resident CTAs
    tiles = e * 2 * -(-n // tile.block_n)
    assert grid == (tiles, 1, 1)
    assert launch_arguments(a, experts, counts, bias, out, tile, resident=5)[0] == (5, 1, 1)
    assert len(params) == params_abi.MASKED_PARAMS_BYTES == 184
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[:8] == (a.data_ptr(), experts.w.data_ptr(), experts.w_scale.data_ptr(),
                        experts.w_zero_point.data_ptr(), bias.data_ptr(), out.data_ptr(), 0, 0)
    assert gemm[8:] == (k, n, max_m, n, k, 64, 1, 1.0)  # lda, ldo, m = max_m, n, k, group, one slice
    tail = params_abi.MASKED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:])
    assert tail[:2] == (counts.data_ptr(), experts.global_scale_tensor.data_ptr())
    strides = tail[2:8]  # ExpertWeights' four, then the activation and output slabs'
    for stride, tensor in zip(strides, (experts.w, experts.w_scale, experts.w_zero_point, bias, a, out)):
        assert stride == tensor[1].data_ptr() - tensor[0].data_ptr()  # expert 1's slab minus expert 0's
    assert tail[8] == e and tail[9] == 0  # the slabs' form: no offsets
    symmetric = _experts("int4:g128")
    _, params = launch_arguments(a, symmetric, counts, None, out, tile, resident=1000)
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    tail = params_abi.MASKED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:])
    assert gemm[3] == gemm[4] == 0 and tail[4] == tail[5] == 0  # no zero points, no bias


def test_the_offsets_form_launches_the_masked_walk_over_one_activation():
    from humming_aot.moe.kernels import offsets_launch_arguments

    experts = _experts()
    e, rows, k, n = 3, 75, 256, 192
    a = torch.zeros(rows, k, dtype=torch.bfloat16)
    out = torch.zeros(rows, n, dtype=torch.bfloat16)
    offsets = torch.tensor([3, 20, 20, 70], dtype=torch.int32)
    tile = parse_tile_field("mma-sw:16x64x128_w1x1x2_s2")  # 3 column tiles
    grid, params = offsets_launch_arguments(a, experts, offsets, None, out, tile, resident=10_000)
    # at most R / block_m row tiles plus one partial tile per expert with rows, per N tile
    bound = (rows // tile.block_m + min(e, rows)) * -(-n // tile.block_n)
    assert grid == (bound, 1, 1) and moe_kernels.offsets_tile_bound(rows, e, n, tile) == bound
    assert offsets_launch_arguments(a, experts, offsets, None, out, tile, resident=7)[0] == (7, 1, 1)
    assert len(params) == params_abi.MASKED_PARAMS_BYTES
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[0] == a.data_ptr() and gemm[5] == out.data_ptr()
    assert gemm[8:] == (k, n, rows, n, k, 64, 1, 1.0)  # m = R bounds every expert's rows
    tail = params_abi.MASKED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:])
    assert tail[0] == 0  # no counts: the offsets give them
    assert tail[6:] == (0, 0, e, offsets.data_ptr())  # no slab strides, E, the offsets
    with pytest.raises(ValueError, match=r"reads \(4,\) contiguous int32 offsets, got \(4,\) torch.int64"):
        offsets_launch_arguments(a, experts, offsets.long(), None, out, tile, resident=7)
    # K slices: the grid's y, the workspace and counters in GemmParams, the resident CTAs shared out
    workspace = torch.zeros(3 * rows * n)
    counters = torch.zeros(bound, dtype=torch.int32)
    grid, params = offsets_launch_arguments(a, experts, offsets, None, out, tile, resident=30, splits=3,
                                            workspace=workspace, counters=counters)
    assert grid == (10, 3, 1)
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[6:8] == (workspace.data_ptr(), counters.data_ptr()) and gemm[14] == 3
    with pytest.raises(ValueError, match="3 K slices need a float32 workspace of 3 x 75 x 192"):
        offsets_launch_arguments(a, experts, offsets, None, out, tile, resident=30, splits=3,
                                 workspace=workspace[:10], counters=counters)


def test_the_offsets_form_splits_k_only_when_its_tiles_leave_most_slots_idle():
    from humming_aot.moe.kernels import MAX_OFFSETS_SPLITS, MIN_SLICE_K_TILES, offsets_splits

    # DeepSeek-V3 TP8 gate_up at one token: 8 rows, 8 x 128 tiles, N 512: at most 9 x 4 tiles for
    # 264 slots, 28 K tiles of 256: 7 slices of 4 K tiles
    tile = heuristics.select_masked_tile("sm90a", 1, 7168, 128, 4)
    bound = moe_kernels.offsets_tile_bound(8, 256, 512, tile)
    assert bound == 36 and offsets_splits(bound, 7168 // tile.block_k, 264) == 7
    assert offsets_splits(36, 2, 264) == 1  # a short K: too few K tiles to slice
    assert offsets_splits(100, 64, 264) == 1  # tiles fill more than a quarter of the slots
    assert offsets_splits(1, 1000, 10_000) == MAX_OFFSETS_SPLITS
    assert offsets_splits(10, 3 * MIN_SLICE_K_TILES, 1000) == 3
    assert offsets_splits(5000, 1000, 10**6) == 1  # more tiles than split-K counters
    # the 16-bit-activation form on a long K: up to half the slots, at most 4 slices. DeepSeek-V3
    # TP8 gate_up at 1-4 tokens (8-32 rows, 28 K tiles of 256, 264 slots): 4, 3, 2, 1 slices
    from humming_aot.moe.kernels import LONG_K, LONG_K_TILES, WNA16_MAX_SPLITS, wna16_offsets_splits

    tile = heuristics.select_masked_tile("sm90a", 1, 7168, 128, 4)
    for tokens, slices in ((1, 4), (2, 3), (3, 2), (4, 1)):
        bound = moe_kernels.offsets_tile_bound(8 * tokens, 256, 512, tile)
        assert wna16_offsets_splits(bound, 7168 // tile.block_k, 264, 7168) == slices, tokens
    assert wna16_offsets_splits(1, 1000, 10_000, 64_000) == WNA16_MAX_SPLITS
    # a short K keeps offsets_splits' rule, in columns and in K tiles: Qwen3-30B gate_up (K 2048) at
    # one token on sm90a's deep tile (at most 9 x 12 tiles, 8 K tiles of 256) and at two tokens on
    # the 64-wide tiles of other arches (32 K tiles) alike
    assert wna16_offsets_splits(108, 8, 264, 2048) == offsets_splits(108, 8, 264) == 1
    assert wna16_offsets_splits(204, 32, 432, 2048) == offsets_splits(204, 32, 432) == 1
    assert wna16_offsets_splits(204, 32, 432, LONG_K) == 2
    assert wna16_offsets_splits(108, LONG_K_TILES - 1, 264, LONG_K) == 1
    assert wna16_offsets_splits(36, 12, 264, 3072) == offsets_splits(36, 12, 264) == 3
    assert wna16_offsets_splits(5000, 1000, 10**6, 64_000) == 1  # more tiles than split-K counters
    # slices of ceil(k_tiles / splits) K tiles: none left empty
    for k_tiles in range(1, 70):
        for splits in range(1, k_tiles + 1):
            s = moe_kernels.nonempty_slices(k_tiles, splits)
            per = -(-k_tiles // s)
            assert 1 <= s <= splits and (s - 1) * per < k_tiles, (k_tiles, splits)
    assert moe_kernels.nonempty_slices(5, 4) == 3 and moe_kernels.nonempty_slices(5, 3) == 3


def test_bad_arguments_are_refused_before_any_launch():
    experts = _experts()
    a = torch.zeros(3, 4, 256, dtype=torch.bfloat16)
    counts = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"a must be \(3, max_m, 256\), got \(3, 256\)"):
        gemm_masked_kernel(torch.zeros(3, 256, dtype=torch.bfloat16), experts, counts)
    with pytest.raises(ValueError, match="a must be a contiguous torch.bfloat16 tensor"):
        gemm_masked_kernel(a.half(), experts, counts)
    with pytest.raises(ValueError, match="must be on one CUDA device; on the CPU, humming_aot.moe.gemm_masked"):
        gemm_masked_kernel(a, experts, counts)


def test_the_other_arguments_are_checked_on_a_cuda_like_tensor(monkeypatch):
    """Checks past the device one, on CPU tensors made to look like CUDA ones (_check only asks)."""
    from humming_aot.moe import kernels as masked_kernel

    experts = _experts()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    a = torch.zeros(3, 4, 256, dtype=torch.bfloat16)
    strided = torch.zeros(3, 2, dtype=torch.int32)[:, 0]
    with pytest.raises(ValueError, match=r"masked_m must be \(3,\) int32, contiguous, on cpu"):
        masked_kernel._check(a, experts, strided, None, None)
    counts = torch.zeros(3, dtype=torch.int32)
    odd = torch.zeros(3 * 192 + 1, dtype=torch.bfloat16)[1:].view(3, 192)
    with pytest.raises(ValueError, match="bias must be .* starting on a 4-byte boundary"):
        masked_kernel._check(a, experts, counts, odd, None)
    with pytest.raises(ValueError, match=r"out must be \(3, 4, 192\)"):
        masked_kernel._check(a, experts, counts, None, torch.zeros(3, 5, 192, dtype=torch.bfloat16))
    masked_kernel._check(a, experts, counts, None, torch.zeros(3, 4, 192, dtype=torch.bfloat16))  # all fine


# --- the grouped contiguous schedule (kernel/grouped_contiguous.cuh) ---------------------------------


def test_the_grouped_launch_passes_every_row_and_the_weight_strides():
    from humming_aot.moe.kernels import grouped_launch_arguments

    experts = _experts()
    rows, k, n = 40, 256, 192
    a = torch.zeros(rows, k, dtype=torch.bfloat16)
    out = torch.zeros(rows, n, dtype=torch.bfloat16)
    row_expert = torch.full((rows,), -1, dtype=torch.int32)
    bias = torch.zeros(3, n, dtype=torch.bfloat16)
    tile = heuristics.select_masked_tile("sm90a", 4, k, 64, 4, masked=False)
    grid, params = grouped_launch_arguments(a, experts, row_expert, bias, out, tile, resident=1000)
    assert grid == (5 * 2, 1, 1)  # ceil(40 / 8) x ceil(192 / 128) tiles over every row
    # persistent: at most the resident CTAs, each walking several tiles
    assert grouped_launch_arguments(a, experts, row_expert, bias, out, tile, resident=3)[0] == (3, 1, 1)
    assert len(params) == params_abi.GROUPED_PARAMS_BYTES == 160
    gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
    assert gemm[:8] == (a.data_ptr(), experts.w.data_ptr(), experts.w_scale.data_ptr(),
                        experts.w_zero_point.data_ptr(), bias.data_ptr(), out.data_ptr(), 0, 0)
    assert gemm[8:] == (k, n, rows, n, k, 64, 1, 1.0)
    tail = params_abi.GROUPED_TAIL.unpack(params[params_abi.GEMM_PARAMS.size:])
    assert tail[:2] == (row_expert.data_ptr(), experts.global_scale_tensor.data_ptr())
    for stride, tensor in zip(tail[2:6], (experts.w, experts.w_scale, experts.w_zero_point, bias)):
        assert stride == tensor[1].data_ptr() - tensor[0].data_ptr()
    assert tail[6] == experts.experts  # (the kernel skips blocks whose id is E or more)


def test_grouped_arguments_are_refused_before_any_launch(monkeypatch):
    from humming_aot.moe import gemm_grouped_kernel, kernels

    experts = _experts()
    a = torch.zeros(16, 256, dtype=torch.bfloat16)
    row_expert = torch.zeros(16, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"a must be \(R, 256\), got \(16, 128\)"):
        gemm_grouped_kernel(torch.zeros(16, 128, dtype=torch.bfloat16), experts, row_expert, expected_m=8)
    with pytest.raises(ValueError, match="on the CPU, humming_aot.moe.gemm_grouped computes the same"):
        gemm_grouped_kernel(a, experts, row_expert, expected_m=8)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(ValueError, match=r"row_expert must be \(16,\) int32, contiguous"):
        kernels._check_grouped(a, experts, row_expert.long(), None, None)
    with pytest.raises(ValueError, match="row stride a multiple of 8 elements, got 260"):
        kernels._check_grouped(torch.zeros(16, 260, dtype=torch.bfloat16)[:, :256], experts, row_expert, None, None)
    with pytest.raises(ValueError, match=r"out must be \(16, 192\)"):
        kernels._check_grouped(a, experts, row_expert, None, torch.zeros(16, 128, dtype=torch.bfloat16))
    kernels._check_grouped(a, experts, row_expert, None, None)  # all fine
    # the offsets form: the offsets' shape, dtype and device, then the rows' checks
    with pytest.raises(ValueError, match=r"offsets must be \(4,\) int32 or int64, got \(3,\)"):
        gemm_grouped_kernel(a, experts, offsets=torch.zeros(3, dtype=torch.int32), expected_m=8)
    with pytest.raises(ValueError, match=r"offsets must be \(4,\) int32 or int64, got \(4,\) torch.float32"):
        gemm_grouped_kernel(a, experts, offsets=torch.zeros(4), expected_m=8)
    with pytest.raises(ValueError, match=r"out must be \(16, 192\)"):
        gemm_grouped_kernel(a, experts, offsets=torch.zeros(4, dtype=torch.int32), expected_m=8,
                            out=torch.zeros(16, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="give the experts' rows as row_expert .* or as offsets"):
        gemm_grouped_kernel(a, experts, row_expert, offsets=torch.zeros(4, dtype=torch.int32), expected_m=8)
    with pytest.raises(ValueError, match="splits=2: K slices are for the offsets form"):
        gemm_grouped_kernel(a, experts, row_expert, expected_m=8, splits=2)


def test_a_cast_global_scale_is_refused(monkeypatch):
    """The kernels read the experts' global scales as fp32: a tensor cast to another dtype is
    refused with what to do, not read as fp32."""

    from humming_aot.moe import kernels

    experts = _experts()
    cast = dataclasses.replace(experts, global_scale_tensor=experts.global_scale_tensor.bfloat16())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    a = torch.zeros(16, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"global_scale_tensor must stay \(3,\) float32.*pack the experts again"):
        kernels._check_grouped(a, cast, torch.zeros(16, dtype=torch.int32), None, None)


def test_a_forced_moe_tile_is_parsed_and_checked():
    from humming_aot.moe.kernels import forced_tile

    experts = _experts()  # K 256, groups of 64
    assert forced_tile("8x128x128_w1x2x2_s2", experts, "w").label == "8x128x128_w1x2x2_s2"
    assert forced_tile("mma-sw:16x64x128_w1x1x2_s2", experts, "w").block_m == 16
    with pytest.raises(ValueError, match="w: tile wgmma-ws:64x128x64_w1x4_s6 is of body .wgmma-ws.; "
                                         "this MoE schedule runs mma, mma-sw tiles"):
        forced_tile("wgmma-ws:64x128x64_w1x4_s6", experts, "w")
    # the masked schedule (and its offsets form) takes the warp-specialized TMA body too
    assert forced_tile("wgmma-ws:64x128x64_w1x4_s6", experts, "w", masked=True).mma.value == "wgmma-ws"
    with pytest.raises(ValueError, match="stages 512 of K at a time, which does not fit K = 256 .* use 8x128x64"):
        forced_tile("8x128x512_w1x2x4_s2", experts, "w")
    with pytest.raises(ValueError, match="tile must be a TileConfig or its label, got int"):
        forced_tile(3, experts, "w")


def test_the_offsets_form_launch_from_the_call_on_a_cuda_like_tensor(monkeypatch):
    """gemm_grouped_kernel(offsets=...)'s host path up to the launch, on CPU tensors made to look
    like CUDA ones and a recorded launch: the slices it picks (forced ones made non-empty), the
    workspace and counters it passes, its grid, and the forced slices it refuses."""
    from humming_aot import dispatch
    from humming_aot.enumerate import parse_tile_field
    from humming_aot.moe import gemm_grouped_kernel

    experts = _experts("int4:g128", e=3, n=192, k=2048)
    tile = parse_tile_field("8x128x128_w1x2x2_s2")
    launches = []

    class Loaded:
        def launch(self, grid, stream, params):
            launches.append((grid, stream, params))

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(moe_kernels, "_kernel", lambda a, experts, gemm_type, rows, what, loop, forced=None:
                        (tile, Loaded()))
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: 528)
    monkeypatch.setattr(moe_kernels, "_stream", lambda a: 7)
    # (the choice between the tile's K depths has tests of its own, below)
    monkeypatch.setattr(decode_tiles, "offsets_depth", lambda a, experts, tile, loaded, resident, rows, what:
                        (tile, loaded, resident))
    a = torch.zeros(11, 2048, dtype=torch.bfloat16)
    offsets = torch.tensor([1, 4, 4, 10], dtype=torch.int32)
    bound = moe_kernels.offsets_tile_bound(11, 3, 192, tile)  # (1 + 3) x 2
    cases = [(None, moe_kernels.offsets_splits(bound, 16, 528)), (5, 4), (1, 1), (16, 16)]
    for forced, slices in cases:
        launches.clear()
        out = torch.zeros(11, 192, dtype=torch.bfloat16)
        gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, out=out, splits=forced)
        (grid, stream, params), = launches
        assert grid == (min(bound, 528 // slices), slices, 1) and stream == 7
        gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
        assert gemm[14] == slices and gemm[5] == out.data_ptr()
        if slices > 1:  # a workspace and the stream's counters
            assert gemm[6] != 0 and gemm[7] == dispatch._split_k_counters(a.device, 7).data_ptr()
        else:
            assert gemm[6:8] == (0, 0)
    assert cases[0][1] > 1  # a few rows on this K: sliced by default
    # on a long K (4096: 32 K tiles of 128) the 16-bit form slices where the tiles fill up to half
    # the slots (moe.kernels.wna16_offsets_splits): 8 tiles for 20 slots, 2 slices where the
    # quantized-activation forms' offsets_splits takes 1
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: 20)
    long_k = _experts("int4:g128", e=3, n=192, k=4096)
    assert moe_kernels.offsets_splits(bound, 32, 20) == 1
    launches.clear()
    gemm_grouped_kernel(torch.zeros(11, 4096, dtype=torch.bfloat16), long_k, offsets=offsets, expected_m=1)
    (grid, _, params), = launches
    assert grid == (min(bound, 20 // 2), 2, 1) and params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])[14] == 2
    for bad in (0, 17, 2.0):
        with pytest.raises(ValueError, match=f"splits={bad!r} must be an int in \\[1, K / 128 = 16\\]"):
            gemm_grouped_kernel(a, experts, offsets=offsets, expected_m=1, splits=bad)


# --- the indexed (fused_moe) layout: gather, the block-aligned grouped kernel, scatter ----------------


def test_indexed_arguments_are_refused_before_any_launch():
    from humming_aot.moe import align_block_size, gemm_indexed_kernel, group_rows

    experts = _experts()
    ids = torch.tensor([[0, 2], [1, 2], [2, 0]])
    routing = align_block_size(ids, 3, 8)
    a = torch.zeros(3, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="routing must be an IndexedRouting .* got GroupedRouting"):
        gemm_indexed_kernel(a, experts, group_rows(ids, 3), a_rows_per_token=2)
    with pytest.raises(ValueError, match=r"a_rows_per_token must be the routing's top_k \(2.* got 3"):
        gemm_indexed_kernel(a, experts, routing, a_rows_per_token=3)
    with pytest.raises(ValueError, match=r"a must be \(6, 256\) torch.bfloat16 for 3 tokens of top-2 and a_rows_per_token=1"):
        gemm_indexed_kernel(a, experts, routing, a_rows_per_token=1)
    with pytest.raises(ValueError, match=r"topk_weights must be \(3, 2\) floating"):
        gemm_indexed_kernel(a, experts, routing, a_rows_per_token=2, topk_weights=torch.ones(6))
    with pytest.raises(ValueError, match=r"a must be \(3, 256\) torch.bfloat16 .* got \(3, 256\) torch.float16"):
        gemm_indexed_kernel(a.half(), experts, routing, a_rows_per_token=2)
    with pytest.raises(ValueError, match="must be on one CUDA device; on the CPU, humming_aot.moe.gemm_indexed"):
        gemm_indexed_kernel(a, experts, routing, a_rows_per_token=2)


def test_indexed_form_is_the_expert_loop_with_the_grouped_kernel_swapped_for_its_definition(monkeypatch):
    """gemm_indexed_kernel's gather, row experts, scatter and weights around a stand-in for the
    grouped kernel (expert_loop.gemm_grouped on the same rows, on the CPU), against
    expert_loop.gemm_indexed: both GEMMs, weights, and expert parallelism's skipped blocks."""
    from humming_aot.moe import align_block_size, expert_loop, gemm_indexed, gemm_indexed_kernel, kernels, routing

    calls = []

    def grouped(a, experts, row_expert, *, expected_m, tile=None, out=None):
        calls.append((a.shape[0], expected_m, tile))
        y = expert_loop.gemm_grouped(a, experts, row_expert=row_expert)
        # the kernel leaves the rows of padding-only blocks as `out` held them: garbage here
        return torch.where((row_expert >= 0).unsqueeze(1), y, torch.full_like(y, float("nan")))

    monkeypatch.setattr(kernels, "gemm_grouped_kernel", grouped)
    monkeypatch.setattr(kernels, "grouped_block_m", lambda experts, expected_m, device=None: 4)
    # CPU tensors made to pass the device check, gathered by the torch path
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(routing, "gather_rows", routing._gather_rows)
    gen = torch.Generator().manual_seed(1)
    local = _experts(e=2, n=64, k=256)
    tokens, top_k, experts_n = 7, 2, 4
    ids = torch.randn(tokens, experts_n, generator=gen).topk(top_k, dim=1).indices
    expert_map = torch.tensor([0, -1, 1, -1], dtype=torch.int32)  # this rank: experts 0 and 2
    routing = align_block_size(ids, experts_n, 8, expert_map)
    hidden = torch.randn(tokens, 256, generator=gen).bfloat16()
    per_slot = torch.randn(tokens * top_k, 256, generator=gen).bfloat16()
    weights = torch.rand(tokens, top_k, generator=gen)
    for a, per_token, w in ((hidden, top_k, None), (per_slot, 1, weights)):
        got = gemm_indexed_kernel(a, local, routing, a_rows_per_token=per_token, topk_weights=w)
        ref = gemm_indexed(a, local, routing, a_rows_per_token=per_token, topk_weights=w)
        assert got.shape == ref.shape == (tokens * top_k, 64)
        assert torch.equal(got, ref)  # the same per-expert products, the weights rounded the same way
        remote = (ids.reshape(-1) % 2) == 1  # experts 1 and 3 are another rank's: zeros
        assert bool((got[remote] == 0).all()) and bool((got[~remote] != 0).any())
    assert calls == [(routing.sorted_token_ids.shape[0], 7, None)] * 2  # 14 slots over 2 local experts
    with pytest.raises(ValueError, match="block_size 8 is not a multiple of the kernel's 16 rows"):
        monkeypatch.setattr(kernels, "grouped_block_m", lambda experts, expected_m, device=None: 16)
        gemm_indexed_kernel(hidden, local, routing, a_rows_per_token=top_k)


def test_align_block_size_gives_the_experts_offsets_without_an_expert_map():
    """IndexedRouting.expert_offsets (the torch path here; the GPU test compares the kernel's):
    each expert's first row, then the padded total, consistent with the blocks' experts; none
    with an expert_map (local ids need not rise)."""
    from humming_aot.moe import align_block_size

    ids = torch.tensor([[0, 2], [2, 3], [0, 2], [3, 0]])  # expert 0: 3 slots, 1: none, 2: 3, 3: 2
    routing = align_block_size(ids, 4, 4)
    assert routing.expert_offsets.dtype == torch.int32
    assert routing.expert_offsets.tolist() == [0, 4, 4, 8, 12]
    blocks = routing.expert_ids.tolist()
    for e in range(4):
        lo, hi = routing.expert_offsets[e].item(), routing.expert_offsets[e + 1].item()
        assert all(blocks[b] == e for b in range(lo // 4, hi // 4))
    assert align_block_size(ids, 4, 4, torch.tensor([0, -1, 1, 2], dtype=torch.int32)).expert_offsets is None


def test_indexed_form_runs_the_offsets_form_where_the_blocks_experts_rise(monkeypatch):
    """With align_block_size's routing of no expert_map (its expert_offsets), gemm_indexed_kernel runs the
    grouped kernel's offsets form (a stand-in here: expert_loop.gemm_grouped on the same offsets,
    rows of no expert left as garbage) for any block size, against expert_loop.gemm_indexed."""
    from humming_aot.moe import align_block_size, expert_loop, gemm_indexed, gemm_indexed_kernel, kernels, routing

    calls = []

    def grouped(a, experts, row_expert=None, *, offsets=None, expected_m, tile=None, out=None, routed_rows=None):
        assert row_expert is None and offsets.dtype == torch.int32 and offsets.shape == (experts.experts + 1,)
        calls.append((a.shape[0], expected_m, routed_rows))
        y = expert_loop.gemm_grouped(a, experts, offsets=offsets.long())
        rows = torch.arange(a.shape[0])
        owned = (rows >= offsets[0]) & (rows < offsets[-1])
        return torch.where(owned.unsqueeze(1), y, torch.full_like(y, float("nan")))

    monkeypatch.setattr(kernels, "gemm_grouped_kernel", grouped)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(routing, "gather_rows", routing._gather_rows)
    gen = torch.Generator().manual_seed(2)
    local = _experts(e=4, n=64, k=256)
    tokens, top_k = 9, 2
    ids = torch.randn(tokens, 4, generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, 256, generator=gen).bfloat16()
    per_slot = torch.randn(tokens * top_k, 256, generator=gen).bfloat16()
    weights = torch.rand(tokens, top_k, generator=gen)
    for block in (1, 3, 8):  # any block: the offsets form needs no alignment to the tile
        aligned = align_block_size(ids, 4, block)
        assert aligned.expert_offsets is not None
        for a, per_token, w in ((hidden, top_k, None), (per_slot, 1, weights)):
            got = gemm_indexed_kernel(a, local, aligned, a_rows_per_token=per_token, topk_weights=w)
            ref = gemm_indexed(a, local, aligned, a_rows_per_token=per_token, topk_weights=w)
            assert torch.equal(got, ref), f"block {block}"
    # (the routed rows, not the padded ones, pick the offsets form's decode tile: decode_tiles.offsets_depth)
    assert calls == [(align_block_size(ids, 4, b).sorted_token_ids.shape[0], 5, tokens * top_k)
                     for b in (1, 1, 3, 3, 8, 8)]
