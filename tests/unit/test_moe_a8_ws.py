"""The 8-bit-activation MoE GEMMs on sm90a's warp-specialized wgmma bodies
(kernel/grouped_masked_scaled_ws.cuh, humming_aot/moe/a8_launch.py) without a GPU: the keys,
their generated source and shared memory, the tile tables, the Params' tensor maps, the default
catalog and nvcc (slow). GPU runs: tests/gpu/test_moe_a8_ws_gpu.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_moe_a8 import _experts, _masked_key

from humming_aot import codegen, params_abi, support
from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.moe import a8 as moe_a8
from humming_aot.spec import GemmType, KernelKey
from humming_aot.testing.nvcc import needs_nvcc


def test_the_masked_keys_on_sm90a_wrap_the_wgmma_bodies_in_their_schedule():
    """The masked schedule (and its offsets form) around the warp-specialized W4A8 and W8A8 bodies:
    its own schedule template and Params (MaskedScaledTmaGemmParams, 512 bytes), its shared memory
    (ring, staging tile, walk table) fitting the CTAs per SM the body is built for, every tile of
    WS_TILES, W8A8_WS_TILES and W8A8_BLOCK_WS_TILES (whose slots of more than 16 rows hold the
    K block's row scales too)."""
    from humming_aot.bodies import wgmma_ss
    from humming_aot.bodies.wgmma_w4a8 import ctas_per_sm, masked_smem_bytes, masked_smem_limit
    from humming_aot.moe import a8_launch

    cases = [(weight, "float8e4m3", label, "DenseWgmmaW4A8") for weight in ("int4", "uint4", "float4e2m1")
             for _, label in a8_launch.WS_TILES]
    cases += [(weight, weight, label, "DenseWgmmaSs") for weight in ("float8e4m3", "int8")
              for _, label in a8_launch.W8A8_WS_TILES]
    cases += [("blocks", "float8e4m3", label, "DenseWgmmaSs") for label in dict.fromkeys(
        label for _, label in a8_launch.W8A8_BLOCK_WS_TILES)]
    for weight, act, label, body in cases:
        key = _masked_key("sm90a", weight, act, label)
        assert KernelKey.from_name(key.name) == key and support.is_supported(key.spec, "sm90a")
        key.tile.body.check_key(key)
        source = codegen.kernel_source(key)
        assert f"humming_aot::kernel::GroupedMaskedScaledWs<humming_aot::kernel::{body}<" in source
        assert "#include <humming_aot/kernel/grouped_masked_scaled_ws.cuh>" in source
        assert "const __grid_constant__ humming_aot::kernel::MaskedScaledTmaGemmParams params" in source
        assert codegen.params_type(key) == "MaskedScaledTmaGemmParams"
        smem = codegen.kernel_smem_bytes(key)
        if body == "DenseWgmmaW4A8":
            assert smem == masked_smem_bytes(key.tile, weight) <= masked_smem_limit(key.tile)
            assert masked_smem_limit(key.tile) == (231424 if ctas_per_sm(key.tile) == 1 else 233472 // 2 - 2048)
        else:
            staged = 4 * key.tile.block_m if weight == "blocks" and key.tile.block_m > 16 else 0
            assert smem == wgmma_ss.masked_smem_bytes(key.tile, staged) <= wgmma_ss.masked_smem_limit(key.tile)
            assert f"    {'true' if weight == 'blocks' else 'false'},  // scales per 128 x 128 weight block" in source
        assert f"static_assert(Kernel::kSmemBytes == {smem}," in source
        assert "RowBlockWalk" not in source
        # the row-expert form: the same schedule over row blocks, with no walk table
        grouped = _masked_key("sm90a", weight, act, label, GemmType.GROUPED)
        key.tile.body.check_key(grouped)
        assert support.is_supported(grouped.spec, "sm90a") and codegen.params_type(grouped) == codegen.params_type(key)
        text = codegen.kernel_source(grouped)
        assert f", {key.tile.block_m}, {key.tile.block_n}, humming_aot::schedule::RowBlockWalk>;" in text
        assert codegen.kernel_smem_bytes(grouped) == smem - wgmma_ss.MOE_WALK_TABLE_BYTES
    # the dense 32-row tile's eight stages leave no room for the schedule's staging beside two CTAs
    with pytest.raises(ValueError, match="masked MoE schedule's ring, staging tile and walk table need"):
        _masked_key("sm90a", "int4", "float8e4m3", "wgmma-w4a8:32x128x128_w1x4_s8").tile.body.check_key(
            _masked_key("sm90a", "int4", "float8e4m3", "wgmma-w4a8:32x128x128_w1x4_s8"))
    # the table: every expected row count has a tile, rising with the rows
    _, w4 = _experts("int4:g128", e=2, n=64, k=256)
    _, w8 = _experts("int8:channel", e=2, n=64, k=256)
    sizes = [a8_launch.ws_tile(w4, m).block_m for m in (1, 4, 5, 16, 17, 64, 65, 1536, 1537, 10**6)]
    assert sizes == [8, 8, 16, 16, 32, 32, 128, 128, 192, 192]
    # the row-expert form: blocks that divide the 128-row alignment (the 192-row tile gives way)
    sizes = [a8_launch.ws_tile(w4, m, GemmType.GROUPED).block_m for m in (1, 5, 17, 65, 1537, 10**6)]
    assert sizes == [8, 16, 32, 128, 128, 128]
    assert a8_launch.row_expert_table(a8_launch.W8A8_WS_TILES) == a8_launch.W8A8_WS_TILES
    # W8A8: a tile of about twice the expected rows past 4 (log section 59)
    rows = (1, 4, 5, 8, 9, 16, 17, 32, 33, 10**6)
    sizes = [a8_launch.ws_tile(w8, m).block_m for m in rows]
    assert sizes == [8, 8, 16, 16, 32, 32, 64, 64, 128, 128]
    _, blocks = _experts("float8e4m3:b128x128", e=2, n=256, k=256)
    tiles = [a8_launch.ws_tile(blocks, m).label for m in rows]
    assert [int(t.split(":")[1].split("x")[0]) for t in tiles] == [8, 8, 16, 16, 32, 32, 64, 64, 128, 128]
    assert tiles[4] == "wgmma-ss:32x128x128_w1x4_s4"  # (four stages: the slots hold 32 rows' scales)
    text = (Path(__file__).resolve().parents[2] / "csrc/include/humming_aot/kernel/params.cuh").read_text()
    assert "static_assert(sizeof(MaskedScaledTmaGemmParams) == 512" in text
    assert a8_launch.WS_PARAMS_BYTES == 512 and a8_launch.WS_MAP_OFFSET == 256


def test_the_ws_params_add_padding_and_the_codes_map_to_the_masked_scaled_bytes(monkeypatch):
    """ws_map: nothing for a portable tile; for a wgmma-w4a8 one, zeros to byte 256 then the TMA map
    (dispatch's encoder, stubbed here: no driver on the CPU) over the rows' codes as 16-bit pairs:
    (rows, K / 2) with the row stride in bytes and boxes of the tile's rows x 64 pairs, then the
    unused weight map's zeros."""
    from humming_aot import _launcher, dispatch
    from humming_aot.moe import a8_launch

    calls = []

    def encode(ptr, rows, cols, stride, box_rows, box_cols):
        calls.append((ptr, rows, cols, stride, box_rows, box_cols))
        return bytes(range(128))

    codes = torch.zeros(3, 5, 384, dtype=torch.uint8)
    assert a8_launch.ws_map(codes, 15, parse_tile_field("mma-w4a8:16x128x128_w1x4_s4")) == b""
    monkeypatch.setattr(_launcher, "encode_tensor_map_2d", encode)
    monkeypatch.setattr(dispatch, "_tensor_maps", {})  # (the stub's maps stay out of the real cache)
    tail = a8_launch.ws_map(codes, 15, parse_tile_field("wgmma-w4a8:16x128x128_w1x4_s8"))
    rows = torch.zeros(40, 512, dtype=torch.uint8)[:, :400]
    tail2 = a8_launch.ws_map(rows, 40, parse_tile_field("wgmma-w4a8:64x128x128_w1x8_s8"))
    assert len(moe_a8.MASKED_SCALED_PARAMS_BYTES * b"x" + tail) == a8_launch.WS_PARAMS_BYTES
    assert tail[:48] == bytes(48) and tail[48:176] == bytes(range(128)) and tail[176:] == bytes(128)
    assert calls == [(codes.data_ptr(), 15, 192, 384, 16, 64), (rows.data_ptr(), 40, 200, 512, 64, 64)]
    assert tail2[48:176] == bytes(range(128))
    # W8A8: the weight map over every expert's rows, (E x N, K) in boxes of the tile's channels
    _, w8 = _experts("int8:channel", e=3, n=128, k=256)
    calls.clear()
    tail3 = a8_launch.ws_map(codes[:, :, :256].contiguous(), 15, parse_tile_field("wgmma-ss:16x128x128_w1x4_s5"), w8)
    assert len(tail3) == a8_launch.WS_PARAMS_BYTES - moe_a8.MASKED_SCALED_PARAMS_BYTES
    assert calls[1] == (w8.w.data_ptr(), 3 * 128, 128, 256, 128, 64)


def test_the_default_catalog_holds_the_ws_tables_tiles_in_both_moe_types():
    """sm90a's default catalog: every tile of W8A8_WS_TILES for float8 and int8 experts with channel
    scales, of W8A8_BLOCK_WS_TILES for DeepSeek-V3's block-scaled float8 experts and of WS_TILES for
    int4, uint4 (zero point) and MXFP4 experts x float8, both outputs, in the masked type (its
    offsets form too) and the grouped type's row-expert form (without the tiles whose rows do not
    divide 128: W4A8's 192-row tile, the block-scaled 160-row one)."""
    from humming_aot.moe import a8_launch

    keys = [k for k in enumerate_keys("default", ["sm90a"]) if k.tile.mma.value in ("wgmma-ss", "wgmma-w4a8")
            and k.spec.gemm_type is not GemmType.DENSE]
    both, outs = (GemmType.MASKED, GemmType.GROUPED), ("bfloat16", "float16")
    expected = {(label, w, "g", o, t) for _, label in a8_launch.W8A8_WS_TILES
                for w in ("float8e4m3", "int8") for o in outs for t in both}
    expected |= {(label, "float8e4m3", "b", o, t) for t, table in (
        (GemmType.MASKED, a8_launch.W8A8_BLOCK_WS_TILES),
        (GemmType.GROUPED, a8_launch.row_expert_table(a8_launch.W8A8_BLOCK_WS_TILES))) for _, label in table for o in outs}
    expected |= {(label, w, "g", o, t) for t, table in ((GemmType.MASKED, a8_launch.WS_TILES),
                                                         (GemmType.GROUPED, a8_launch.row_expert_table(a8_launch.WS_TILES)))
                 for _, label in table for w in ("int4", "uint4", "float4e2m1") for o in outs}
    assert {(k.tile.label, k.spec.w_dtype, k.spec.w_scale.value, k.spec.out_dtype, k.spec.gemm_type)
            for k in keys} == expected
    assert {k.spec.a_dtype for k in keys if k.tile.mma.value == "wgmma-w4a8"} == {"float8e4m3"}


@pytest.mark.slow
@needs_nvcc
def test_nvcc_compiles_the_block_scaled_ws_keys_without_spills(tmp_path):
    """The block-scaled tiles: the 8- and 16-row ones read their rows' scales in the K loop, the
    others gather them and the weight-block scales into the ring from two more producer warps,
    which take turns (40 registers each: no spill there either); in the masked schedule and in
    the row-expert form (the channel-scaled float8 and int8 tiles too; W4A8's wgmma tiles keep a
    few of the walk's words in local memory in both forms, as the masked one always has)."""
    from test_build_nvcc import _ptxas_report, _spill_bytes

    from humming_aot.moe import a8_launch

    # (the 160-row tile's serial promotion reads its token scales from the slot pair by pair; its
    # row-expert form is the probe catalog's only)
    labels = dict.fromkeys(label for _, label in a8_launch.W8A8_BLOCK_WS_TILES)
    cases = [("blocks", label, t) for label in labels for t in (GemmType.MASKED, GemmType.GROUPED)]
    cases += [(w, label, GemmType.GROUPED) for _, label in a8_launch.W8A8_WS_TILES for w in ("float8e4m3", "int8")]
    for weight, label, gemm_type in cases:
        key = _masked_key("sm90a", weight, "int8" if weight == "int8" else "float8e4m3", label, gemm_type)
        report = _ptxas_report(key, tmp_path)
        assert _spill_bytes(report) == 0, (key.name, report)


def test_the_offsets_form_slices_k_on_wgmma_ss_tiles_only(monkeypatch):
    """gemm_grouped_a8_kernel's host path up to the launch on sm90a's wgmma tiles (CPU tensors made to
    look like CUDA ones, a recorded launch): W8A8 experts with a few rows on long K take
    offsets_splits' slices (the grid's y), a workspace of the walk's tile bound x slices x the
    tile's outputs and the stream's counters; forced slices are made non-empty; W4A8's wgmma tile
    keeps one slice and refuses forced ones."""
    from humming_aot import dispatch, ops
    from humming_aot.moe import a8_launch, gemm_grouped_a8_kernel
    from humming_aot.moe import kernels as moe_kernels

    launches, workspaces = [], []

    class Loaded:
        def launch(self, grid, stream, params):
            launches.append((grid, stream, params))

    tiles = {"w8": parse_tile_field("wgmma-ss:8x128x128_w1x4_s6"),
             "w4": parse_tile_field("wgmma-w4a8:8x128x128_w1x4_s8")}
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(moe_a8, "select_kernel", lambda qa, experts, out_dtype, rows, tile, what: (
        tiles["w4" if isinstance(experts, moe_a8.PackedW4A8Experts) else "w8"], Loaded()))
    monkeypatch.setattr(moe_a8, "portable_slices_win", lambda *args: None)  # (W4A8's own rule: its own tests)
    monkeypatch.setattr(moe_a8, "ws_map", lambda codes, rows, tile, experts=None: bytes(
        a8_launch.WS_PARAMS_BYTES - moe_a8.MASKED_SCALED_PARAMS_BYTES))
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: 264)
    monkeypatch.setattr(moe_kernels, "_stream", lambda codes: 7)
    empty = torch.empty

    def recorded_empty(*size, **kwargs):
        if kwargs.get("dtype") is torch.float32:
            workspaces.append(size[0] if len(size) == 1 else size)
        return empty(*size, **kwargs)

    monkeypatch.setattr(moe_a8.torch, "empty", recorded_empty)
    _, blocks = _experts("float8e4m3:b128x128", e=16, n=256, k=2048)
    rows = 5
    qa = ops.quantize_activation(torch.randn(rows, 2048, generator=torch.Generator().manual_seed(0)),
                                 "float8e4m3:g128")
    offsets = torch.tensor([0] * 3 + [1, 2, 4, 5] + [5] * 10, dtype=torch.int32)
    bound = moe_kernels.offsets_tile_bound(rows, 16, 256, tiles["w8"])  # (0 + 5) x 2
    default = moe_kernels.offsets_splits(bound, 16, 264)
    assert default == 4  # (16 K tiles: at least 4 a slice)
    for forced, slices in ((None, default), (3, 3), (16, 16), (1, 1)):
        launches.clear()
        workspaces.clear()
        gemm_grouped_a8_kernel(qa, blocks, offsets, expected_m=1, splits=forced)
        (grid, stream, params), = launches
        assert grid == (min(bound, 264 // slices), slices, 1) and stream == 7 and len(params) == 512
        gemm = params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])
        assert gemm[14] == slices
        if slices > 1:
            assert workspaces == [slices * bound * 8 * 128]
            assert gemm[6] != 0 and gemm[7] == dispatch._split_k_counters(qa.codes.device, 7).data_ptr()
        else:
            assert workspaces == [] and gemm[6:8] == (0, 0)
    # forced slices whose workspace would pass WS_WORKSPACE_BYTES: refused before any launch
    monkeypatch.setattr(moe_a8, "WS_WORKSPACE_BYTES", 4 * 3 * bound * 8 * 128)
    launches.clear()
    gemm_grouped_a8_kernel(qa, blocks, offsets, expected_m=1, splits=3)  # (exactly at the cap)
    with pytest.raises(ValueError, match=r"splits=4 on wgmma-ss:8x128x128_w1x4_s6 would take a .* GiB workspace "
                                         r"\(up to 10 tiles x 4 slices x 8 x 128 floats\)"):
        gemm_grouped_a8_kernel(qa, blocks, offsets, expected_m=1, splits=4)
    assert len(launches) == 1
    # W4A8's wgmma tiles: one slice, and forced ones refused
    _, w4 = _experts("int4:g128", e=16, n=256, k=2048)
    qt = ops.quantize_activation(torch.randn(rows, 2048, generator=torch.Generator().manual_seed(1)),
                                 "float8e4m3:token")
    launches.clear()
    gemm_grouped_a8_kernel(qt, w4, offsets, expected_m=1)
    (grid, _, params), = launches
    assert grid[1] == 1 and params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])[14] == 1
    with pytest.raises(ValueError, match="the wgmma-w4a8 tiles run one K slice"):
        gemm_grouped_a8_kernel(qt, w4, offsets, expected_m=1, splits=2)


def test_a_few_w4a8_rows_on_long_k_take_the_portable_k_slices(monkeypatch):
    """The offsets form's W4A8 x float8 call on sm90a (faked; a recorded launch): four rows on K 7168
    (DeepSeek-V3 TP8's gate_up at one token) leave the wgmma-w4a8 tile, whose schedule runs one K
    slice, for the portable table tile's offsets_splits slices (portable_slices_win); 4,096 rows on
    K 2048, and any forced tile, keep the tile they were given."""
    from humming_aot import dispatch, ops
    from humming_aot.moe import a8_launch, gemm_grouped_a8_kernel
    from humming_aot.moe import kernels as moe_kernels

    fake = dispatch.DeviceInfo(index=0, name="fake H200", capability=(9, 0), num_sms=132, smem_per_sm=233472,
                               arches=("sm90a",))
    monkeypatch.setattr(dispatch, "device_info", lambda index: fake)
    launches = []

    class Loaded:
        def __init__(self, tile):
            self.tile = tile

        def launch(self, grid, stream, params):
            launches.append((self.tile, grid, params))

    ws = parse_tile_field("wgmma-w4a8:8x128x128_w1x4_s8")

    def select(qa, experts, out_dtype, rows, tile, what):
        chosen = ws if tile is None else parse_tile_field(tile) if isinstance(tile, str) else tile
        return chosen, Loaded(chosen)

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(moe_a8, "select_kernel", select)
    monkeypatch.setattr(a8_launch, "select_kernel", select)
    monkeypatch.setattr(moe_a8, "ws_map", lambda codes, rows, tile, experts=None: bytes(
        a8_launch.WS_PARAMS_BYTES - moe_a8.MASKED_SCALED_PARAMS_BYTES))
    resident = {"wgmma-w4a8": 264, "mma-w4a8": 528}
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: resident[tile.mma.value])
    monkeypatch.setattr(moe_kernels, "_stream", lambda codes: 7)

    def call(rows: int, k: int, **kwargs):
        _, w4 = _experts("int4:g128", e=16, n=256, k=k)
        qa = ops.quantize_activation(torch.randn(rows, k, generator=torch.Generator().manual_seed(2)),
                                     "float8e4m3:token")
        offsets = torch.tensor([0] * 3 + [1, 2, 3, rows] + [rows] * 10, dtype=torch.int32)
        launches.clear()
        gemm_grouped_a8_kernel(qa, w4, offsets, expected_m=1 if rows == 4 else rows // 4, **kwargs)
        (tile, grid, params), = launches
        return tile, grid, params_abi.GEMM_PARAMS.unpack(params[:params_abi.GEMM_PARAMS.size])[14]

    sync = moe_a8.sync_tile(_experts("int4:g128", e=16, n=256, k=256)[1], 1)
    assert sync.mma.value == "mma-w4a8"
    bound = moe_kernels.offsets_tile_bound(4, 16, 256, sync)
    slices = moe_kernels.offsets_splits(bound, 56, 528)
    assert slices > 1
    tile, grid, splits = call(4, 7168)
    assert tile == sync and grid == (min(bound, 528 // slices), slices, 1) and splits == slices
    tile, grid, splits = call(4, 7168, tile=ws)  # (forced: the caller's tile, one slice)
    assert tile == ws and grid[1] == splits == 1
    assert a8_launch.portable_slices_win(  # (many rows: more tiles than a quarter of the slots)
        ops.quantize_activation(torch.randn(4096, 256), "float8e4m3:token"), _experts("int4:g128", e=16, n=256,
                                                                                      k=256)[1],
        torch.bfloat16, 4096, 1024, 2, "test") is None
    tile, grid, splits = call(4096, 2048)
    assert tile == ws and grid[1] == splits == 1


def test_the_row_expert_form_on_sm90a_takes_the_warp_specialized_schedule(monkeypatch):
    """On an sm90a GPU (faked; the loader records the keys) DeepGEMM's contiguous layout (row_expert)
    runs the warp-specialized schedule over row blocks wherever the masked form does: the grouped
    key of the table's tile for float8 W8A8 experts with channel and block scales, int8 W8A8 and
    W4A8 x float8, whose 512-byte Params the loaded kernel must take, and grouped_a8_block_m names
    that tile's rows (W4A8's given the rows' format); W4A8 x int8 keeps the portable kernels.
    (tests/conftest.py clears the support cache around each test.)"""
    from humming_aot import dispatch, ops
    from humming_aot import obtain as _obtain
    from humming_aot.moe import a8_launch

    fake = dispatch.DeviceInfo(index=0, name="fake H200", capability=(9, 0), num_sms=132, smem_per_sm=233472,
                               arches=("sm90a",))
    monkeypatch.setattr(dispatch, "device_info", lambda index: fake)
    monkeypatch.setattr(a8_launch, "_LOADED", {})
    loads = []

    class Loaded:
        def __init__(self, key):
            self.name = key.name
            self.params_bytes = (a8_launch.WS_PARAMS_BYTES if key.tile.mma.value.startswith("wgmma")
                                 else a8_launch.GROUPED_SCALED_PARAMS_BYTES)

    def load(key, info):
        loads.append(key)
        return Loaded(key)

    monkeypatch.setattr(_obtain, "load", load)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    _, blocks = _experts("float8e4m3:b128x128", e=2, n=256, k=256)
    _, channel = _experts("float8e4m3:channel", e=2, n=256, k=256)
    group = ops.quantize_activation(torch.randn(4, 256), "float8e4m3:g128")
    token = ops.quantize_activation(torch.randn(4, 256), "float8e4m3:token")
    for qa, experts, table in ((group, blocks, a8_launch.row_expert_table(a8_launch.W8A8_BLOCK_WS_TILES)),
                               (token, channel, a8_launch.W8A8_WS_TILES)):
        for rows, label in ((min(most, 4096), label) for most, label in table):  # (each row at its most)
            tile, _ = a8_launch.select_kernel(qa, experts, torch.bfloat16, rows, None, "test", GemmType.GROUPED)
            assert tile.label == label and loads[-1].spec.gemm_type is GemmType.GROUPED
            assert loads[-1].tile == tile and loads[-1].arch == "sm90a"
            assert "RowBlockWalk" in codegen.kernel_source(loads[-1])
    # the block rows the caller aligns to follow the device's table (a CUDA device faked)
    monkeypatch.setattr(type(blocks), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    assert [moe_a8.grouped_a8_block_m(blocks, m) for m in (1, 5, 9, 17, 33)] == [8, 16, 32, 64, 128]
    # int8 W8A8 and W4A8 x float8: their wgmma tables too; W4A8 x int8: the portable body
    _, int8 = _experts("int8:channel", e=2, n=256, k=256)
    _, w4 = _experts("int4:g128", e=2, n=256, k=256)
    int8_rows = ops.quantize_activation(torch.randn(4, 256), "int8:token")
    monkeypatch.setattr(type(w4), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    for qa, experts, table in ((int8_rows, int8, a8_launch.W8A8_WS_TILES),
                               (token, w4, a8_launch.row_expert_table(a8_launch.WS_TILES))):
        for rows, label in ((min(most, 4096), label) for most, label in table):  # (each row at its most)
            tile, _ = a8_launch.select_kernel(qa, experts, torch.bfloat16, rows, None, "test", GemmType.GROUPED)
            assert tile.label == label and loads[-1].spec.gemm_type is GemmType.GROUPED
            assert moe_a8.grouped_a8_block_m(experts, rows, qa) == tile.block_m
    assert moe_a8.grouped_a8_block_m(w4, 100, "float8e4m3:token") == a8_launch.ws_tile(w4, 100).block_m == 128
    with pytest.raises(ValueError, match="pass activations= .the rows' QuantizedActivation or format"):
        moe_a8.grouped_a8_block_m(w4, 100)
    assert not a8_launch.ws_takes(int8_rows, w4, fake, GemmType.GROUPED)
    tile, _ = a8_launch.select_kernel(int8_rows, w4, torch.bfloat16, 100, None, "test", GemmType.GROUPED)
    assert tile == moe_a8.sync_tile(w4, 100) and loads[-1].spec.gemm_type is GemmType.GROUPED
    assert moe_a8.grouped_a8_block_m(w4, 100, int8_rows) == tile.block_m


def test_the_row_expert_form_launches_the_masked_scaled_params_with_row_experts(monkeypatch):
    """gemm_grouped_a8_kernel's row-expert path up to the launch on a wgmma-ss tile (CPU tensors
    made to look like CUDA ones, a recorded launch): MaskedScaledTmaGemmParams whose counts pointer
    holds the row experts, no offsets, one K slice, slab strides 0, R rows; the grid the tiles of
    every block (padding ones included: the kernel skips them) up to the resident CTAs; slices
    refused."""
    from humming_aot import ops
    from humming_aot.moe import a8_launch, gemm_grouped_a8_kernel
    from humming_aot.moe import kernels as moe_kernels

    launches = []

    class Loaded:
        def launch(self, grid, stream, params):
            launches.append((grid, stream, params))

    tile = parse_tile_field("wgmma-ss:8x128x128_w1x4_s6")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(moe_a8, "select_kernel", lambda qa, experts, out_dtype, rows, forced, what, gemm_type: (
        tile, Loaded()) if gemm_type is GemmType.GROUPED else None)
    monkeypatch.setattr(moe_a8, "ws_map", lambda codes, rows, tile, experts=None: bytes(
        a8_launch.WS_PARAMS_BYTES - moe_a8.MASKED_SCALED_PARAMS_BYTES))
    monkeypatch.setattr(moe_kernels, "_resident", lambda loaded, tile, device_index: 20)
    monkeypatch.setattr(moe_kernels, "_stream", lambda codes: 7)
    _, blocks = _experts("float8e4m3:b128x128", e=4, n=384, k=256)
    rows = 40  # blocks of 8: expert 2 (3 rows), padding, expert 0 (16 rows), expert 3 (2 rows, cut at R)
    row_expert = torch.full((rows,), -1, dtype=torch.int32)
    row_expert[0:3], row_expert[16:32], row_expert[32:34] = 2, 0, 3
    qa = ops.quantize_activation(torch.randn(rows, 256, generator=torch.Generator().manual_seed(2)),
                                 "float8e4m3:g128")
    out = gemm_grouped_a8_kernel(qa, blocks, row_expert=row_expert, expected_m=8)
    (grid, stream, params), = launches
    assert grid == (min(5 * 3, 20), 1, 1) and stream == 7 and len(params) == a8_launch.WS_PARAMS_BYTES
    size = params_abi.GEMM_PARAMS.size
    gemm = params_abi.GEMM_PARAMS.unpack(params[:size])
    assert gemm[10] == rows and gemm[14] == 1 and gemm[6:8] == (0, 0)  # (m, k_splits, workspace, counters)
    tail = params_abi.MASKED_TAIL.unpack(params[size:size + params_abi.MASKED_TAIL.size])
    assert tail[0] == row_expert.data_ptr() and tail[-1] == 0 and tail[-4:-2] == (0, 0) and tail[-2] == 4
    assert out.shape == (rows, 384) and not out.any()  # (a new zero output: the kernel did not run)
    with pytest.raises(ValueError, match="K slices are for the offsets form"):
        gemm_grouped_a8_kernel(qa, blocks, row_expert=row_expert, expected_m=8, splits=2)

