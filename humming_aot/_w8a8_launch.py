"""The GPU side of humming_aot.w8a8.gemm and w4a8.gemm: checks, the wgmma-ss or wgmma-w4a8 kernel (catalog or JIT), its
schedule (the TMA body's tail split or stream-K, heuristics.tail_split_schedule /
stream_k_ctas), the two tensor maps and ScaledTmaGemmParams, one launch on torch's current stream
(CUDA-graph capturable once the kernel is loaded). The kernel and schedule of a problem are
worked out once (its driver queries included) and kept, as dispatch.LaunchPlan keeps the 16-bit
GEMM's; the tensor maps are cached by address."""
from __future__ import annotations

import torch

from humming_aot import dispatch, heuristics, params_abi, w4a8
from humming_aot import obtain as _obtain
from humming_aot.bodies.mma_ss import CODE_FIRST_ARCH as MMA_SS_FIRST_ARCH
from humming_aot.bodies.wgmma_ss import separate_staging, staged_scale_bytes, stages_token_scales
from humming_aot.bodies.wgmma_w4a8 import entry_bytes as w4a8_entry_bytes
from humming_aot.bodies.wgmma_w4a8 import separate_staging as w4a8_separate_staging
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import MmaKind, TileConfig, parse_arch
from humming_aot.w4a8 import PackedW4A8Weight
from humming_aot.w8a8 import (
    INT4,
    K_ALIGN,
    SCALED_PARAMS_BYTES,
    _pack_params,
    kernel_key,
    pack_int4,
    select_sync_tile,
    select_tile,
)

ARCH = "sm90a"
# (device, out dtype, weight element, blocks, tile argument, m, n, k, stream_k, persistent) -> _Plan
_plans: dict[tuple, "_Plan"] = {}
# The longest K (in K tiles of 128) whose whole tiles a wave of CTAs walks by default: longer ones
# (K = 14336) measured 4-8 % slower walked than one CTA per tile from 4096 tokens on, shorter ones
# 5-14 % faster (docs/performance/log.md section 34).
WALK_K_TILES = 64
# The portable bodies split K until this many of their CTAs per SM have work (at most what fits:
# heuristics.split_k_factor).
SYNC_SPLIT_CTAS_PER_SM = 2
# the portable mma.sync bodies (W8A8, W4A8): cp.async, no tensor maps, one CTA per tile and K slice
PORTABLE = (MmaKind.MMA_SS, MmaKind.MMA_W4A8)


def _codes_map(codes: torch.Tensor, rows: int, k: int, row_bytes: int, box_rows: int) -> bytes:
    """The TMA map over (rows, k) one-byte codes, rows row_bytes apart, read as 16-bit pairs in
    boxes of (box_rows, 128 codes): dispatch's cached activation map (16-bit elements) over them."""
    return dispatch._activation_tensor_map(codes, row_bytes // 2, rows, k // 2, box_rows)


def _schedule(loaded, tile: TileConfig, info, m: int, n: int, k_tiles: int, stream_k: int | None,
              persistent: bool | None, separate_staging: bool):
    """(dp_ctas, splits, stream_k_ctas, persistent_ctas): the tail split as dispatch.launch_plan
    chooses it for the wgmma-ws body, and under it the CTAs that walk its dp_ctas whole tiles
    (schedule/work_units.cuh): at most the resident ones when `persistent` (None: where the tile's
    staging tile is apart from its ring, so that a CTA loads its next tile while it stores one, and
    K is at most 64 tiles), else dp_ctas, one tile each. Stream-K (`stream_k` None): below one wave
    the wgmma-ws body's rule for the one-warpgroup tiles (up to 32 tokens; with two consumer
    warpgroups the tail split measured as fast or faster there, docs/performance/log.md section
    34), and from one wave on heuristics.partial_wave_stream_k's."""
    tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
    capacity = info.num_sms * dispatch._resident_ctas(loaded, tile, info)
    dp_ctas, splits = heuristics.tail_split_schedule(tiles=tiles, k_tiles=k_tiles, slots=capacity,
                                                     max_tiles=dispatch.SPLIT_K_COUNTERS)
    walk = separate_staging and k_tiles <= WALK_K_TILES if persistent is None else persistent
    walkers = min(dp_ctas, capacity) if walk else dp_ctas
    if stream_k is None:
        stream_k_ctas = 0 if tile.warps_n == 8 else heuristics.stream_k_ctas(
            tiles=tiles, k_tiles=k_tiles, slots=capacity, max_tiles=dispatch.SPLIT_K_COUNTERS)
        if persistent is None and heuristics.partial_wave_stream_k(
                two_warpgroups=tile.warps_n == 8, m=m, tiles=tiles, k=128 * k_tiles, slots=capacity,
                max_tiles=dispatch.SPLIT_K_COUNTERS):
            stream_k_ctas = capacity  # (a persistent= argument asks for the tail split's walk)
        return dp_ctas, splits, stream_k_ctas, walkers
    if stream_k:
        most = min(tiles * k_tiles, capacity)
        if not 1 <= stream_k <= most or tiles > dispatch.SPLIT_K_COUNTERS:
            raise ValueError(
                f"stream_k={stream_k} persistent CTAs: must be in [1, {most}] (at most the problem's {tiles} tiles x "
                f"{k_tiles} K tiles, and at most the {capacity} CTAs of tile {tile.label} resident at once), with at "
                f"most {dispatch.SPLIT_K_COUNTERS} tiles"
            )
    return dp_ctas, splits, stream_k, walkers


class _Plan:
    """What a W8A8 launch of one problem (device, out dtype, scaling, tile argument, M, N, K,
    schedule knobs) needs that no call changes: the kernel, its schedule and grid, the workspace
    shape, whether it stages transposed token scales, and the schedule's bytes."""

    __slots__ = ("tile", "loaded", "splits", "grid", "workspace_shape", "stages_scales", "schedule")

    def __init__(self, tile: TileConfig, key, loaded, info, m: int, n: int, k_tiles: int, stream_k, persistent,
                 a_k: int = 0):
        if loaded.params_bytes != SCALED_PARAMS_BYTES:
            raise ValueError(f"kernel {loaded.name}: takes {loaded.params_bytes} bytes of params, not "
                             f"{SCALED_PARAMS_BYTES}; the Python ScaledTmaGemmParams layout differs from "
                             "kernel/params.cuh")
        self.tile, self.loaded, self.stages_scales = tile, loaded, False
        if key.tile.mma in PORTABLE:  # one CTA per tile and K slice (gridDim.y), no schedule
            if stream_k or persistent:
                raise ValueError(f"tile {tile.label}: the {tile.mma.value} body has no stream-K or persistent schedule "
                                 "(it splits K by slices of every tile); leave stream_k and persistent None")
            tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
            self.splits = heuristics.split_k_factor(
                m=m, n=n, k=128 * k_tiles, tile=tile, num_sms=info.num_sms, max_tiles=dispatch.SPLIT_K_COUNTERS,
                ctas_per_sm=dispatch._resident_ctas(loaded, tile, info), target_ctas_per_sm=SYNC_SPLIT_CTAS_PER_SM)
            self.grid = (tiles, self.splits, 1)
            self.workspace_shape = (self.splits, m, n) if self.splits > 1 else None
            # (mma-w4a8 reads the activations' own K where the TMA bodies read dp_ctas)
            self.schedule = params_abi.TMA_SCHEDULE.pack(a_k if key.tile.mma is MmaKind.MMA_W4A8 else 0, self.splits, 0)
            return
        separate = (w4a8_separate_staging(key.tile, w4a8_entry_bytes(key.spec.w_dtype))
                    if key.tile.mma is MmaKind.WGMMA_W4A8
                    else separate_staging(key.tile, staged_scale_bytes(key)))
        dp_ctas, splits, stream_k_ctas, walkers = _schedule(loaded, tile, info, m, n, k_tiles, stream_k, persistent,
                                                            separate)
        tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
        if stream_k_ctas:
            self.grid = (stream_k_ctas, 1, 1)
            self.workspace_shape = (stream_k_ctas, tile.block_m * tile.block_n)
        else:
            self.grid = (walkers + (tiles - dp_ctas) * splits, 1, 1)
            self.workspace_shape = ((tiles - dp_ctas) * splits, tile.block_m * tile.block_n) if splits > 1 else None
        self.tile, self.loaded, self.splits = tile, loaded, splits
        self.stages_scales = stages_token_scales(key)
        self.schedule = params_abi.TMA_SCHEDULE.pack(dp_ctas, splits, 1 if stream_k_ctas else 0)


def _kernel(info, out_dtype: torch.dtype, packed, tile, m: int, n: int, act_element: str):
    """(tile, kernel key) of a launch: for tile None the module's table, the sm90a wgmma body's
    where the GPU has sm90a and that body takes the pairing (W8A8; W4A8 with float8 activations),
    else the portable mma.sync body's; else the given tile (a label or a TileConfig), refused
    unless a body of the pairing takes it. The key's arch: sm90a for the wgmma bodies, for the
    portable ones _portable_key's."""
    w4 = isinstance(packed, PackedW4A8Weight)
    label = (("MXFP4 W4A8" if packed.element == w4a8.MXFP4_ELEMENT else "W4A8") if w4
             else "W4A4" if packed.element == INT4 else "W8A8")
    fast, portable = (MmaKind.WGMMA_W4A8, MmaKind.MMA_W4A8) if w4 else (MmaKind.WGMMA_SS, MmaKind.MMA_SS)
    # (wgmma-w4a8: float8 activations only; wgmma-ss: no int4, which has no wgmma)
    fast_takes = act_element == w4a8.ACT_ELEMENT if w4 else packed.element != INT4
    if tile is None:
        if ARCH in info.arches and fast_takes:
            tile = (w4a8.select_tile(m, n=n, num_sms=info.num_sms, weight_element=packed.element) if w4
                    else select_tile(m, packed.blocks, n=n, num_sms=info.num_sms, element=packed.element,
                                    k=packed.k))
        else:
            tile = w4a8.select_sync_tile(m) if w4 else select_sync_tile(m)
    if isinstance(tile, str):
        tile = parse_tile_field(tile)
    if tile.mma is fast:
        if not fast_takes:
            if not w4:
                raise ValueError(f"tile {tile.label}: int4 x int4 (W4A4) runs on mma-ss tiles only (Hopper's wgmma has "
                                 "no int4); leave tile None for the table's")
            raise ValueError(f"tile {tile.label}: the wgmma-w4a8 kernels take float8e4m3 activations; int8 ones run on "
                             "mma-w4a8 tiles (leave tile None for the table's)")
        _require_sm90a(info, label, portable)
        if w4:
            return tile, w4a8.kernel_key(ARCH, out_dtype, tile, weight_element=packed.element)
        return tile, kernel_key(ARCH, out_dtype, tile, packed.blocks, packed.element)  # (raises for a tile the scaling cannot take)
    if tile.mma is not portable:
        if not w4 and not fast_takes:
            raise ValueError(f"tile {tile.label}: the W4A4 kernels run {portable.value} tiles only")
        raise ValueError(f"tile {tile.label}: the {label} kernels run {fast.value} tiles (sm90a) or {portable.value} tiles")
    if w4:
        return tile, _portable_key(info, act_element, label, lambda arch: w4a8.kernel_key(arch, out_dtype, tile,
                                                                                         act_element, packed.element))
    return tile, _portable_key(info, act_element, label,
                               lambda arch: kernel_key(arch, out_dtype, tile, packed.blocks, packed.element))


def _portable_key(info, element: str, label: str, make_key):
    """The key of a portable (mma.sync) W8A8 / W4A8 kernel for this GPU: of the GPU's serving
    arches that have mma.sync on the element's codes, the first whose key the installed catalog
    holds, else the first (the JIT builds it)."""
    from humming_aot.catalog import installed_catalog

    first = MMA_SS_FIRST_ARCH[element]
    arches = [arch for arch in info.arches if parse_arch(arch)[0] >= first]
    if not arches:
        hint = {("float8e4m3", "W8A8"): "int8 W8A8 runs from sm80 (A100) on; or keep the weight and use 16-bit "
                                        "activations (W8A16)",
                ("float8e4m3", "W4A8"): "the same weight with int8 activations (quantize them with 'int8:token') "
                                        "runs from sm80 on; or use 16-bit activations (W4A16)",
                ("float8e4m3", "MXFP4 W4A8"): "MXFP4 weights take float8 activations only: on this GPU keep 16-bit "
                                              "activations (W4A16 MXFP4 runs from sm80)"}
        raise RuntimeError(
            f"{element} {label} needs mma.sync on {element} codes: sm{first} or later; {info.name} is sm_"
            f"{info.capability[0]}{info.capability[1]}. "
            + hint.get((element, label), "Use 16-bit activations on this GPU")
        )
    keys = [make_key(arch) for arch in arches]
    catalog = installed_catalog()
    for key in keys:
        if catalog is not None and catalog.lookup(key.name) is not None:
            return key
    return keys[0]


def _require_sm90a(info, label: str, portable: MmaKind) -> None:
    """A wgmma tile named on a GPU without sm90a: say which tiles run there."""
    if ARCH not in info.arches:
        raise RuntimeError(
            f"the {label} wgmma tiles are built for {ARCH} (H100, H200) only; {info.name} is sm_"
            f"{info.capability[0]}{info.capability[1]}: leave tile None (the table runs the portable "
            f"{portable.value} body here) or name an {portable.value} tile"
        )


def launch(qa, packed, bias, out_dtype: torch.dtype, out: torch.Tensor | None, tile, stream_k: int | None,
           persistent: bool | None = None):
    k, n = packed.k, packed.n
    codes = qa.codes.reshape(-1, k)
    int4 = not isinstance(packed, PackedW4A8Weight) and packed.element == INT4
    if int4:  # W4A4: the kernel reads two codes a byte (its K in bytes from here on)
        codes, k = pack_int4(codes), k // 2
    m = codes.shape[0]
    device = codes.device
    row_stride = codes.stride(0)
    if codes.stride(-1) != 1 or (m > 1 and (row_stride % K_ALIGN or row_stride < k)) or codes.data_ptr() % 16:
        raise ValueError(f"the activation codes' rows must be contiguous, 16-byte aligned and a multiple of {K_ALIGN} "
                         f"bytes apart, at least K (strides {tuple(codes.stride())}); pass qa.codes.contiguous()")
    index = device.index if device.index is not None else torch.cuda.current_device()
    info = dispatch.device_info(index)
    if out is not None and (out.shape != (m, n) or out.dtype != out_dtype or not out.is_contiguous()
                            or out.device != device):
        raise ValueError(f"out must be a contiguous ({m}, {n}) {out_dtype} tensor on {device}")
    k_tiles = -(-k // 128)
    w4 = isinstance(packed, PackedW4A8Weight)
    blocks = not w4 and packed.blocks
    # (the elements: W8A8's float8e4m3 or int8 codes, or W4A8's int4, uint4 or MXFP4 ones with the activations')
    element = f"{packed.element}x{qa.element}" if w4 else packed.element
    plan_key = (index, out_dtype, element, blocks, tile, m, n, k, stream_k, persistent)
    plan = _plans.get(plan_key)
    if plan is None:
        tile_config, key = _kernel(info, out_dtype, packed, tile, m, n, qa.element)
        if m == 0:
            return out if out is not None else torch.empty((0, n), dtype=out_dtype, device=device)
        # every check a caller can fail is above or in the plan; the GPU work starts after
        plan = _Plan(tile_config, key, _obtain.load(key, info), info, m, n, k_tiles, stream_k, persistent, k)
        if len(_plans) >= dispatch.MAX_PLANS:
            _plans.clear()
        _plans[plan_key] = plan
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    if bias is not None and packed.n_valid is not None:  # the kernel reads a bias for every padded column
        bias = torch.nn.functional.pad(bias, (0, n - packed.n_valid))
    scale_stride = 0
    if plan.stages_scales:
        # (m, k / 128) transposed for the kernel's staged copies: (k / 128) rows of m rounded up to
        # 4 (the columns past m are never read into a stored row)
        scale_stride = -(-m // 4) * 4
        scales = torch.empty((k // 128, scale_stride), dtype=torch.float32, device=device)
        scales[:, :m].copy_(qa.scales.reshape(m, k // 128).t())
    elif blocks:  # (m, k / 128): one per token per K block, rows of k / 128
        scales = qa.scales.reshape(m, k // 128).contiguous()
        if plan.tile.mma is MmaKind.MMA_SS:  # (its rows' stride, which the wgmma-ss body works out itself)
            scale_stride = k // 128
    else:
        scales = qa.scales.reshape(-1)
        scales = (scales.expand(m) if scales.numel() == 1 else scales).contiguous()
    stream = dispatch.current_stream(index)
    workspace = counters = None
    if plan.workspace_shape is not None:
        workspace = torch.empty(plan.workspace_shape, dtype=torch.float32, device=device)
        counters = dispatch._split_k_counters(device, stream)
    tile = plan.tile
    sync = tile.mma in PORTABLE
    # group_size: W4A8's groups (either body); the wgmma-ss body's K tiles of 128; mma-ss: the
    # codes' own K (the weights' row length)
    group_size = packed.group_size if w4 else k if sync else 128 * k_tiles
    gemm_params = params_abi.GEMM_PARAMS.pack(
        codes.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, 0 if bias is None else bias.data_ptr(),
        out.data_ptr(), 0 if workspace is None else workspace.data_ptr(), 0 if counters is None else counters.data_ptr(),
        row_stride, out.stride(0), m, n, 128 * k_tiles, group_size, plan.splits, 1.0)
    if sync:  # (no tensor maps: cp.async reads the codes)
        a_map = w_map = bytes(params_abi.TMA_MAP_BYTES)
    else:
        a_map = _codes_map(codes, m, k, row_stride, tile.block_m)  # (one row: any stride, dispatch's rule)
        # (W4A8: the packed codes come by bulk copy, the weight map is unused)
        w_map = bytes(params_abi.TMA_MAP_BYTES) if w4 else _codes_map(packed.w, n, k, k, tile.block_n)
    params = _pack_params(gemm_params, plan.schedule, a_map, w_map, scales.data_ptr(), scale_stride)
    loaded = plan.loaded
    try:
        loaded.launch(plan.grid, stream, params)
    except Exception as error:
        error.add_note(f"launching kernel {loaded.name} on device {loaded.device}")
        raise
    return out
