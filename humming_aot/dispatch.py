"""Select -> obtain -> launch for one GEMM on a CUDA device (the run-time path behind ops.gemm).

select:  heuristics' tile for (arch, M) -> KernelKey
obtain:  in-memory cache -> the installed catalog (manifest + sha256) -> JIT disk cache -> NVRTC
         compile, or (HUMMING_AOT_JIT=0) an error that names the missing key and the
         `humming-aot build` command that adds it (humming_aot.obtain)
launch:  one GemmParams struct by value, on torch's current stream (CUDA-graph capturable)
"""
from __future__ import annotations

import dataclasses
import functools
import struct
import threading

import torch

from humming_aot import _launcher, heuristics
from humming_aot import obtain as _obtain
from humming_aot.obtain import KernelNotAvailableError  # noqa: F401  (raised from here, part of the API)
from humming_aot.spec import GemmSpec, KernelKey, MmaKind, TileConfig

# GemmParams (csrc/include/humming_aot/kernel/params.cuh): 8 pointers, lda, ldo, 5 ints, 1 float.
_PARAMS = struct.Struct("<8Q2q5if")
# TmaGemmParams (same header): GemmParams, zero padding to byte 128, the activation tensor map.
_TMA_PADDING = bytes(128 - _PARAMS.size)
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


def obtain(spec: GemmSpec, device_index: int, m: int, tile: TileConfig | None = None,
           k: int | None = None, group: int | None = None):
    """(KernelKey, LoadedKernel) for this problem; cached per (spec, device, table tile). K and the
    group size, when given, steer the table away from a tile they do not fit (heuristics.tile_fits).

    Which key and where its image comes from (catalog, JIT cache, NVRTC) is ``humming_aot.obtain``'s
    job; a first call that compiles blocks other first calls of this process for its duration.
    """
    info = device_info(device_index)
    table_tile = tile or heuristics.select_tile(info.arches[0], m, k, group, spec.w_bits)
    cache_key = (spec, device_index, table_tile, tile is not None)
    hit = _selected.get(cache_key)
    if hit is not None:
        return hit
    with _lock:
        hit = _selected.get(cache_key)
        if hit is None:
            key = _obtain.select_key(spec, info, m, tile, k, group)
            hit = (key, _obtain.load(key, info))
            _selected[cache_key] = hit
        return hit


def _split_k_counters(device: torch.device, stream: int) -> torch.Tensor:
    slot = (device.index, stream)
    counters = _counters.get(slot)
    if counters is None:
        counters = torch.zeros(SPLIT_K_COUNTERS, dtype=torch.int32, device=device)
        _counters[slot] = counters
    return counters


def _workspace_shape(tile: TileConfig, splits: int, m: int, n: int) -> tuple[int, int, int]:
    """The split-K workspace: (splits, m, n) fp32 in output order; the TMA body keeps whole padded
    tiles in fragment order (epilogue/fragment_split_k.cuh), (splits, M and N rounded up to tiles)."""
    if tile.mma is MmaKind.WGMMA_WS:
        return splits, -(-m // tile.block_m) * tile.block_m, -(-n // tile.block_n) * tile.block_n
    return splits, m, n


_tensor_maps: dict[tuple[int, int, int, int, int], bytes] = {}


def _activation_tensor_map(a: torch.Tensor, block_m: int) -> bytes:
    """The TMA map of the TMA body's activation boxes (block_m rows x 64 columns) over `a`, cached
    by (address, shape, row stride, box): decode steps reuse their activation buffers."""
    m, k = a.shape
    slot = (a.data_ptr(), m, k, a.stride(0), block_m)
    tensor_map = _tensor_maps.get(slot)
    if tensor_map is None:
        if len(_tensor_maps) > 4096:
            _tensor_maps.clear()
        row_stride = a.stride(0) if m > 1 else k  # one row: any stride (ops.gemm checks it only for m > 1)
        tensor_map = _launcher.encode_tensor_map_2d(a.data_ptr(), m, k, 2 * row_stride, block_m, 64)
        _tensor_maps[slot] = tensor_map
    return tensor_map


# Clusters of up to 8 CTAs are portable (larger ones need an opt-in per kernel, and fit fewer GPCs).
MAX_CLUSTER_SPLITS = 8


def launch_gemm(a: torch.Tensor, packed, bias: torch.Tensor | None, spec: GemmSpec,
                tile: TileConfig | None = None, out: torch.Tensor | None = None,
                splits: int | None = None, kernel: tuple[KernelKey, object] | None = None,
                cluster_reduction: bool | None = None) -> torch.Tensor:
    """out = a @ dequant(packed)^T (+ bias) on a's device. `a` is (M, K) with unit column stride;
    `out`, if given, is a contiguous (M, N) tensor of a's dtype (tests pass a NaN-filled one).
    `kernel`, if given, is the (KernelKey, LoadedKernel) to launch instead of the one ``obtain``
    picks (tests compare two builds of one key through this). `cluster_reduction`: whether the
    split-K slices are summed inside a thread-block cluster (KernelKey.reduces_splits_in_cluster)
    instead of through the global workspace; None takes it wherever the kernel, the device and
    the split count (2 to 8, the portable cluster sizes) allow it. Both give the same bits."""
    m, k = a.shape
    n = packed.n
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0:
        return out
    device_index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    key, kernel = kernel if kernel is not None else obtain(spec, device_index, m, tile, k, packed.group_size)
    tile = key.tile
    if not heuristics.tile_fits(tile, k, packed.group_size):
        raise ValueError(
            f"tile {tile.label} stages {tile.block_k} of K at a time: it needs K % {tile.block_k} == 0 and a group "
            f"size that divides {tile.block_k} or is a multiple of it (K={k}, group={packed.group_size}); use "
            f"{heuristics.narrow_twin(tile).label}"
        )
    info = device_info(device_index)
    if splits is None:
        resident = heuristics.ctas_per_sm(tile, kernel.smem_bytes, info.smem_per_sm)
        splits = heuristics.split_k_factor(
            m=m, n=n, k=k, tile=tile, num_sms=info.num_sms, max_tiles=SPLIT_K_COUNTERS, ctas_per_sm=resident,
            target_ctas_per_sm=heuristics.split_ctas_per_sm(key.arch, m, tile),
        )
    elif not 1 <= splits <= k // tile.block_k or (splits > 1 and -(-m // tile.block_m) * -(-n // tile.block_n) > SPLIT_K_COUNTERS):
        raise ValueError(f"splits={splits} must be in [1, K / {tile.block_k}] with at most {SPLIT_K_COUNTERS} tiles")
    can_cluster = key.reduces_splits_in_cluster and kernel.cluster_launch and 2 <= splits <= MAX_CLUSTER_SPLITS
    if cluster_reduction and not can_cluster:
        raise ValueError(
            f"cluster_reduction=True but kernel {key.name} with splits={splits} cannot sum its K slices in a "
            f"cluster (that needs KernelKey.reduces_splits_in_cluster, an sm_90+ device and 2 <= splits <= "
            f"{MAX_CLUSTER_SPLITS})"
        )
    clustered = can_cluster and cluster_reduction is not False
    stream = torch.cuda.current_stream(a.device).cuda_stream
    workspace = counters = None
    if splits > 1 and not clustered:
        workspace = torch.empty(_workspace_shape(tile, splits, m, n), dtype=torch.float32, device=a.device)
        counters = _split_k_counters(a.device, stream)
    params = _PARAMS.pack(
        a.data_ptr(),
        packed.w.data_ptr(),
        packed.w_scale.data_ptr(),
        0 if packed.w_zero_point is None else packed.w_zero_point.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        out.data_ptr(),
        0 if workspace is None else workspace.data_ptr(),
        0 if counters is None else counters.data_ptr(),
        a.stride(0),
        out.stride(0),
        m, n, k, packed.group_size, splits, packed.global_scale,
    )
    if tile.mma is MmaKind.WGMMA_WS:
        params += _TMA_PADDING + _activation_tensor_map(a, tile.block_m)
    m_tiles = -(-m // tile.block_m)
    n_tiles = -(-n // tile.block_n)
    kernel.launch((m_tiles * n_tiles, splits, 1), stream, params, cluster=(1, splits, 1) if clustered else (1, 1, 1))
    return out
