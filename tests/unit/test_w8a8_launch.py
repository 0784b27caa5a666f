"""humming_aot._w8a8_launch on CPU tensors with a fake H200 and launcher (the GPU runs are
tests/gpu/test_w8a8_gpu.py): the ScaledTmaGemmParams bytes a launch packs (pointers, the problem,
the schedule, both tensor maps, the token scales and their transposed stride), the grid of each
schedule, and that every error a caller can cause comes before any launch."""
from __future__ import annotations

import struct

import pytest
import torch

from humming_aot import _launcher, _w8a8_launch, dispatch, ops, params_abi, quant, w8a8
from humming_aot import obtain as kernel_obtain
from humming_aot.enumerate import parse_tile_field
from humming_aot.kernels import LoadedKernel

H200 = dispatch.DeviceInfo(index=0, name="fake H200", capability=(9, 0), num_sms=132, smem_per_sm=233472,
                           arches=("sm90a",))


class Fakes:
    def __init__(self, monkeypatch):
        self.launches, self.loads, self.maps = [], [], []
        _w8a8_launch._plans.clear()
        dispatch._tensor_maps.clear()
        self.attribute_queries = 0
        monkeypatch.setattr(dispatch, "device_info", lambda index: H200)
        monkeypatch.setattr(kernel_obtain, "load", self.load)
        monkeypatch.setattr(_launcher, "launch", self.launch)
        monkeypatch.setattr(_launcher, "encode_tensor_map_2d", self.encode)
        monkeypatch.setattr(_launcher, "kernel_attribute", self.kernel_attribute)
        monkeypatch.setattr(dispatch, "_split_k_counters", lambda device, stream: torch.zeros(8, dtype=torch.int32))
        monkeypatch.setattr(dispatch, "current_stream", lambda index: 0x5EED)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        self.threads = {}

    def load(self, key, info):
        self.loads.append(key.name)
        handle = 100 + len(self.loads)
        self.threads[handle] = key.tile.threads
        smem = key.tile.body.key_smem_bytes(key)  # what the kernel's metadata would say
        return LoadedKernel(name=key.name, library=1, kernel=handle, threads=key.tile.threads, smem_bytes=smem,
                            device=0, params_bytes=w8a8.SCALED_PARAMS_BYTES, programmatic_launch=True)

    def kernel_attribute(self, kernel, attribute, device):
        self.attribute_queries += 1
        if attribute == _launcher.FunctionAttribute.SHARED_SIZE_BYTES:
            return 1024
        threads = self.threads[kernel]  # the launch bounds: two CTAs per SM of 256 threads, one of 384
        return (65536 // (2 if threads <= 256 else 1) // threads) // 8 * 8

    def encode(self, address, rows, cols, row_stride_bytes, box_rows, box_cols):
        self.maps.append((address, rows, cols, row_stride_bytes, box_rows, box_cols))
        return bytes([len(self.maps)]) * 128

    def launch(self, kernel, grid, block, smem, stream, params, device, *, programmatic_dependent_launch=False,
               cluster=(1, 1, 1)):
        self.launches.append(dict(grid=grid, block=block, smem=smem, stream=stream, params=params))


def _operands(m, n, k, blocks=False):
    gen = torch.Generator().manual_seed(0)
    fmt, act = ("float8e4m3:b128x128", "float8e4m3:g128") if blocks else ("float8e4m3:channel", "float8e4m3:token")
    packed = w8a8.pack(quant.quantize(torch.randn(n, k, generator=gen), fmt))
    return ops.quantize_activation(torch.randn(m, k, generator=gen), act), packed


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "blocks"])
def test_a_launch_packs_the_scaled_tma_params(monkeypatch, blocks):
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(200, 100, 384, blocks)  # N padded to 112
    bias = torch.randn(100).to(torch.bfloat16)
    out = _w8a8_launch.launch(qa, packed, bias, torch.bfloat16, None, "wgmma-ss:128x128x128_w1x8_s6", None)
    assert out.shape == (200, 112) and fakes.loads == [
        w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field("wgmma-ss:128x128x128_w1x8_s6"), blocks).name]
    (launch,) = fakes.launches
    params = launch["params"]
    assert len(params) == 448 and launch["block"] == (384, 1, 1) and launch["stream"] == 0x5EED
    fields = params_abi.GEMM_PARAMS.unpack(params[:104])
    a, w, w_scale, zp, bias_ptr, out_ptr = fields[:6]
    assert (a, w, w_scale, zp, out_ptr) == (qa.codes.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0,
                                            out.data_ptr())
    assert bias_ptr not in (0, bias.data_ptr())  # the bias padded to 112 columns is a copy
    lda, ldo, m, n, k, group, splits, global_scale = fields[8:]
    assert (lda, ldo, m, n, k, group, global_scale) == (384, 112, 200, 112, 384, 384, 1.0)
    dp_ctas, tail_splits, stream_k = struct.unpack_from("<3i", params, 104)
    # 2 x 1 tiles of 128 x 128, 3 K tiles each: too little work for stream-K, one CTA a tile
    assert (dp_ctas, tail_splits, stream_k) == (2, 1, 0) and launch["grid"] == (2, 1, 1)
    # the activation map (box: the tile's tokens) at 128, the weights' (box: its channels) at 256
    assert fakes.maps[0] == (qa.codes.data_ptr(), 200, 192, 384, 128, 64)
    assert fakes.maps[1] == (packed.w.data_ptr(), 112, 192, 384, 128, 64)
    assert params[128:256] == bytes([1]) * 128 and params[256:384] == bytes([2]) * 128
    scale_ptr, stride = struct.unpack_from("<Qi", params, 384)
    if blocks:  # staged token scales: the transposed copy, rows of M rounded up to 4
        assert stride == 200 and scale_ptr != qa.scales.data_ptr()
    else:
        assert stride == 0 and scale_ptr == qa.scales.data_ptr()


def test_stream_k_takes_every_slot_below_a_wave(monkeypatch):
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(20, 512, 4096)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:8x128x128_w1x4_s6", None)
    (launch,) = fakes.launches
    # 3 x 4 tiles of 8 x 128 with 32 K tiles each, two CTAs per SM: 264 persistent CTAs
    assert struct.unpack_from("<3i", launch["params"], 104)[2] == 1 and launch["grid"] == (264, 1, 1)
    assert launch["block"] == (256, 1, 1)
    # two consumer warpgroups: the tail split below a wave too (4 tiles of 128 x 128, K in slices)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:128x128x128_w1x8_s5", None)
    dp_ctas, splits, stream_k = struct.unpack_from("<3i", fakes.launches[-1]["params"], 104)
    assert stream_k == 0 and dp_ctas == 0 and splits > 1 and fakes.launches[-1]["grid"] == (4 * splits, 1, 1)


def test_the_tail_split_grid_and_workspace(monkeypatch):
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(200, 2560, 4096)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:128x128x128_w1x8_s6", 0)
    (launch,) = fakes.launches
    dp_ctas, tail_splits, stream_k = struct.unpack_from("<3i", launch["params"], 104)
    # 40 tiles of 32 K tiles on 132 one-CTA slots: no whole wave, every tile in K slices
    assert (dp_ctas, tail_splits, stream_k) == (0, 3, 0) and launch["grid"] == (40 * 3, 1, 1)
    fields = params_abi.GEMM_PARAMS.unpack(launch["params"][:104])
    assert fields[6] != 0 and fields[7] != 0  # workspace and counters
    assert fields[14] == 3


def test_a_wave_of_ctas_walks_the_whole_tiles_where_the_staging_tile_is_apart(monkeypatch):
    """The tail split's whole tiles are walked by at most one wave of resident CTAs (P), its split
    tail taken by CTAs P on (schedule/work_units.cuh): by default where the tile's staging tile lies
    after its ring (the producer then loads a CTA's next tile during its store), and on request."""
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(640, 7680, 4096)  # 5 x 60 = 300 tiles of 128 x 128, 32 K tiles each
    separate, shared = "wgmma-ss:128x128x128_w1x8_s5", "wgmma-ss:128x128x128_w1x8_s6"
    key = w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(separate), False)
    assert key.tile.body.key_smem_bytes(key) == 5 * 32768 + 128 * 136 * 2 + 1024  # ring, then the staging tile
    cases = [(separate, None, 132), (separate, False, 264), (shared, None, 264), (shared, True, 132)]
    for tile, persistent, walkers in cases:
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, tile, 0, persistent)
        launch = fakes.launches[-1]
        # two whole waves of 132 (dp_ctas 264), then 36 tiles in 3 K slices each
        assert struct.unpack_from("<3i", launch["params"], 104) == (264, 3, 0)
        assert launch["grid"] == (walkers + 36 * 3, 1, 1), (tile, persistent)
    qa, packed = _operands(2048, 4096, 4096)  # 512 tiles: whole waves only, so no tail
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, separate, 0, None)
    assert struct.unpack_from("<3i", fakes.launches[-1]["params"], 104) == (512, 1, 0)
    assert fakes.launches[-1]["grid"] == (132, 1, 1)
    # past WALK_K_TILES K tiles (K = 8320: 65) a CTA per tile by default, the walk on request
    qa, packed = _operands(2048, 4096, 128 * (_w8a8_launch.WALK_K_TILES + 1))
    for persistent, grid in ((None, 512), (True, 132)):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, separate, 0, persistent)
        assert fakes.launches[-1]["grid"] == (grid, 1, 1), persistent


def test_errors_come_before_any_launch(monkeypatch):
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(8, 128, 256)
    with pytest.raises(ValueError, match="wgmma-ss tiles"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ws:64x128x64_w1x4_s4", None)
    with pytest.raises(ValueError, match=r"stream_k=1000 persistent CTAs: must be in \[1, 2\]"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:8x128x128_w1x4_s6", 1000)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, torch.empty(8, 100, dtype=torch.bfloat16), None, None)
    strided = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                        scale_dtype="float32", codes=torch.zeros(8, 512, dtype=torch.uint8)[:, :256],
                                        scales=qa.scales)
    _w8a8_launch.launch(strided, packed, None, torch.bfloat16, None, None, None)  # 512-byte rows: fine
    overlapping = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                            scale_dtype="float32",
                                            codes=torch.zeros(4096, dtype=torch.uint8).as_strided((8, 256), (16, 1)),
                                            scales=qa.scales)
    with pytest.raises(ValueError, match="at least K"):
        _w8a8_launch.launch(overlapping, packed, None, torch.bfloat16, None, None, None)
    blocks_qa, blocks = _operands(300, 128, 256, blocks=True)
    with pytest.raises(ValueError, match="token scales"):
        _w8a8_launch.launch(blocks_qa, blocks, None, torch.bfloat16, None, "wgmma-ss:192x128x128_w1x8_s5", None)
    assert len(fakes.launches) == 1  # only the strided call launched


def test_a_problem_is_planned_once(monkeypatch):
    # the kernel, its schedule (and the driver queries behind it) and the weight map are worked out
    # on the first call; the next call of the same problem only packs pointers and launches
    fakes = Fakes(monkeypatch)
    qa, packed = _operands(20, 512, 4096)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    loads, queries, maps = len(fakes.loads), fakes.attribute_queries, len(fakes.maps)
    assert loads == 1 and queries > 0 and maps == 2
    out = torch.empty(20, 512, dtype=torch.bfloat16)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, out, None, None)
    assert (len(fakes.loads), fakes.attribute_queries, len(fakes.maps)) == (loads, queries, maps)
    first, second = fakes.launches
    assert first["grid"] == second["grid"] and first["params"][104:] == second["params"][104:]
    assert params_abi.GEMM_PARAMS.unpack(second["params"][:104])[5] == out.data_ptr()


def test_int4_and_mxfp4_weights_of_one_shape_get_their_own_kernels(monkeypatch):
    """A plan is per weight element too: an int4 and an MXFP4 W4A8 weight of the same shape and
    tile in one process run their own kernels (the plan key once named int4 only, and the second
    weight ran the first's kernel: GPU tests, session 41)."""
    from humming_aot import w4a8

    fakes = Fakes(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    qa = ops.quantize_activation(torch.randn(8, 256, generator=gen), "float8e4m3:token")
    for fmt in ("int4:g128", "mxfp4", "int4:g128"):
        packed = w4a8.pack(quant.quantize(torch.randn(128, 256, generator=gen), fmt))
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-w4a8:8x128x128_w1x4_s8", None)
    tile = parse_tile_field("wgmma-w4a8:8x128x128_w1x4_s8")
    assert fakes.loads == [w4a8.kernel_key("sm90a", torch.bfloat16, tile).name,
                           w4a8.kernel_key("sm90a", torch.bfloat16, tile, weight_element="float4e2m1").name]
    assert len(fakes.launches) == 3


# --- the portable mma-ss body (GPUs without wgmma) ----------------------------------------------

def _device(monkeypatch, name, capability, smem_per_sm=102400, num_sms=84):
    from humming_aot import arch

    info = dispatch.DeviceInfo(index=0, name=name, capability=capability, num_sms=num_sms, smem_per_sm=smem_per_sm,
                               arches=tuple(arch.serving_arches(capability)))
    monkeypatch.setattr(dispatch, "device_info", lambda index: info)
    return info


def _int8_operands(m, n, k):
    gen = torch.Generator().manual_seed(1)
    packed = w8a8.pack(quant.quantize(torch.randn(n, k, generator=gen), "int8:channel"))
    return ops.quantize_activation(torch.randn(m, k, generator=gen), "int8:token"), packed


@pytest.mark.parametrize("element", ["int8", "float8e4m3"])
def test_an_ada_gpu_runs_the_mma_ss_table_with_gemm_params_and_no_tensor_map(monkeypatch, element):
    fakes = Fakes(monkeypatch)
    _device(monkeypatch, "fake L40S", (8, 9), num_sms=142)
    qa, packed = _int8_operands(200, 100, 400) if element == "int8" else _operands(200, 100, 400)
    out = _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    tile = w8a8.select_sync_tile(200)
    assert out.shape == (200, 112) and tile.mma.value == "mma-ss"
    assert fakes.loads == [w8a8.kernel_key("sm89", torch.bfloat16, tile, False, element).name]
    assert fakes.maps == []  # cp.async reads the codes: no tensor map encoded
    (launch,) = fakes.launches
    params = launch["params"]
    fields = params_abi.GEMM_PARAMS.unpack(params[:104])
    # m, n, k (K tiles of 128: 4), group_size (the codes' own K), global scale; 2 tiles on 142 SMs
    # split K in 2 (at least 256 of K a slice)
    assert fields[10:14] == (200, 112, 512, 400) and fields[15] == 1.0 and fields[14] == 2
    assert fields[0] == qa.codes.data_ptr() and fields[1] == packed.w.data_ptr()
    assert params[128:384] == bytes(256)  # both tensor maps zero
    assert struct.unpack_from("<Q", params, 384)[0] != 0  # the token scales
    assert launch["grid"] == (2, 2, 1) and launch["block"] == (tile.threads, 1, 1)


def test_the_mma_ss_body_splits_k_where_the_tiles_leave_sms_idle(monkeypatch):
    fakes = Fakes(monkeypatch)
    _device(monkeypatch, "fake A100", (8, 0), smem_per_sm=167936, num_sms=108)
    qa, packed = _int8_operands(4, 1024, 8192)  # 8 tiles of 16 x 128 on 108 SMs
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    (launch,) = fakes.launches
    splits = launch["grid"][1]
    assert launch["grid"][0] == 8 and splits > 1
    fields = params_abi.GEMM_PARAMS.unpack(launch["params"][:104])
    assert fields[14] == splits and fields[6] != 0 and fields[7] != 0  # k_splits, workspace, counters
    assert fakes.loads[0].startswith("gemm_dense_sm80_mma-ss_a-s8")


def test_an_h200_runs_a_named_mma_ss_tile_from_its_first_arch_without_a_catalog_key(monkeypatch):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr("humming_aot.catalog.installed_catalog", lambda: None)
    qa, packed = _operands(40, 256, 256)
    _w8a8_launch.launch(qa, packed, None, torch.float16, None, "mma-ss:32x128x128_w1x4_s4", None)
    assert fakes.loads == [w8a8.kernel_key("sm90a", torch.float16, parse_tile_field("mma-ss:32x128x128_w1x4_s4"),
                                           False, "float8e4m3").name]
    with pytest.raises(ValueError, match="no stream-K"):
        _w8a8_launch.launch(qa, packed, None, torch.float16, None, "mma-ss:16x128x128_w1x4_s4", 4)


def test_what_an_arch_without_the_pairing_gets_is_a_clear_error_before_any_launch(monkeypatch):
    fakes = Fakes(monkeypatch)
    _device(monkeypatch, "fake A10", (8, 6))
    qa, packed = _operands(8, 128, 256)
    with pytest.raises(RuntimeError, match="float8e4m3 W8A8 needs mma.sync on float8e4m3 codes: sm89 or later"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    _device(monkeypatch, "fake L40S", (8, 9))
    with pytest.raises(RuntimeError, match="sm90a"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:8x128x128_w1x4_s6", None)
    _device(monkeypatch, "fake T4", (7, 5))
    int8_qa, int8 = _int8_operands(8, 128, 256)
    with pytest.raises(RuntimeError, match="sm80 or later"):
        _w8a8_launch.launch(int8_qa, int8, None, torch.bfloat16, None, None, None)
    assert fakes.launches == []


def test_block_scales_off_sm90a_pass_the_token_scales_row_stride(monkeypatch):
    fakes = Fakes(monkeypatch)
    _device(monkeypatch, "fake L40S", (8, 9), num_sms=142)
    qa, packed = _operands(40, 300, 512, blocks=True)  # N padded to 304: 3 blocks of 128
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    tile = w8a8.select_sync_tile(40)
    assert fakes.loads == [w8a8.kernel_key("sm89", torch.bfloat16, tile, True).name]
    (launch,) = fakes.launches
    a_scale, stride = struct.unpack_from("<Qi", launch["params"], 384)
    assert a_scale != 0 and stride == 512 // 128  # (m, k / 128) token scales, rows k / 128 apart


def _int4_operands(m, n, k):
    gen = torch.Generator().manual_seed(2)
    packed = w8a8.pack(quant.quantize(torch.randn(n, k, generator=gen), "int4:channel"))
    return None, None, packed, ops.quantize_activation(torch.randn(m, k, generator=gen), "int4:token")


# W4A4 (int4 x int4) runs on the mma-ss body everywhere: an H200 its sm90a build (the kernel's K
# in bytes, the activation codes packed two a byte before the launch), an A100 its sm80 one

def test_an_h200_runs_the_sm90a_build_with_the_kernel_k_in_bytes(monkeypatch):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr("humming_aot.catalog.installed_catalog", lambda: None)
    _, _, packed, qa = _int4_operands(40, 100, 384)
    out = _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    tile = w8a8.select_sync_tile(40)
    assert out.shape == (40, 112)
    assert fakes.loads == [w8a8.kernel_key("sm90a", torch.bfloat16, tile, element="int4").name]
    (launch,) = fakes.launches
    fields = params_abi.GEMM_PARAMS.unpack(launch["params"][:104])
    # a: a packed copy of the codes (rows of K / 2 = 192 bytes); m, n, k (K tiles of 128 bytes: 2),
    # group_size: the codes' row bytes
    assert fields[0] != qa.codes.data_ptr() and fields[1] == packed.w.data_ptr()
    assert fields[8] == 192 and fields[10:14] == (40, 112, 256, 192)
    with pytest.raises(ValueError, match="W4A4\\) runs on mma-ss tiles only"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, "wgmma-ss:64x128x128_w1x8_s6", None)


def test_an_a100_runs_its_sm80_build_and_a_t4_is_told_which_arch_can(monkeypatch):
    fakes = Fakes(monkeypatch)
    _device(monkeypatch, "fake A100", (8, 0), smem_per_sm=167936, num_sms=108)
    _, _, packed, qa = _int4_operands(16, 256, 256)
    _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    assert fakes.loads[0].startswith("gemm_dense_sm80_mma-ss_a-s4-k-f32_w-s4-g-f32")
    _device(monkeypatch, "fake T4", (7, 5))
    _w8a8_launch._plans.clear()  # (a plan is per device index: device 0 is another GPU now)
    with pytest.raises(RuntimeError, match="int4 W4A4 needs mma.sync on int4 codes: sm80 or later"):
        _w8a8_launch.launch(qa, packed, None, torch.bfloat16, None, None, None)
    assert len(fakes.launches) == 1


def test_what_an_mxfp4_or_w4a4_caller_is_told_before_any_launch(monkeypatch):
    from humming_aot import w4a8
    from humming_aot.nn import W8A8Linear

    fakes = Fakes(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    mx = w4a8.pack(quant.quantize(torch.randn(128, 256, generator=gen), "mxfp4"))
    qa = ops.quantize_activation(torch.randn(8, 256, generator=gen), "float8e4m3:token")
    _device(monkeypatch, "fake A10", (8, 6))
    with pytest.raises(RuntimeError, match="MXFP4 W4A8 needs mma.sync on float8e4m3 codes: sm89 or later.*MXFP4 "
                                           "weights take float8 activations only"):
        _w8a8_launch.launch(qa, mx, None, torch.bfloat16, None, None, None)
    _, _, packed, qa4 = _int4_operands(8, 128, 256)
    with pytest.raises(ValueError, match="the W4A4 kernels run mma-ss tiles only"):
        _w8a8_launch.launch(qa4, packed, None, torch.bfloat16, None, "mma-w4a8:16x128x128_w1x4_s4", None)
    assert fakes.launches == []
    with pytest.raises(ValueError, match="activations int4:g128 do not suit weights int4:channel; use int4:token"):
        W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:channel", activations="int4:g128")
