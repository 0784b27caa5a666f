"""dispatch.launch_plan / LaunchPlan on CPU tensors, with a fake device and launcher: what a plan
holds is worked out once, a launch packs only pointers and M, and every error of launch_gemm
still fires with its text. Also the eager path's guards and QuantizedLinear's PackedWeight cache."""
from __future__ import annotations

import struct

import pytest
import torch

import humming_aot
from humming_aot import _launcher, dispatch, ops, params_abi
from humming_aot import obtain as kernel_obtain
from humming_aot.enumerate import parse_tile_field
from humming_aot.formats import round_to
from humming_aot.kernels import LoadedKernel
from humming_aot.spec import KernelKey, MmaKind

H200 = dispatch.DeviceInfo(index=0, name="fake H200", capability=(9, 0), num_sms=132, smem_per_sm=233472,
                           arches=("sm90a",))


class ThroughLaunch:
    """A plan's PlannedLaunch whose launch() hands the extension's own bytes (``params``, which
    needs no driver) to ``_launcher.launch`` (faked by the tests) instead of launching."""

    def __init__(self, planned, kernel, grid, block, smem, device, pdl, cluster):
        self.planned, self.kernel, self.grid, self.block, self.smem = planned, kernel, grid, block, smem
        self.device, self.pdl, self.cluster = device, pdl, cluster

    def launch(self, stream, *fields):
        _launcher.launch(self.kernel, self.grid, self.block, self.smem, stream, self.planned.params(*fields),
                         self.device, programmatic_dependent_launch=self.pdl, cluster=self.cluster)


class Fakes:
    """A device that reports H200 properties, a kernel 'loaded' per key, a launcher that records."""

    def __init__(self, monkeypatch, cluster_launch=True):
        self.launches, self.loads = [], []
        self.threads_of = {}
        self.cluster_launch = cluster_launch
        dispatch._selected.clear()
        dispatch._plans.clear()
        monkeypatch.setattr(dispatch, "device_info", lambda index: H200)
        monkeypatch.setattr(kernel_obtain, "select_key", self.select_key)
        monkeypatch.setattr(kernel_obtain, "load", self.load)
        monkeypatch.setattr(_launcher, "launch", self.launch)
        real_planned_launch = _launcher.planned_launch
        monkeypatch.setattr(_launcher, "planned_launch",
                            lambda *args: ThroughLaunch(real_planned_launch(*args), *args[:7]))
        monkeypatch.setattr(_launcher, "encode_tensor_map_2d", self.encode_tensor_map_2d)
        monkeypatch.setattr(_launcher, "kernel_attribute", self.kernel_attribute)
        self.active_clusters = {}  # cluster size -> clusters resident at once (absent: plenty)
        self.cluster_queries = []
        monkeypatch.setattr(_launcher, "max_active_clusters", self.max_active_clusters)
        dispatch._active_clusters.clear()
        dispatch._tensor_maps.clear()
        self.tensor_maps = []
        monkeypatch.setattr(dispatch, "_split_k_counters", lambda device, stream: torch.zeros(8, dtype=torch.int32))
        monkeypatch.setattr(dispatch, "current_stream", lambda index: 0x5EED)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    @staticmethod
    def select_key(spec, info, m, tile=None, k=None, group=None, n=None):
        from humming_aot import heuristics

        return KernelKey(arch="sm90a", spec=spec, tile=tile or heuristics.select_tile(
            "sm90a", m, k, group, spec.w_bits, n=n, num_sms=info.num_sms))

    def load(self, key, info):
        self.loads.append(key.name)
        self.threads_of[len(self.loads) + 100] = key.tile.threads
        return LoadedKernel(name=key.name, library=1, kernel=len(self.loads) + 100, threads=key.tile.threads,
                            smem_bytes=50_000, device=info.index,
                            params_bytes=256 if key.tile.mma is MmaKind.WGMMA_WS else dispatch._PARAMS.size,
                            programmatic_launch=True, cluster_launch=self.cluster_launch)

    def kernel_attribute(self, kernel, attribute, device):
        if attribute == _launcher.FunctionAttribute.SHARED_SIZE_BYTES:
            return 2048  # the ring's mbarriers and the arrival flag
        assert attribute == _launcher.FunctionAttribute.NUM_REGS
        threads = self.threads_of[kernel]
        # what the wgmma-ws body's launch bounds give: two CTAs per SM of 256 threads, one of 384
        return (65536 // (2 if threads <= 256 else 1) // threads) // 8 * 8

    def max_active_clusters(self, kernel, block, smem, cluster, device):
        self.cluster_queries.append((kernel, block, smem, cluster, device))
        return self.active_clusters.get(cluster[1], 10_000)

    def encode_tensor_map_2d(self, address, rows, cols, row_stride_bytes, box_rows, box_cols):
        self.tensor_maps.append((address, rows, cols, row_stride_bytes, box_rows, box_cols))
        return bytes(range(128))

    def launch(self, kernel, grid, block, smem, stream, params, device, *, programmatic_dependent_launch=False,
               cluster=(1, 1, 1)):
        self.launches.append(dict(kernel=kernel, grid=grid, block=block, smem=smem, stream=stream, params=params,
                                  device=device, pdl=programmatic_dependent_launch, cluster=cluster))


def _packed(fmt="int4:g128", n=256, k=512):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    return humming_aot.pack(humming_aot.quantize(w, fmt), act_dtype=torch.bfloat16)


def _fields(params: bytes):
    return dispatch._PARAMS.unpack(params)


def test_a_launch_packs_every_pointer_and_the_problem(monkeypatch):
    fakes = Fakes(monkeypatch)
    packed = _packed("uint4:g64:zp")
    a = torch.randn(3, 512).bfloat16()
    bias = torch.randn(256).bfloat16()
    out = torch.empty(3, 256, dtype=torch.bfloat16)
    assert dispatch.launch_gemm(a, packed, bias, ops.gemm_spec(packed), out=out) is out
    (call,) = fakes.launches
    fields = _fields(call["params"])
    assert fields[:6] == (a.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(),
                          packed.w_zero_point.data_ptr(), bias.data_ptr(), out.data_ptr())
    assert fields[8:] == (512, 256, 3, 256, 512, 64, fields[14], pytest.approx(packed.global_scale))
    plan = next(iter(dispatch._plans.values()))
    assert call["grid"] == plan.grid and call["cluster"] == plan.cluster and call["stream"] == 0x5EED
    assert call["pdl"] is True and call["block"] == (plan.key.tile.threads, 1, 1)
    assert fields[14] == plan.splits


def test_the_plan_is_made_once_per_problem_and_only_pointers_change(monkeypatch):
    fakes = Fakes(monkeypatch)
    packed = _packed()
    spec = ops.gemm_spec(packed)
    for _ in range(3):
        a = torch.randn(1, 512).bfloat16()
        dispatch.launch_gemm(a, packed, None, spec)
    assert len(fakes.loads) == 1 and len(dispatch._plans) == 1
    first, last = (_fields(call["params"]) for call in (fakes.launches[0], fakes.launches[-1]))
    assert first[1:3] == last[1:3] and first[8:] == last[8:]  # weights and problem; a and out are new
    dispatch.launch_gemm(torch.randn(2, 512).bfloat16(), packed, None, spec)
    assert len(dispatch._plans) == 2  # another M, another plan


def test_workspace_split_k_passes_a_fresh_workspace_and_the_counters(monkeypatch):
    fakes = Fakes(monkeypatch, cluster_launch=False)
    packed = _packed()
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    dispatch.launch_gemm(torch.randn(1, 512).bfloat16(), packed, None, ops.gemm_spec(packed), splits=2)
    fields = _fields(fakes.launches[-1]["params"])
    plan = next(iter(dispatch._plans.values()))
    assert plan.workspace_shape == (2, 1, 256) and fields[6] != 0 and fields[7] == plan.counters_ptr != 0
    assert fakes.launches[-1]["cluster"] == (1, 1, 1) and fakes.launches[-1]["grid"][1] == 2


def _cpu_empty(empty):
    def cpu_empty(*args, device=None, **kwargs):  # the fake device's workspace lives on the CPU
        return empty(*args, **kwargs)
    return cpu_empty


def test_cluster_split_k_needs_no_workspace(monkeypatch):
    fakes = Fakes(monkeypatch)
    packed = _packed()
    tile = humming_aot.heuristics.select_tile("sm90a", 1, 512, 128, 4)
    assert tile.block_m == 8
    dispatch.launch_gemm(torch.randn(1, 512).bfloat16(), packed, None, ops.gemm_spec(packed), tile=tile, splits=2)
    fields = _fields(fakes.launches[-1]["params"])
    assert fields[6] == 0 and fields[7] == 0 and fakes.launches[-1]["cluster"] == (1, 2, 1)


def test_cluster_split_k_takes_only_as_many_slices_as_clusters_fit(monkeypatch):
    """An 8-row tile sums its K slices in a cluster of that many CTAs: the automatic split count is
    at most 8 (the workspace path is slower) and drops until every tile's cluster is resident at once
    by the driver's count (cuOccupancyMaxActiveClusters; log section 25)."""
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    packed = _packed(n=4096, k=2048)  # 32 tiles of 8 x 128: 264 slots / 32 -> 8 slices
    spec = ops.gemm_spec(packed)
    a = torch.randn(1, 2048).bfloat16()
    dispatch.launch_gemm(a, packed, None, spec)
    assert fakes.launches[-1]["cluster"] == (1, 8, 1)
    dispatch._plans.clear()
    fakes.active_clusters.update({8: 24, 7: 31})  # 32 tiles: neither 8 nor 7 fits at once
    dispatch._active_clusters.clear()  # (the counts are cached per kernel, device and size)
    dispatch.launch_gemm(a, packed, None, spec)
    assert fakes.launches[-1]["cluster"] == (1, 6, 1) and fakes.launches[-1]["grid"][1] == 6
    kernel = fakes.launches[-1]["kernel"]
    assert [(q[0], q[3]) for q in fakes.cluster_queries] == [(kernel, (1, s, 1)) for s in (1, 8, 1, 8, 7, 6)]
    dispatch._plans.clear()
    fakes.active_clusters[8] = 0  # the driver cannot say: the split stands
    dispatch._active_clusters.clear()
    dispatch.launch_gemm(a, packed, None, spec)
    assert fakes.launches[-1]["cluster"] == (1, 8, 1)
    # 23 tiles would take 11 slices: capped at the 8 a cluster holds
    narrow = _packed(n=2944, k=4096)
    dispatch.launch_gemm(torch.randn(1, 4096).bfloat16(), narrow, None, ops.gemm_spec(narrow))
    assert fakes.launches[-1]["cluster"] == (1, 8, 1)
    # more tiles than resident CTAs: the decode wave split (2 slices) is not there to fill a wave and stands
    dispatch._plans.clear()
    fakes.active_clusters.update({1: 264, 2: 132})
    dispatch._active_clusters.clear()
    wide = _packed(n=128 * 300, k=512)
    dispatch.launch_gemm(torch.randn(1, 512).bfloat16(), wide, None, ops.gemm_spec(wide))
    assert fakes.launches[-1]["cluster"] == (1, 2, 1)
    # asked for, a split count is kept
    dispatch.launch_gemm(torch.randn(1, 4096).bfloat16(), narrow, None, ops.gemm_spec(narrow), splits=11)
    assert fakes.launches[-1]["grid"][1] == 11 and fakes.launches[-1]["cluster"] == (1, 1, 1)


def test_launch_gemm_errors_keep_their_text(monkeypatch):
    Fakes(monkeypatch)
    packed = _packed()
    spec = ops.gemm_spec(packed)
    a = torch.randn(1, 512).bfloat16()
    wide = humming_aot.heuristics.select_tile("sm90a", 1, 512, 128, 4)
    with pytest.raises(ValueError, match=r"splits=99 must be in \[1, K / "):
        dispatch.launch_gemm(a, packed, None, spec, tile=wide, splits=99)
    with pytest.raises(ValueError, match="cluster_reduction=True but kernel .* with splits=1 cannot sum"):
        dispatch.launch_gemm(a, packed, None, spec, tile=wide, splits=1, cluster_reduction=True)
    odd = _packed("int4:g64", k=320)  # K = 5 x 64: no 128- or 256-wide stage fits
    big = next(t for t in (wide, humming_aot.heuristics.select_tile("sm90a", 1)) if t.block_k > 64)
    with pytest.raises(ValueError, match=f"needs K % {big.block_k} == 0"):
        dispatch.launch_gemm(torch.randn(1, 320).bfloat16(), odd, None, ops.gemm_spec(odd), tile=big)
    assert not dispatch._plans  # nothing cached from a refused call


def test_params_layout_is_checked_once_against_the_kernel(monkeypatch):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(fakes, "load", lambda key, info: LoadedKernel(
        name=key.name, library=1, kernel=7, threads=key.tile.threads, smem_bytes=0, params_bytes=96, device=0))
    monkeypatch.setattr(kernel_obtain, "load", fakes.load)
    packed = _packed()
    with pytest.raises(ValueError, match=f"params are {dispatch._PARAMS.size} bytes but the kernel takes 96"):
        dispatch.launch_gemm(torch.randn(1, 512).bfloat16(), packed, None, ops.gemm_spec(packed))


def test_a_launcher_error_names_the_kernel(monkeypatch):
    fakes = Fakes(monkeypatch)

    def failing(*args, **kwargs):
        raise RuntimeError("cuLaunchKernelEx: CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(_launcher, "launch", failing)
    packed = _packed()
    with pytest.raises(RuntimeError) as info:
        dispatch.launch_gemm(torch.randn(1, 512).bfloat16(), packed, None, ops.gemm_spec(packed))
    assert any(note.startswith("launching kernel gemm_dense_sm90a") for note in info.value.__notes__)
    assert fakes.loads


def test_params_struct_is_the_cuda_layout():
    assert dispatch._PARAMS.size == 8 * 8 + 2 * 8 + 5 * 4 + 4 == struct.calcsize("<8Q2q5if")


def test_the_eager_path_steps_aside_for_modes_and_tracing():
    assert ops._no_torch_modes()
    with torch.device("cpu"):
        assert not ops._no_torch_modes()  # a torch function mode must see the op
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not ops._no_torch_modes()


def test_planned_path_declines_cpu_tensors():
    packed = _packed()
    a = torch.randn(2, 512).bfloat16()
    assert ops._gemm_planned(a, packed.w, packed.w_scale, None, None, packed.w_dtype, packed.act_dtype, packed.n,
                             packed.k, packed.group_size, 1.0, False, packed.layout_version) is None


def test_quantized_linear_keeps_one_packed_weight_until_a_buffer_changes():
    lin = torch.nn.Linear(256, 128, bias=True)
    q = humming_aot.nn.QuantizedLinear.from_linear(lin, "int4:g64")
    x = torch.randn(3, 256).bfloat16()
    y = q(x)
    packed = q.__dict__["_packed"]
    assert torch.equal(q(x), y) and q.__dict__["_packed"] is packed
    q.w_scale = q.w_scale * 2  # a new buffer tensor: the cached PackedWeight must not be used
    y2 = q(x)
    assert q.__dict__["_packed"] is not packed and q.__dict__["_packed"].w_scale is q.w_scale
    ref = round_to(x.double() @ q.packed.dequantized().double().t() + q.bias.double(), torch.bfloat16)
    assert torch.equal(y2, ref)


@pytest.mark.parametrize("m,n,k,expected", [
    # 6144 x 4096, M = 1024, 256 x 128 tiles, one CTA per SM: one full wave of 132, then 60 tiles in 2 slices
    (1024, 6144, 4096, dict(dp=132, splits=2, grid=132 + 60 * 2)),
    # fewer tiles than SMs: every tile split (3 x 2 tiles of 256 x 128 at K = 2048: 3 slices of 32 K tiles)
    (600, 256, 2048, dict(dp=0, splits=3, grid=6 * 3)),
    # a last wave 79 % full is not split: 8 x 79 = 632 tiles = 4 waves + 104
    (2048, 79 * 128, 1024, None),
    # more tiles than split-K counters (32 x 129 = 4128), of which only the last wave's 36 split:
    # once refused for the tiles' count (Llama-3-8B gate_up at 8192 tokens; the 256 x 128 tile
    # forced: the table takes 176 x 256 there, next case)
    (8192, 129 * 128, 2048, dict(dp=31 * 132, splits=3, grid=31 * 132 + 36 * 3, tile="256x128x64_w1x8_s5")),
    # the table's 176 x 256 tile: 47 x 65 = 3055 tiles, 23 full waves, the last 19 in 3 slices
    (8192, 129 * 128, 2048, dict(dp=23 * 132, splits=3, grid=23 * 132 + 19 * 3)),
])
def test_tma_body_splits_only_its_partial_last_wave(monkeypatch, m, n, k, expected):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    a = torch.randn(m, k).bfloat16()
    forced = parse_tile_field(f"wgmma-ws:{expected['tile']}") if expected and "tile" in expected else None
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), tile=forced, stream_k=0)
    (call,) = fakes.launches
    plan = next(iter(dispatch._plans.values()))
    assert plan.key.tile.mma is MmaKind.WGMMA_WS and len(call["params"]) == 256
    assert forced is None or plan.key.tile == forced
    tiles = -(-m // plan.key.tile.block_m) * -(-n // plan.key.tile.block_n)
    dp, splits, stream_k = struct.unpack_from("<3i", call["params"], 104)
    assert stream_k == 0
    assert call["params"][128:] == bytes(range(128)) and call["params"][116:128] == bytes(12)
    assert fakes.tensor_maps == [(a.data_ptr(), m, k, 2 * k, plan.key.tile.block_m, 64)]
    if expected is None:
        assert (dp, splits) == (tiles, 1) and call["grid"] == (tiles, 1, 1) and plan.workspace_shape is None
    else:
        assert (dp, splits, call["grid"]) == (expected["dp"], expected["splits"], (expected["grid"], 1, 1))
        assert plan.workspace_shape == ((tiles - dp) * splits, plan.key.tile.block_m * plan.key.tile.block_n)
    # the same activations again: the map is reused, not encoded anew
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), tile=forced, stream_k=0)
    assert len(fakes.tensor_maps) == 1


def _stream_k_problem(m=600, n=256, k=2048):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    return torch.randn(m, k).bfloat16(), packed


def test_stream_k_plan_launches_its_persistent_grid(monkeypatch):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem()
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), stream_k=100)
    (call,) = fakes.launches
    plan = next(iter(dispatch._plans.values()))
    tile = plan.key.tile
    assert tile.mma is MmaKind.WGMMA_WS and call["grid"] == (100, 1, 1)
    assert struct.unpack_from("<3i", call["params"], 104)[2] == 1  # the stream-K switch
    assert call["params"][116:128] == bytes(12) and call["params"][128:] == bytes(range(128))
    assert plan.workspace_shape == (100, tile.block_m * tile.block_n)  # one fp32 tile per CTA
    assert plan.counters is not None


@pytest.mark.parametrize("n,k,grid,stream_k", [
    (4096, 4096, 32 * 4, 0),  # 32 tiles of 72 x 128 over 264 slots: ranges of 7.8 K tiles -> 4 K slices
    (2048, 8192, 16 * 8, 0),  # 16 tiles, ranges of 7.8 K tiles -> 8 slices (the slots' waves took 6)
    (1536, 1536, 12 * 3, 0),  # 12 tiles of 24 K tiles -> 3 slices (the slots' waves took 2)
    (6144, 4096, 264, 1),  # 48 tiles: ranges of 11.6 K tiles -> stream-K over every slot
])
def test_short_stream_k_ranges_take_the_tail_split_in_the_default_plan(monkeypatch, n, k, grid, stream_k):
    """The default plan at 72 tokens (72 x 128 of one warpgroup, two CTAs an SM on 132 SMs): below
    heuristics.STREAM_K_MIN_RANGE_K_TILES K tiles a stream-K range, the tail split's K slices, as
    many as heuristics.short_range_tail_splits counts; from it up, stream-K (log sections 83-84)."""
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem(m=72, n=n, k=k)
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed))
    (call,) = fakes.launches
    plan = next(iter(dispatch._plans.values()))
    assert plan.key.tile == parse_tile_field("wgmma-ws:72x128x64_w1x4_s4")
    assert call["grid"] == (grid, 1, 1) and struct.unpack_from("<3i", call["params"], 104)[2] == stream_k


@pytest.mark.parametrize("kwargs,message", [
    # 256 x 128 tiles of 384 threads: one CTA per SM by registers, so 132 on the H200
    (dict(stream_k=133), r"stream_k=133 persistent CTAs: must be in \[1, 132\].*resident at once"),
    (dict(stream_k=2, splits=2), r"stream_k=2 asks for the stream-K schedule.*splits=2"),
    (dict(stream_k=4, tile="16x128x64_w1x2_s4"), r"only the wgmma-ws body has"),
])
def test_stream_k_requests_the_plan_cannot_honour_are_refused(monkeypatch, kwargs, message):
    Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem()
    if "tile" in kwargs:
        from humming_aot.enumerate import parse_tile_field

        kwargs["tile"] = parse_tile_field(kwargs["tile"])
    with pytest.raises(ValueError, match=message):
        dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), **kwargs)


def test_stream_k_grid_is_capped_by_the_problem(monkeypatch):
    Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem(m=200, n=128, k=128)  # one 256 x 128 tile of 2 K tiles
    with pytest.raises(ValueError, match=r"must be in \[1, 2\].*1 tiles x 2 K tiles"):
        dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), stream_k=3)


def test_resident_ctas_by_registers():
    from humming_aot import heuristics

    assert heuristics.ctas_per_sm_by_registers(256, 128) == 2  # one consumer warpgroup + producer
    assert heuristics.ctas_per_sm_by_registers(384, 168) == 1  # two consumer warpgroups
    assert heuristics.ctas_per_sm_by_registers(256, 129) == 1  # 136 per thread after the warp rounding
    assert heuristics.ctas_per_sm_by_registers(128, 64) == 8


def test_tail_split_schedule_rules():
    from humming_aot import heuristics

    def schedule(tiles, k_tiles, slots):
        return heuristics.tail_split_schedule(tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=4096)

    assert schedule(264, 64, 132) == (264, 1)  # whole waves
    assert schedule(192, 64, 132) == (132, 2)  # 60 tiles: one wave of halves
    assert schedule(80, 128, 132) == (0, 3)  # 0.6 of a wave: two waves of thirds
    assert schedule(48, 64, 264) == (0, 4)
    assert schedule(48, 8, 264) == (48, 1)  # a slice's fixed cost outweighs what 2 slices of 4 K tiles save
    assert schedule(32, 224, 264) == (0, 7)  # long K: slices are cheap, so more of them
    assert schedule(100, 64, 132) == (100, 1)  # no split count fills the machine better
    assert schedule(132 + 120, 64, 132) == (252, 1)  # a 91 % full last wave
    assert schedule(1280, 128, 132) == (1280, 1)  # saves less than SPLIT_MARGIN of a tile


def test_short_range_tail_split_rules():
    """The short-range tail split's slice count: waves of one CTA an SM, as long as the longest
    slice, plus SHORT_RANGE_SLICE_COST_K_TILES a slice."""
    from humming_aot import heuristics

    def splits(tiles, k_tiles):
        return heuristics.short_range_tail_splits(tiles=tiles, k_tiles=k_tiles, num_sms=132)

    assert splits(32, 64) == 4  # 128 CTAs, one an SM; 8 slices would put two on an SM
    assert splits(16, 128) == 8  # a long K pays for more slices
    assert splits(36, 56) == 3  # 108 CTAs of 19 K tiles, not 4 (144 CTAs: two waves)
    assert splits(64, 16) == 2
    assert splits(64, 4) == 1  # one K slice of 4 K tiles each way: nothing to save
    assert splits(130, 64) == 1  # a nearly full wave: any split needs a second
    # No empty slice: 65 K tiles in 13 slices of 5 fill them; 14-16 slices of 5 would leave some empty
    for tiles in range(1, 132):
        s = splits(tiles, 65)
        assert (s - 1) * -(-65 // s) < 65
    assert heuristics.short_stream_k_ranges(tiles=32, k_tiles=64, slots=264, min_range_k_tiles=8)
    assert not heuristics.short_stream_k_ranges(tiles=48, k_tiles=64, slots=264, min_range_k_tiles=8)
    assert not heuristics.short_stream_k_ranges(tiles=32, k_tiles=64, slots=264, min_range_k_tiles=0)
    assert not heuristics.short_stream_k_ranges(tiles=264, k_tiles=1, slots=264, min_range_k_tiles=8)


@pytest.mark.parametrize("n,threads,ctas", [
    (6144, 384, 132),  # 48 tiles of 128 x 128, at most 0.4 per SM: two consumer warpgroups, one CTA per SM
    (10240, 256, 264),  # 80 tiles: one consumer warpgroup, two CTAs per SM
])
def test_default_plan_at_m_128_picks_the_row_and_stream_k_by_tiles_per_sm(monkeypatch, n, threads, ctas):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem(m=128, n=n, k=4096)
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed))
    (call,) = fakes.launches
    plan = next(iter(dispatch._plans.values()))
    assert plan.key.tile.mma is MmaKind.WGMMA_WS and plan.key.tile.threads == threads
    assert call["grid"] == (ctas, 1, 1) and struct.unpack_from("<3i", call["params"], 104)[2] == 1


@pytest.mark.parametrize("m,n,stream_k", [
    (64, 57344, True),  # 448 tiles of 64 x 128 on 264 slots: 1.7 waves, 85 % full on average
    (128, 36864, True),  # 288 tiles: a 9 % last wave
    (64, 67584, False),  # two whole waves
    (256, 57344, False),  # past decode sizes: the tail split
])
def test_default_plan_takes_stream_k_over_a_partial_last_wave_at_decode_sizes(monkeypatch, m, n, stream_k):
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    a, packed = _stream_k_problem(m=m, n=n, k=128)
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed))
    (call,) = fakes.launches
    plan = next(iter(dispatch._plans.values()))
    tile = plan.key.tile
    assert tile.mma is MmaKind.WGMMA_WS
    tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
    dp, splits, switch = struct.unpack_from("<3i", call["params"], 104)
    assert switch == int(stream_k)
    if stream_k:
        assert tile.warps_n == 4 and call["grid"] == (264, 1, 1)
        assert plan.workspace_shape == (264, tile.block_m * tile.block_n)
    else:  # the tail split: whole tiles, then the rest in K slices
        assert call["grid"] == (dp + (tiles - dp) * splits, 1, 1)


def _planned(template: bytes, tensor_map_offset: int = -1):
    return _launcher.planned_launch(
        7, (3, 1, 1), (128, 1, 1), 0, 0, True, (1, 1, 1), template, params_abi.POINTER_OFFSETS,
        params_abi.LDA_OFFSET, params_abi.LDO_OFFSET, params_abi.GLOBAL_SCALE_OFFSET, tensor_map_offset,
    )


def test_the_launchers_planned_params_are_the_struct_packing():
    """PlannedLaunch (C++) writes each per-call field where params_abi says, over the plan's template."""
    template = dispatch._PARAMS.pack(0, 0, 0, 0, 0, 0, 0, 0xC0117, 0, 0, 5, 256, 512, 128, 2, 0.0)
    fields = (0xA0, 0xB0, 0xC0, 0, 0xE0, 0xF0, 0x100, 512, 256, 0.375)
    expected = dispatch._PARAMS.pack(*fields[:7], 0xC0117, fields[7], fields[8], 5, 256, 512, 128, 2, fields[9])
    assert _planned(template).params(*fields, None) == expected
    tma_template = template + bytes(params_abi.TMA_PARAMS_BYTES - len(template))
    tensor_map = bytes(range(128))
    tma = _planned(tma_template, params_abi.TMA_MAP_OFFSET).params(*fields, tensor_map)
    assert tma[:len(expected)] == expected and tma[params_abi.TMA_MAP_OFFSET:] == tensor_map


def test_the_launchers_planned_launch_refuses_bad_layouts_and_maps():
    template = bytes(dispatch._PARAMS.size)
    fields = (1, 2, 3, 4, 5, 6, 7, 8, 9, 1.0)
    with pytest.raises(ValueError, match="the tensor map at byte 128 does not fit in the 104-byte params template"):
        _planned(template, params_abi.TMA_MAP_OFFSET)
    with pytest.raises(ValueError, match="the params template is 0 bytes"):
        _planned(b"")
    tma = _planned(bytes(params_abi.TMA_PARAMS_BYTES), params_abi.TMA_MAP_OFFSET)
    with pytest.raises(ValueError, match="this kernel's Params hold a tensor map; pass its 128 bytes"):
        tma.params(*fields, None)
    with pytest.raises(ValueError, match="the tensor map is 64 bytes, not 128"):
        tma.params(*fields, bytes(64))


def test_a_bound_launch_writes_the_weight_once_and_four_fields_per_call():
    """PlannedLaunch.bind (the eager path's launch) fixes the weight's pointers, ldo, the global
    scale and the stream; its params are the planned launch's with the same fields, no workspace."""
    template = dispatch._PARAMS.pack(0, 0, 0, 0, 0, 0, 0, 0xC0117, 0, 0, 5, 256, 512, 128, 2, 0.0)
    planned = _planned(template)
    bound = planned.bind(0x5EED, 0xB0, 0xC0, 0xD0, 256, 0.375)
    assert bound.stream == 0x5EED
    for a, bias, out, lda in ((0xA0, 0, 0xF0, 512), (0xA00, 0xE00, 0xF00, 640)):
        assert bound.params(a, bias, out, lda) == planned.params(a, 0xB0, 0xC0, 0xD0, bias, out, 0, lda, 256, 0.375,
                                                                 None)
    tma = _planned(bytes(params_abi.TMA_PARAMS_BYTES), params_abi.TMA_MAP_OFFSET)
    with pytest.raises(ValueError, match="hold the activations' tensor map, which changes with every call"):
        tma.bind(0x5EED, 1, 2, 3, 256, 1.0)


def test_a_padded_weights_view_is_made_once_and_never_pickled():
    """ops.gemm keeps bound launches on the unpadded view of a padded PackedWeight: the view is
    the instance's own (made once), and neither it nor the launches travel in a pickle or a copy."""
    import copy
    import pickle

    packed = humming_aot.pack(humming_aot.quantize(torch.randn(100, 192), "int4:g64"), act_dtype=torch.bfloat16)
    assert packed.padded and packed.unpadded_view() is packed.unpadded_view()
    packed.unpadded_view().__dict__["_bound_launches"] = {"launch": object()}
    for clone in (pickle.loads(pickle.dumps(packed)), copy.deepcopy(packed), copy.copy(packed)):
        assert not [name for name in clone.__dict__ if name.startswith("_")]
        assert clone.n_valid == 100 and torch.equal(clone.w, packed.w)
        assert "_bound_launches" not in clone.unpadded_view().__dict__


def test_the_simt_reference_body_runs_one_cta_per_tile_over_all_of_k(monkeypatch):
    """The test-only simt body takes no split-K: its plan is one CTA per 8 x 64 tile, no workspace,
    and a forced split count is refused before any launch."""
    from humming_aot.enumerate import parse_tile_field

    fakes = Fakes(monkeypatch)
    packed = _packed(n=192, k=512)
    spec = ops.gemm_spec(packed)
    tile = parse_tile_field("simt:8x64x16_w1x1_s1")
    a = torch.randn(17, 512).bfloat16()
    dispatch.launch_gemm(a, packed, None, spec, tile=tile)
    (call,) = fakes.launches
    assert call["grid"] == (3 * 3, 1, 1) and call["block"] == (32, 1, 1) and call["cluster"] == (1, 1, 1)
    assert _fields(call["params"])[6:8] == (0, 0) and _fields(call["params"])[14] == 1  # no workspace, k_splits 1
    with pytest.raises(ValueError, match="sums all of K in one CTA; pass splits=None or 1"):
        dispatch.launch_gemm(a, packed, None, spec, tile=tile, splits=2)
    assert len(fakes.launches) == 1
