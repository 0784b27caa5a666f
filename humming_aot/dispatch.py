"""Select -> obtain -> launch for one GEMM on a CUDA device (the run-time path behind ops.gemm).

select:  heuristics' tile for (arch, M) -> KernelKey
obtain:  in-memory cache -> the installed catalog (manifest + sha256) -> JIT disk cache -> NVRTC
         compile, or (HUMMING_AOT_JIT=0) an error that names the missing key and the
         `humming-aot build` command that adds it (humming_aot.obtain)
launch:  one GemmParams struct by value, on torch's current stream (CUDA-graph capturable)

Everything but the pointers is worked out once per (spec, device, stream, M, N, K, group) and kept
in a LaunchPlan (key, loaded kernel, grid, split-K, cluster, counters); a call then only allocates
its output (and workspace), packs the pointers and launches.
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import torch

from humming_aot import _launcher, heuristics, params_abi
from humming_aot import obtain as _obtain
from humming_aot.obtain import KernelNotAvailableError  # noqa: F401  (raised from here, part of the API)
from humming_aot.spec import GemmSpec, KernelKey, MmaKind, TileConfig

# The Params layouts (humming_aot.params_abi owns them).
_PARAMS = params_abi.GEMM_PARAMS
_TMA_SCHEDULE = params_abi.TMA_SCHEDULE
_TMA_PADDING = params_abi.TMA_PADDING
_TMA_PARAMS_BYTES = params_abi.TMA_PARAMS_BYTES
# Split-K arrival counters per (device, stream): one int per output tile, reset by the kernel.
SPLIT_K_COUNTERS = 4096


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    capability: tuple[int, int]
    num_sms: int
    smem_per_sm: int
    arches: tuple[str, ...]  # catalog arches that can serve this GPU, best first


@functools.cache
def device_info(index: int) -> DeviceInfo:
    from humming_aot import arch

    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    return DeviceInfo(
        index=index,
        name=props.name,
        capability=capability,
        num_sms=props.multi_processor_count,
        smem_per_sm=int(getattr(props, "shared_memory_per_multiprocessor", 0) or 101376),
        arches=tuple(arch.serving_arches(capability)),
    )


_lock = threading.Lock()
_selected: dict[tuple, tuple[KernelKey, object]] = {}
_counters: dict[tuple[int, int], torch.Tensor] = {}
_counters_lock = threading.Lock()  # (apart from _lock, which obtain holds through a load or compile)


def obtain(spec: GemmSpec, device_index: int, m: int, tile: TileConfig | None = None,
           k: int | None = None, group: int | None = None, n: int | None = None):
    """(KernelKey, LoadedKernel) for this problem; cached per (spec, device, table tile). K and the
    group size, when given, steer the table away from a tile they do not fit (heuristics.tile_fits);
    N (with K), when given, picks between the rows of one M by the problem's output tiles per SM
    and each SM's share of the K loop (heuristics.tiles.FillCondition).

    Which key and where its image comes from (catalog, JIT cache, NVRTC) is ``humming_aot.obtain``'s
    job; a first call that compiles blocks other first calls of this process for its duration.
    """
    info = device_info(device_index)
    table_tile = tile or heuristics.select_tile(info.arches[0], m, k, group, spec.w_bits, n=n,
                                                num_sms=info.num_sms, float_codes=spec.w_is_float)
    cache_key = (spec, device_index, table_tile, tile is not None)
    hit = _selected.get(cache_key)
    if hit is not None:
        return hit
    with _lock:
        hit = _selected.get(cache_key)
        if hit is None:
            key = _obtain.select_key(spec, info, m, tile, k, group, n=n)
            hit = (key, _obtain.load(key, info))
            _selected[cache_key] = hit
        return hit


class _ProcessWords:
    """int32 words the launcher allocated for the process, as a CUDA array (torch.as_tensor views
    it without owning it)."""

    def __init__(self, address: int, words: int):
        self.__cuda_array_interface__ = {"shape": (words,), "typestr": "<i4", "data": (address, False),
                                         "version": 3, "strides": None}


def _split_k_counters(device: torch.device, stream: int) -> torch.Tensor:
    """The stream's split-K / stream-K tile counters (SPLIT_K_COUNTERS int32, each protocol leaves
    them at zero). Zeroed when made, outside any CUDA-graph capture (_launcher.alloc_zeroed_for_process):
    made inside a capture by torch, they would be the graph's memory, zeroed only when that graph
    replays, while another graph or an eager call on the stream may use them first."""
    slot = (device.index, stream)
    counters = _counters.get(slot)
    if counters is None:
        with _counters_lock:  # (the launcher releases the GIL: a second thread on the slot must not allocate again)
            counters = _counters.get(slot)
            if counters is None:
                address = _launcher.alloc_zeroed_for_process(device.index, SPLIT_K_COUNTERS * 4)
                counters = torch.as_tensor(_ProcessWords(address, SPLIT_K_COUNTERS), device=device)
                _counters[slot] = counters
    return counters


# Clusters of up to 8 CTAs are portable (larger ones need an opt-in per kernel, and fit fewer GPCs).
MAX_CLUSTER_SPLITS = 8


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device_index: int) -> int:
    """torch's current CUstream on `device_index`, as an int (the capture stream inside a CUDA graph
    capture). The raw accessor skips building a torch.cuda.Stream object on every call."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _params_template(plan: "LaunchPlan") -> bytes:
    """The bytes of the kernel's one by-value argument with the per-call fields zero (pointers but
    the counters', row strides, global scale, tensor map): GemmParams (kernel/params.cuh), or for
    the TMA body TmaGemmParams (GemmParams, its schedule, padding and the activations' tensor map).
    The one place that knows what a plan fixes in a params layout; params_abi has the offsets of
    what a launch writes."""
    params = _PARAMS.pack(0, 0, 0, 0, 0, 0, 0, plan.counters_ptr, 0, 0, plan.m, plan.n, plan.k, plan.group_size,
                          plan.splits, 0.0)
    if plan.dp_ctas is None:
        return params
    return (params + _TMA_SCHEDULE.pack(plan.dp_ctas, plan.splits, 1 if plan.stream_k_ctas else 0) + _TMA_PADDING
            + bytes(params_abi.TMA_MAP_BYTES))


_tensor_maps: dict[tuple[int, int, int, int, int], bytes] = {}


def _activation_tensor_map(a: torch.Tensor, lda: int, m: int, k: int, block_m: int) -> bytes:
    """The TMA map of the TMA body's activation boxes (block_m rows x 64 columns) over the (m, k)
    activations at a, rows lda elements apart; cached by (address, m, k, lda, box): decode steps and
    graph replays reuse their activation buffers."""
    slot = (a.data_ptr(), m, k, lda, block_m)
    tensor_map = _tensor_maps.get(slot)
    if tensor_map is None:
        if len(_tensor_maps) >= MAX_PLANS:
            _tensor_maps.clear()
        row_stride = lda if m > 1 else k  # one row: any stride (ops.gemm checks it only for m > 1)
        tensor_map = _launcher.encode_tensor_map_2d(a.data_ptr(), m, k, 2 * row_stride, block_m, 64)
        _tensor_maps[slot] = tensor_map
    return tensor_map


class LaunchPlan:
    """What one GEMM launch needs that does not change from call to call: for one (spec, device,
    stream, M, N, K, group) the kernel, its grid, split-K factor, cluster shape and counters.
    Built by ``launch_plan`` (which raises every error a bad tile or split count deserves), so
    ``launch`` itself only packs pointers: no check it does could fail for a valid plan."""

    __slots__ = ("key", "kernel", "m", "n", "k", "group_size", "splits", "clustered", "grid", "block",
                 "cluster", "device", "stream", "workspace_shape", "counters", "counters_ptr", "dp_ctas",
                 "stream_k_ctas", "planned")

    def __init__(self, key: KernelKey, kernel, m: int, n: int, k: int, group_size: int, splits: int,
                 clustered: bool, device: torch.device, stream: int, dp_ctas: int | None = None,
                 stream_k_ctas: int = 0):
        """dp_ctas: for the TMA body (MmaKind.WGMMA_WS), the CTAs that take a whole tile each; the
        tiles after them are split into `splits` K slices (schedule/tail_split_scheduler.cuh).
        None for the other bodies, which split every tile. stream_k_ctas: for the TMA body, the
        persistent CTAs of its stream-K schedule (schedule/stream_k_scheduler.cuh; all resident at
        once, at most tiles x K tiles), or 0 for the tail split."""
        self.key, self.kernel = key, kernel
        self.m, self.n, self.k, self.group_size = m, n, k, group_size
        self.splits, self.clustered, self.dp_ctas = splits, clustered, dp_ctas
        self.stream_k_ctas = stream_k_ctas
        tile = key.tile
        tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
        if stream_k_ctas:
            self.grid = (stream_k_ctas, 1, 1)
            through_workspace = True
            # one fp32 tile in fragment order per CTA (epilogue/stream_k_fixup.cuh)
            self.workspace_shape = (stream_k_ctas, tile.block_m * tile.block_n)
            params_bytes = _TMA_PARAMS_BYTES
        elif dp_ctas is None:
            self.grid = (tiles, splits, 1)
            through_workspace = splits > 1 and not clustered
            self.workspace_shape = (splits, m, n) if through_workspace else None
            params_bytes = _PARAMS.size
        else:
            self.grid = (dp_ctas + (tiles - dp_ctas) * splits, 1, 1)
            through_workspace = splits > 1
            # fragment-ordered partial tiles (epilogue/fragment_split_k.cuh)
            self.workspace_shape = ((tiles - dp_ctas) * splits, tile.block_m * tile.block_n) if through_workspace else None
            params_bytes = _TMA_PARAMS_BYTES
        self.block = (kernel.threads, 1, 1)
        self.cluster = (1, splits, 1) if clustered else (1, 1, 1)
        self.device, self.stream = device, stream
        self.counters = _split_k_counters(device, stream) if through_workspace else None
        self.counters_ptr = 0 if self.counters is None else self.counters.data_ptr()
        if params_bytes != kernel.params_bytes:
            raise ValueError(
                f"kernel {kernel.name}: params are {params_bytes} bytes but the kernel takes {kernel.params_bytes}; "
                "the Python Params layout differs from the C++ one (kernel/params.cuh)"
            )
        self.planned = _launcher.planned_launch(
            kernel.kernel, self.grid, self.block, kernel.smem_bytes, kernel.device, kernel.programmatic_launch,
            self.cluster, _params_template(self), params_abi.POINTER_OFFSETS, params_abi.LDA_OFFSET,
            params_abi.LDO_OFFSET, params_abi.GLOBAL_SCALE_OFFSET, -1 if dp_ctas is None else params_abi.TMA_MAP_OFFSET,
        )

    def launch(self, a: torch.Tensor, lda: int, w: torch.Tensor, w_scale: torch.Tensor,
               w_zero_point: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor, ldo: int,
               global_scale: float) -> None:
        """out[:M] = a[:M] @ dequant(w)^T (+ bias) on the plan's stream. `a`'s rows are `lda` elements
        apart, `out`'s `ldo`; the caller has checked shapes, dtypes, devices and alignment."""
        shape = self.workspace_shape
        workspace = None if shape is None else torch.empty(shape, dtype=torch.float32, device=self.device)
        tensor_map = (None if self.dp_ctas is None
                      else _activation_tensor_map(a, lda, self.m, self.k, self.key.tile.block_m))
        try:
            self.planned.launch(
                self.stream, a.data_ptr(), w.data_ptr(), w_scale.data_ptr(),
                0 if w_zero_point is None else w_zero_point.data_ptr(), 0 if bias is None else bias.data_ptr(),
                out.data_ptr(), 0 if workspace is None else workspace.data_ptr(), lda, ldo, global_scale, tensor_map,
            )
        except Exception as error:
            error.add_note(f"launching kernel {self.kernel.name} on device {self.kernel.device}")
            raise


def _resident_ctas(loaded, tile: TileConfig, info: DeviceInfo) -> int:
    """CTAs of `loaded` an SM of `info`'s device holds at once, by shared memory (dynamic and
    static), warps and the kernel's registers per thread (the driver reports both)."""
    attribute = _launcher.FunctionAttribute
    static_smem = _launcher.kernel_attribute(loaded.kernel, attribute.SHARED_SIZE_BYTES, loaded.device)
    by_smem_and_warps = heuristics.ctas_per_sm(tile, loaded.smem_bytes + static_smem, info.smem_per_sm)
    registers = _launcher.kernel_attribute(loaded.kernel, attribute.NUM_REGS, loaded.device)
    return max(1, min(by_smem_and_warps, heuristics.ctas_per_sm_by_registers(tile.threads, registers)))


_active_clusters: dict[tuple[int, int, int], int] = {}


def _cluster_splits(loaded, tiles: int, splits: int) -> int:
    """The split count for a kernel that sums its K slices in a cluster of that many CTAs: at most
    MAX_CLUSTER_SPLITS (its workspace reduction is 2-3x slower: 2880 x 2880 at M = 1, 9 slices 13.6
    us, 8 in a cluster 4.7), and no more than lets every tile's cluster be resident at once: a
    cluster's CTAs must share a GPC, so fewer clusters fit than slots / splits, and a second wave of
    clusters cost 4096 x 14336 at M = 1 15.9 us in 8 slices against 10.2 in 7 (the driver's
    cuOccupancyMaxActiveClusters; docs/performance/log.md section 25). Where the tiles alone
    overrun the resident CTAs, the split is not there to fill one wave (heuristics.split_k_factor's
    decode wave split) and stands."""
    splits = min(splits, MAX_CLUSTER_SPLITS)
    if splits > 1 and tiles > _max_active_clusters(loaded, 1):
        return splits
    while splits > 1:
        active = _max_active_clusters(loaded, splits)
        if active == 0 or tiles <= active:  # 0: the driver cannot say
            break
        splits -= 1
    return splits


def _max_active_clusters(loaded, size: int) -> int:
    """Clusters of `size` CTAs of `loaded` resident at once (0: the driver cannot say); cached."""
    key = (loaded.kernel, loaded.device, size)
    active = _active_clusters.get(key)
    if active is None:
        active = _launcher.max_active_clusters(loaded.kernel, (loaded.threads, 1, 1), loaded.smem_bytes,
                                               (1, size, 1), loaded.device)
        _active_clusters[key] = active
    return active


_plans: dict[tuple, LaunchPlan] = {}
# Plans kept at once (one per distinct M, stream and layer shape); past it the cache starts over.
MAX_PLANS = 4096


def launch_plan(spec: GemmSpec, device_index: int, stream: int, m: int, n: int, k: int, group_size: int,
                tile: TileConfig | None = None, splits: int | None = None,
                kernel: tuple[KernelKey, object] | None = None,
                cluster_reduction: bool | None = None, stream_k: int | None = None) -> LaunchPlan:
    """The LaunchPlan of this problem (see launch_gemm for the arguments); cached unless `kernel`
    is given. Raises ValueError for a tile that does not fit K and the group, a bad `splits` or
    `stream_k`, or a `cluster_reduction=True` the kernel cannot honour."""
    cache_key = None
    if kernel is None:
        cache_key = (spec, device_index, stream, m, n, k, group_size, tile, splits, cluster_reduction, stream_k)
        plan = _plans.get(cache_key)
        if plan is not None:
            return plan
    key, loaded = kernel if kernel is not None else obtain(spec, device_index, m, tile, k, group_size, n=n)
    tile = key.tile
    if not heuristics.tile_fits(tile, k, group_size):
        raise ValueError(
            f"tile {tile.label} stages {tile.block_k} of K at a time: it needs K % {tile.block_k} == 0 and a group "
            f"size that divides {tile.block_k} or is a multiple of it (K={k}, group={group_size}); use "
            f"{heuristics.narrow_twin(tile).label}"
        )
    info = device_info(device_index)
    tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
    dp_ctas = None
    stream_k_ctas = 0
    if stream_k and (tile.mma is not MmaKind.WGMMA_WS or splits is not None):
        raise ValueError(
            f"stream_k={stream_k} asks for the stream-K schedule, which only the wgmma-ws body has and which "
            f"splits K itself (tile {tile.label}, splits={splits}); pass stream_k=None or 0, or splits=None"
        )
    if tile.mma is MmaKind.WGMMA_WS and splits is None:
        k_tiles = k // tile.block_k
        capacity = info.num_sms * _resident_ctas(loaded, tile, info)
        slots = info.num_sms * max(1, min(capacity // info.num_sms, heuristics.split_ctas_per_sm(key.arch, m, tile)))
        dp_ctas, splits = heuristics.tail_split_schedule(
            tiles=tiles, k_tiles=k_tiles, slots=slots, max_tiles=SPLIT_K_COUNTERS)
        if stream_k is None:
            min_range = heuristics.stream_k_min_range_k_tiles(tile)
            stream_k_ctas = heuristics.stream_k_ctas(tiles=tiles, k_tiles=k_tiles, slots=slots,
                                                     max_tiles=SPLIT_K_COUNTERS,
                                                     fixup_k_tiles=heuristics.stream_k_fixup_k_tiles(tile),
                                                     min_range_k_tiles=min_range)
            if heuristics.partial_wave_stream_k(two_warpgroups=tile.warps_n == 8, m=m, tiles=tiles, k=k,
                                                slots=slots, max_tiles=SPLIT_K_COUNTERS):
                stream_k_ctas = slots
            elif heuristics.short_stream_k_ranges(tiles=tiles, k_tiles=k_tiles, slots=slots,
                                                  min_range_k_tiles=min_range):
                splits = heuristics.short_range_tail_splits(tiles=tiles, k_tiles=k_tiles, num_sms=info.num_sms)
                dp_ctas = 0 if splits > 1 else tiles
        elif stream_k:
            most = min(tiles * k_tiles, capacity)
            if not 1 <= stream_k <= most or tiles > SPLIT_K_COUNTERS:
                raise ValueError(
                    f"stream_k={stream_k} persistent CTAs: must be in [1, {most}] (at most the problem's "
                    f"{tiles} tiles x {k_tiles} K tiles, and at most the {capacity} CTAs of tile {tile.label} "
                    f"resident at once on this device, or the fix-up could wait for a CTA never scheduled), "
                    f"with at most {SPLIT_K_COUNTERS} tiles"
                )
            stream_k_ctas = stream_k
    elif tile.mma is MmaKind.WGMMA_WS:  # a forced split count: every tile split (tests, tuning)
        dp_ctas = 0 if splits > 1 else tiles
    if not tile.body.splits_k:
        if splits not in (None, 1):
            raise ValueError(f"splits={splits}: tile {tile.label} ({tile.mma.value} body) sums all of K in one CTA; "
                             "pass splits=None or 1")
        splits = 1
    if splits is None:
        resident = heuristics.ctas_per_sm(tile, loaded.smem_bytes, info.smem_per_sm)
        splits = heuristics.split_k_factor(
            m=m, n=n, k=k, tile=tile, num_sms=info.num_sms, max_tiles=SPLIT_K_COUNTERS, ctas_per_sm=resident,
            target_ctas_per_sm=heuristics.split_ctas_per_sm(key.arch, m, tile),
        )
        if key.reduces_splits_in_cluster and loaded.cluster_launch and cluster_reduction is not False:
            splits = _cluster_splits(loaded, tiles, splits)
    elif not 1 <= splits <= k // tile.block_k or (splits > 1 and tiles - (dp_ctas or 0) > SPLIT_K_COUNTERS):
        # (the split tiles take a counter each: every tile, or the TMA body's tail after dp_ctas whole ones)
        raise ValueError(f"splits={splits} must be in [1, K / {tile.block_k}] with at most {SPLIT_K_COUNTERS} tiles")
    can_cluster = key.reduces_splits_in_cluster and loaded.cluster_launch and 2 <= splits <= MAX_CLUSTER_SPLITS
    if cluster_reduction and not can_cluster:
        raise ValueError(
            f"cluster_reduction=True but kernel {key.name} with splits={splits} cannot sum its K slices in a "
            f"cluster (that needs KernelKey.reduces_splits_in_cluster, an sm_90+ device and 2 <= splits <= "
            f"{MAX_CLUSTER_SPLITS})"
        )
    clustered = can_cluster and cluster_reduction is not False
    plan = LaunchPlan(key, loaded, m, n, k, group_size, splits, clustered, torch.device("cuda", device_index), stream,
                      dp_ctas=dp_ctas, stream_k_ctas=stream_k_ctas)
    if cache_key is not None:
        with _lock:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[cache_key] = plan
    return plan


def launch_gemm(a: torch.Tensor, packed, bias: torch.Tensor | None, spec: GemmSpec,
                tile: TileConfig | None = None, out: torch.Tensor | None = None,
                splits: int | None = None, kernel: tuple[KernelKey, object] | None = None,
                cluster_reduction: bool | None = None, stream_k: int | None = None) -> torch.Tensor:
    """out = a @ dequant(packed)^T (+ bias) on a's device. `a` is (M, K) with unit column stride;
    `out`, if given, is a contiguous (M, N) tensor of a's dtype (tests pass a NaN-filled one).
    `kernel`, if given, is the (KernelKey, LoadedKernel) to launch instead of the one ``obtain``
    picks (tests compare two builds of one key through this). `cluster_reduction`: whether the
    split-K slices are summed inside a thread-block cluster (KernelKey.reduces_splits_in_cluster)
    instead of through the global workspace; None takes it wherever the kernel, the device and
    the split count (2 to 8, the portable cluster sizes) allow it. Both give the same bits.
    `stream_k` (wgmma-ws tiles only): the persistent CTAs of the stream-K schedule, 0 for the
    tail split, None for the heuristic's choice (heuristics.stream_k_ctas)."""
    m, k = a.shape
    n = packed.n
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0:
        return out
    device_index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    plan = launch_plan(spec, device_index, current_stream(device_index), m, n, k, packed.group_size, tile=tile,
                       splits=splits, kernel=kernel, cluster_reduction=cluster_reduction, stream_k=stream_k)
    plan.launch(a, a.stride(0), packed.w, packed.w_scale, packed.w_zero_point, bias, out, out.stride(0),
                packed.global_scale)
    return out
