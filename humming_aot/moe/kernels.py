"""The MoE GEMMs on their kernels, each one launch whose shapes do not depend on the routing
(CUDA-graph capturable: counts and row experts are read on the device):

- ``gemm_masked_kernel(a, experts, masked_m)``: the grouped masked layout
  (csrc/include/humming_aot/kernel/grouped_masked.cuh), what ``expert_loop.gemm_masked`` defines;
- ``gemm_grouped_kernel(a, experts, row_expert)``: the grouped contiguous layout with every
  expert's rows padded to whole blocks of ``grouped_block_m`` rows
  (csrc/include/humming_aot/kernel/grouped_contiguous.cuh), what ``expert_loop.gemm_grouped``
  defines for such rows;
- ``gemm_grouped_kernel(a, experts, offsets=offsets)``: the grouped contiguous layout with no
  alignment, expert e owning rows offsets[e] to offsets[e + 1], on the masked kernel's walk
  (its offsets form), what ``expert_loop.gemm_grouped`` defines;
- ``moe.indexed.gemm_indexed_kernel(a, experts, routing)``: vLLM fused_moe's indexed layout on the
  offsets form (blocks whose experts rise) or the block-aligned grouped kernel (a gather before
  it, a scatter after).

All are persistent schedules around a dense body (``heuristics.select_masked_tile``: the tile for
the expected rows per expert; the mma.sync bodies, and for the masked schedule and its offsets
form on sm_90a the warp-specialized TMA body from 5 rows per expert, or 1 where K is short), from the installed
catalog or the JIT: at most the resident CTAs, each walking the real tiles in turn, so that the
empty experts and padding blocks of a small batch cost no CTA.
``QuantizedMoE`` runs the offsets form on sm_80+ GPUs (``use_grouped_kernels``: None chooses, a
bool forces).
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import params_abi
from humming_aot.moe import decode_tiles
from humming_aot.moe.packing import PackedExperts
from humming_aot.spec import GemmType, MmaKind, TileConfig

_ELEMENT_BYTES = 2  # activations, scales, zero points, bias and output: 16-bit
MAX_EXPERTS = 65535  # the experts a launch takes (the masked schedule's walk counts them in 32 bits)


def gemm_masked_kernel(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, *,
                       expected_m: int | None = None, bias: torch.Tensor | None = None,
                       out: torch.Tensor | None = None, tile: TileConfig | str | None = None) -> torch.Tensor:
    """out[e, :masked_m[e]] = a[e, :masked_m[e]] @ W[e]^T (+ bias[e]) for every expert e.

    a:          (E, max_m, K) contiguous, the experts' activation dtype, on their CUDA device
    masked_m:   (E,) int32 on the same device: each expert's valid rows, 0 <= count <= max_m (the
                kernel reads them there, so that the call needs no host round trip; a count
                outside that range is the caller's error, not reported: the kernel reads it as the
                nearest bound)
    expected_m: the rows an expert is expected to hold, which picks the tile (default max_m)
    bias:       (E, N) in the activation dtype, or None
    out:        (E, max_m, N) contiguous to write into (rows past each count are left as they
                are); default a new zero tensor, whose zero-fill writes every slab (58 MB, ~20 us on
                an H200, for DeepSeek-V3's down projection at 256 experts of 16 rows): pass an
                output made once where the rows past the counts are not read
    tile:       a forced tile (for tuning and benchmarks; a TileConfig or its label, of a body
                the masked schedule takes: 'mma', 'mma-sw', or 'wgmma-ws' on sm_90a); default the
                table's for expected_m
    """
    _check(a, experts, masked_m, bias, out)
    if experts.padded:
        return _padded(gemm_masked_kernel, a, experts, bias, out, masked_m, expected_m=expected_m, tile=tile)
    e, max_m, _ = a.shape
    if out is None:
        out = torch.zeros(e, max_m, experts.n, dtype=a.dtype, device=a.device)
    if max_m == 0:
        return out
    rows = max_m if expected_m is None else max(1, min(int(expected_m), max_m))
    tile, loaded = _kernel(a, experts, GemmType.MASKED, rows, "gemm_masked_kernel", "gemm_masked", tile)
    grid, params = launch_arguments(a, experts, masked_m, bias, out, tile, _resident(loaded, tile, a.device.index))
    loaded.launch(grid, _stream(a), params + _activation_map(a.view(e * max_m, -1), tile))
    return out


def _grouped_by_offsets(a: torch.Tensor, experts: PackedExperts, offsets: torch.Tensor, *, expected_m: int,
                        bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
                        tile: TileConfig | str | None = None, splits: int | None = None,
                        routed_rows: int | None = None) -> torch.Tensor:
    """gemm_grouped_kernel on rows grouped by prefix offsets: the masked schedule walking the
    experts' rows of the one activation (kernel/grouped_masked.cuh, its offsets form), with no
    alignment and no copy of the rows; K split in slices (wna16_offsets_splits) when the rows' tiles
    leave most CTA slots idle."""
    what = "gemm_grouped_kernel"
    if (not isinstance(offsets, torch.Tensor) or offsets.shape != (experts.experts + 1,)
            or offsets.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"{what}: offsets must be ({experts.experts + 1},) int32 or int64, got {_describe(offsets)}")
    _check_rows(a, experts, bias, out, what)
    if offsets.device != a.device:
        raise ValueError(f"{what}: offsets must be on {a.device} (the kernel reads them there), got "
                         f"{_describe(offsets)}")
    if routed_rows is not None and (type(routed_rows) is not int or not 0 <= routed_rows <= a.shape[0]):
        raise ValueError(f"{what}: routed_rows={routed_rows!r} must be an int in [0, R = {a.shape[0]}]")
    if experts.padded:
        return _padded(_grouped_by_offsets, a, experts, bias, out, offsets, expected_m=expected_m, tile=tile,
                       splits=splits, routed_rows=routed_rows)
    rows = a.shape[0]
    if out is None:
        out = torch.zeros(rows, experts.n, dtype=a.dtype, device=a.device)
    if rows == 0:
        return out
    offsets = offsets.to(torch.int32).contiguous()  # no copy when already int32 and contiguous
    chosen = tile is None and splits is None  # (a forced split is checked against the table's tile)
    tile, loaded = _kernel(a, experts, GemmType.MASKED, max(1, int(expected_m)), what, "gemm_grouped", tile)
    resident = _resident(loaded, tile, a.device.index)
    if chosen:
        routed = rows if routed_rows is None else routed_rows
        tile, loaded, resident = decode_tiles.offsets_depth(a, experts, tile, loaded, resident, routed, what)
    bound = offsets_tile_bound(rows, experts.experts, experts.n, tile)
    k_tiles = experts.k // tile.block_k
    one_slice = tile.mma is MmaKind.WGMMA_WS  # its schedule runs whole tiles
    if splits is None:
        splits = 1 if one_slice else wna16_offsets_splits(bound, k_tiles, resident, experts.k)
    elif (type(splits) is not int or not 1 <= splits <= k_tiles or (splits > 1 and bound > _split_k_counters_size())
          or (one_slice and splits != 1)):
        raise ValueError(f"{what}: splits={splits!r} must be an int in [1, K / {tile.block_k} = {k_tiles}], and 1 "
                         f"when the rows make more than {_split_k_counters_size()} tiles (here up to {bound}) or "
                         f"the tile is a wgmma-ws one")
    splits = nonempty_slices(k_tiles, splits)
    workspace = counters = None
    if splits > 1:
        from humming_aot import dispatch

        workspace = torch.empty(splits * rows * experts.n, dtype=torch.float32, device=a.device)
        counters = dispatch._split_k_counters(a.device, _stream(a))
    grid, params = offsets_launch_arguments(a, experts, offsets, bias, out, tile, resident, splits=splits,
                                            workspace=workspace, counters=counters)
    loaded.launch(grid, _stream(a), params + _activation_map(a, tile))
    return out


def _activation_map(rows: torch.Tensor, tile: TileConfig) -> bytes:
    """What a masked schedule's Params add for its body: for the warp-specialized TMA body
    (kernel/grouped_masked_ws.cuh, MaskedTmaGemmParams) padding to byte 192 and the tensor map of
    every activation row ((R, K) with its row stride, boxes of the tile's rows x 64); nothing for
    the mma.sync bodies."""
    if tile.mma is not MmaKind.WGMMA_WS:
        return b""
    from humming_aot import dispatch

    r, k = rows.shape
    tensor_map = dispatch._activation_tensor_map(rows, rows.stride(0), r, k, tile.block_m)
    return bytes(MASKED_TMA_MAP_OFFSET - params_abi.GEMM_PARAMS.size - params_abi.MASKED_TAIL.size) + tensor_map


# MaskedTmaGemmParams (kernel/params.cuh): MaskedGemmParams (184 bytes), padding, the 128-byte map
MASKED_TMA_MAP_OFFSET = 192
MASKED_TMA_PARAMS_BYTES = 320

def offsets_tile_bound(rows: int, experts: int, n: int, tile: TileConfig) -> int:
    """The most tiles the offsets form's walk can find for R rows (kernel/grouped_masked.cuh,
    ExpertWalk::tile_limit, the same formula): rows summing to at most R in at most min(E, R)
    experts with rows, each with one partial row tile at most, times the N tiles."""
    return (rows // tile.block_m + min(experts, rows)) * -(-n // tile.block_n)


# offsets_splits: each K slice takes at least this many K tiles (its prologue, partial sums and
# the reduction do not shrink with K), and at most this many slices.
MIN_SLICE_K_TILES = 4
MAX_OFFSETS_SPLITS = 8


def offsets_splits(tile_bound: int, k_tiles: int, resident: int, *, share: int = 4,
                   most: int = MAX_OFFSETS_SPLITS) -> int:
    """K slices of the offsets form: 1 unless the rows' tiles (at most tile_bound) fill at most a
    quarter of the resident CTAs (a handful of tokens on long K: DeepSeek-V3 TP8's gate_up at one
    token has 32 tiles of 8 x 128 for 264 slots); then as many as fill the slots, with at least
    MIN_SLICE_K_TILES K tiles each, at most MAX_OFFSETS_SPLITS, and only while the split-K counters
    hold every tile. (share, most: the fraction of the slots the tiles may fill, 1 / share, and
    the most slices; wna16_offsets_splits passes its own.)"""
    if tile_bound * share > resident or tile_bound > _split_k_counters_size():
        return 1
    return max(1, min(resident // max(tile_bound, 1), k_tiles // MIN_SLICE_K_TILES, most))


# wna16_offsets_splits: on a K of at least LONG_K columns (DeepSeek-V3's 7168; not Qwen3-30B's
# 2048), and at least LONG_K_TILES of the tile's K tiles, slices also where the rows' tiles fill
# up to half the slots, and at most WNA16_MAX_SPLITS of them.
LONG_K = 4096
LONG_K_TILES = 16
WNA16_MAX_SPLITS = 4


def wna16_offsets_splits(tile_bound: int, k_tiles: int, resident: int, k: int) -> int:
    """K slices of the 16-bit-activation offsets form (gemm_grouped_kernel) for a K of k columns in
    k_tiles K tiles: offsets_splits' rule, with a K of at least LONG_K columns and LONG_K_TILES K
    tiles slicing also where the rows' tiles fill up to half the resident CTAs, and at most
    WNA16_MAX_SPLITS slices. H100, session 62 (docs/performance/log.md section 67): DeepSeek-V3 TP8's
    gate_up (N 512, K 7168: 28 K tiles of 256 on sm90a's deep 8-row tile, 264 slots) at 1 / 2 / 3 / 4
    tokens (at most 36 / 72 / 108 / 144 tiles) takes 4 / 3 / 2 / 1 slices, 14.6 / 20.1 / 25.0 / 30.0
    us, against 15.5 / 22.3 / 27.0 / 30.0 with offsets_splits' 7 / 1 / 1 / 1; more slices than the
    slots hold take a second wave (2 tokens, 6 slices: 29.3). Qwen3-30B's gate_up (K 2048) keeps
    offsets_splits' choice on every arch. Other arches' tiles on long K follow the same rule
    (not timed); the quantized-activation forms keep offsets_splits until timed with it."""
    if k < LONG_K or k_tiles < LONG_K_TILES:
        return offsets_splits(tile_bound, k_tiles, resident)
    return offsets_splits(tile_bound, k_tiles, resident, share=2, most=WNA16_MAX_SPLITS)


def nonempty_slices(k_tiles: int, splits: int) -> int:
    """The slices that `splits` slices of k_tiles K tiles make when each takes ceil(k_tiles /
    splits) of them (schedule/tile_scheduler.cuh's rule), so that none is left empty: 4 slices of 5
    K tiles run as 3 (2, 2 and 1), 3 of 5 stay 3."""
    return -(-k_tiles // -(-k_tiles // splits))


def _split_k_counters_size() -> int:
    from humming_aot import dispatch

    return dispatch.SPLIT_K_COUNTERS


def offsets_launch_arguments(a: torch.Tensor, experts: PackedExperts, offsets: torch.Tensor,
                             bias: torch.Tensor | None, out: torch.Tensor, tile: TileConfig,
                             resident: int, *, splits: int = 1, workspace: torch.Tensor | None = None,
                             counters: torch.Tensor | None = None) -> tuple[tuple[int, int, int], bytes]:
    """The grid and the MaskedGemmParams bytes of the offsets form: GemmParams of all R rows with
    expert 0's weights (m = R, which bounds every expert's rows; with `splits` K slices, the fp32
    workspace of splits x R x N and the split-K counters, one per tile), no counts, the experts'
    weights, zero slab strides, E and the int32 offsets pointer. The grid: the tiles the walk can
    find (offsets_tile_bound), at most the `resident` CTAs over the slices, by `splits`."""
    rows, e = a.shape[0], experts.experts
    if offsets.dtype != torch.int32 or offsets.shape != (e + 1,) or not offsets.is_contiguous():
        raise ValueError(f"gemm_grouped_kernel: the kernel reads ({e + 1},) contiguous int32 offsets, got "
                         f"{_describe(offsets)}")
    tiles = offsets_tile_bound(rows, e, experts.n, tile)
    if tiles >= 2**31:
        raise ValueError(f"gemm_grouped_kernel: {rows} rows of {e} experts and {experts.n} columns make up to {tiles} "
                         f"tiles of {tile.block_m} x {tile.block_n}, past the kernel's 2**31: split the rows over calls")
    if splits > 1 and (workspace is None or workspace.dtype != torch.float32
                       or workspace.numel() < splits * rows * experts.n or counters is None
                       or counters.dtype != torch.int32 or counters.numel() < tiles):
        raise ValueError(f"gemm_grouped_kernel: {splits} K slices need a float32 workspace of {splits} x {rows} x "
                         f"{experts.n} and {tiles} int32 counters at zero")
    tail = params_abi.MASKED_TAIL.pack(0, *_expert_weights(experts, bias), 0, 0, e, offsets.data_ptr())
    gemm = _gemm_bytes(a, experts, bias, out, lda=a.stride(0), m=rows, splits=splits,
                       workspace=0 if workspace is None else workspace.data_ptr(),
                       counters=0 if counters is None else counters.data_ptr())
    return (max(1, min(tiles, resident // splits)), splits, 1), gemm + tail


def _check_rows(a: torch.Tensor, experts: PackedExperts, bias: torch.Tensor | None, out: torch.Tensor | None,
                        what: str) -> None:
    """The checks of the grouped rows' activation, bias and output, in either form."""
    if not isinstance(a, torch.Tensor) or a.dim() != 2 or a.shape[1] != experts.in_features:
        raise ValueError(f"{what}: a must be (R, {experts.in_features}), got {_describe(a)}")
    if a.dtype != experts.act_dtype or a.stride(1) != 1:
        raise ValueError(f"{what}: a must be a {experts.act_dtype} tensor with unit stride along K (the experts were "
                         f"packed for it), got {a.dtype} with strides {a.stride()}")
    _check_device_and_rows(a, experts, what, "gemm_grouped")
    if a.shape[0] > 1 and a.stride(0) % 8:
        raise ValueError(f"{what}: a's rows must start on 16-byte boundaries (row stride a multiple of 8 elements, "
                         f"got {a.stride(0)}): pass a.contiguous()")
    _check_bias(bias, experts, a, what)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (a.shape[0], experts.out_features)
                            or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous()
                            or out.data_ptr() % 4):
        raise ValueError(f"{what}: out must be ({a.shape[0]}, {experts.out_features}) {a.dtype}, contiguous, on "
                         f"{a.device}, starting on a 4-byte boundary, got {_describe(out)}")


def _padded(run, a: torch.Tensor, experts: PackedExperts, bias: torch.Tensor | None, out: torch.Tensor | None,
            rows: torch.Tensor, **kwargs) -> torch.Tensor:
    """A MoE GEMM whose experts pack padded to the kernels' multiple of 64 (PackedExperts.n_valid /
    k_valid): the activations' K and the bias's N padded with zeros (copies), the kernel's output
    of the padded N, then its real columns: a view of it, or copied into `out` (whose rows the
    kernel leaves untouched stay as they were: they go through the padded output unchanged)."""
    pad_k, pad_n = experts.k - experts.in_features, experts.n - experts.out_features
    if pad_k:
        a = torch.nn.functional.pad(a, (0, pad_k)).contiguous()
    if bias is not None and pad_n:
        bias = torch.nn.functional.pad(bias, (0, pad_n)).contiguous()
    wide = None if out is None else torch.nn.functional.pad(out, (0, pad_n)).contiguous()
    result = run(a, experts.unpadded_view(), rows, bias=bias, out=wide, **kwargs)[..., :experts.out_features]
    if out is None:
        return result
    out.copy_(result)
    return out


def grouped_block_m(experts: PackedExperts, expected_m: int, device: torch.device | int | None = None) -> int:
    """The rows every expert's block of the grouped contiguous layout must be padded to for
    ``gemm_grouped_kernel`` with this ``expected_m`` (the tile's block_m; the same arguments give
    the same answer), so that a caller aligns its rows to the kernel it will run."""
    index = torch.device(device if device is not None else experts.device).index
    return _tile(experts, index if index is not None else torch.cuda.current_device(), max(1, int(expected_m)),
                 masked=False).block_m


def gemm_grouped_kernel(a: torch.Tensor, experts: PackedExperts, row_expert: torch.Tensor | None = None, *,
                        expected_m: int, offsets: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None, tile: TileConfig | str | None = None,
                        splits: int | None = None, routed_rows: int | None = None) -> torch.Tensor:
    """out[r] = a[r] @ W[e]^T (+ bias[e]) for the grouped rows, e the expert of the first row of
    r's block of ``grouped_block_m(experts, expected_m)`` rows.

    The experts' rows come as ``row_expert`` (below: block-aligned) or as ``offsets`` (E + 1,)
    int32 or int64 (int32 saves a conversion) on a's device: rows grouped expert after expert with
    no alignment, expert e owning rows offsets[e] to offsets[e + 1]. The offsets are read on the
    device and not checked there (rising, within [0, R]: the caller's contract; each is clamped to
    [0, R], so that no row outside a and out is touched, whatever they hold; offsets that do not
    rise give overlapping experts, computed twice or not at all). That form runs the masked schedule's walk
    over the offsets (kernel/grouped_masked.cuh): no alignment, no copy of the rows, and rows of no
    expert are neither read nor written (zeros in a new output).

    a:          (R, K), the experts' activation dtype, rows 16-byte aligned, on their CUDA device
    row_expert: (R,) int32 on the same device: each row's expert, -1 for a padding row; every
                block of rows starting at a multiple of the block must hold one expert's rows
                then padding, or padding only (each expert's rows padded to whole blocks; R need
                not be a multiple of the block). Padding rows in an expert's last block are
                computed with its weights from whatever ``a`` holds there (zero rows give the bias,
                or zeros, as the expert loop writes them without bias); blocks of padding only
                are skipped
    expected_m: the rows an expert is expected to hold, which picks the tile and so the blocks (with
                offsets, R and N too: decode_tiles)
    bias:       (E, N) in the activation dtype, or None
    out:        (R, N) contiguous to write into (blocks of padding only, and with offsets the
                rows of no expert, are left as they are); default a new zero tensor, whose
                zero-fill a caller whose rows all belong to experts saves by passing an empty one
    tile:       a forced tile (for tuning and benchmarks), as for gemm_masked_kernel; with
                row_expert, the rows must be aligned to its block_m instead of grouped_block_m's
    splits:     (offsets only) K slices, reduced in a float32 workspace in slice order (the
                same bits every run); default wna16_offsets_splits' choice: slices only when the
                rows' tiles leave most CTA slots idle (a few tokens on a long K)
    routed_rows: (offsets only) the rows that are routed tokens where ``a`` also holds padding
                rows (vLLM's block-aligned layout): with expected_m, R and N they pick the tile
                (the offsets form's decode tiles by how many experts the rows can reach,
                decode_tiles); default R
    """
    if (row_expert is None) == (offsets is None):
        raise ValueError("gemm_grouped_kernel: give the experts' rows as row_expert (R,) (block-aligned) or as "
                         "offsets (E + 1,), one of them")
    if offsets is not None:
        return _grouped_by_offsets(a, experts, offsets, expected_m=expected_m, bias=bias, out=out, tile=tile,
                                   splits=splits, routed_rows=routed_rows)
    if routed_rows is not None:
        raise ValueError("gemm_grouped_kernel: routed_rows is for the offsets form; the aligned rows' tile is "
                         "grouped_block_m's")
    if splits not in (None, 1):
        raise ValueError(f"gemm_grouped_kernel: splits={splits!r}: K slices are for the offsets form; the aligned "
                         "rows run one slice")
    _check_grouped(a, experts, row_expert, bias, out)
    if experts.padded:
        return _padded(gemm_grouped_kernel, a, experts, bias, out, row_expert, expected_m=expected_m, tile=tile)
    rows = a.shape[0]
    if out is None:
        out = torch.zeros(rows, experts.n, dtype=a.dtype, device=a.device)
    if rows == 0:
        return out
    tile, loaded = _kernel(a, experts, GemmType.GROUPED, max(1, int(expected_m)), "gemm_grouped_kernel",
                           "gemm_grouped", tile)
    grid, params = grouped_launch_arguments(a, experts, row_expert, bias, out, tile,
                                            _resident(loaded, tile, a.device.index))
    loaded.launch(grid, _stream(a), params)
    return out


def _tile(experts: PackedExperts, device_index: int, rows: int, masked: bool) -> TileConfig:
    """The tile of a MoE schedule for `rows` expected rows per expert on a device: the one
    gemm_*_kernel launches; for the grouped row-expert schedule (masked=False), the mma.sync one
    grouped_block_m names."""
    from humming_aot import dispatch, heuristics

    arch = dispatch.device_info(device_index).arches[0]
    return heuristics.select_masked_tile(arch, rows, experts.k, experts.group_size, experts.expert(0).bits,
                                         masked=masked, zero_point=experts.w_zero_point is not None)


def forced_tile(tile: TileConfig | str, experts: PackedExperts, what: str, *, masked: bool = False) -> TileConfig:
    """A caller's tile for a MoE schedule, parsed from its label and checked: a body the schedule
    takes (the mma.sync bodies, whose run_tile it calls; with ``masked``, the grouped masked
    schedule and its offsets form, the warp-specialized TMA body too), stages that fit the
    experts' K and groups."""
    from humming_aot import heuristics
    from humming_aot.enumerate import parse_tile_field

    if isinstance(tile, str):
        tile = parse_tile_field(tile)
    if not isinstance(tile, TileConfig):
        raise ValueError(f"{what}: tile must be a TileConfig or its label, got {type(tile).__name__}")
    bodies = heuristics.MOE_MASKED_BODIES if masked else heuristics.MOE_BODIES
    if tile.mma not in bodies:
        raise ValueError(f"{what}: tile {tile.label} is of body {tile.mma.value!r}; this MoE schedule runs "
                         f"{', '.join(b.value for b in bodies)} tiles")
    if not heuristics.tile_fits(tile, experts.k, experts.group_size):
        raise ValueError(f"{what}: tile {tile.label} stages {tile.block_k} of K at a time, which does not fit K = "
                         f"{experts.k} with groups of {experts.group_size}; use {heuristics.narrow_twin(tile).label}")
    return tile


def _stream(a: torch.Tensor) -> int:
    from humming_aot import dispatch

    return dispatch.current_stream(a.device.index)


def _kernel(a: torch.Tensor, experts: PackedExperts, gemm_type: GemmType, rows: int, what: str, loop: str,
            tile: TileConfig | str | None = None):
    """(tile, LoadedKernel) of a MoE schedule for `rows` expected rows per expert (or the forced
    `tile`), after the checks the dense GEMM of the same operands runs (layout version, the
    pairing's support on the device)."""
    from humming_aot import dispatch, ops

    dense = experts.expert(0)
    dense.check_layout()  # words in the packed layout this humming_aot reads
    device_index = a.device.index
    reason = ops._unsupported_on_device(ops.gemm_spec(dense), device_index)  # the dense pairing's rules
    if reason:
        raise ValueError(reason.replace("gemm:", f"{what}:", 1))
    if torch.cuda.get_device_capability(device_index) < (8, 0):
        raise ValueError(f"{what}: the MoE schedules wrap the mma.sync bodies of sm_80 and later; on this GPU, "
                         f"humming_aot.moe.{loop} computes the same")
    spec = dataclasses.replace(ops.gemm_spec(dense), gemm_type=gemm_type)
    if tile is not None:
        tile = forced_tile(tile, experts, what, masked=gemm_type is GemmType.MASKED)
    else:
        tile = _tile(experts, device_index, rows, masked=gemm_type is GemmType.MASKED)
    _, loaded = dispatch.obtain(spec, device_index, rows, tile, experts.k, experts.group_size, n=experts.n)
    return tile, loaded


def launch_arguments(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, bias: torch.Tensor | None,
                     out: torch.Tensor, tile: TileConfig, resident: int) -> tuple[tuple[int, int, int], bytes]:
    """The grid and the MaskedGemmParams bytes of one call. The schedule is persistent (each CTA
    walks the real tiles of every expert in turn): the grid is the tiles of every full slab, at most
    the `resident` CTAs the device holds at once. The params: expert 0's GemmParams (m = max_m, one
    K slice, global scale unused), the counts pointer, the experts' weights (ExpertWeights), the
    bytes between experts' activation and output slabs and the number of experts."""
    e, max_m, k = a.shape
    n = experts.n
    tiles = e * -(-max_m // tile.block_m) * -(-n // tile.block_n)
    if tiles >= 2**31:
        raise ValueError(f"gemm_masked_kernel: {e} experts of {max_m} rows and {n} columns make {tiles} tiles of "
                         f"{tile.block_m} x {tile.block_n}, past the kernel's 2**31: split the experts over calls")
    tail = params_abi.MASKED_TAIL.pack(masked_m.data_ptr(), *_expert_weights(experts, bias),
                                       max_m * k * _ELEMENT_BYTES, max_m * n * _ELEMENT_BYTES, e, 0)
    return (max(1, min(tiles, resident)), 1, 1), _gemm_bytes(a, experts, bias, out, lda=k, m=max_m) + tail


_RESIDENT: dict[tuple[int, int], int] = {}


def _resident(loaded, tile: TileConfig, device_index: int) -> int:
    """CTAs of a loaded kernel that the device holds at once (its SMs times what one SM holds by
    shared memory, warps and the kernel's registers); cached per kernel and device."""
    key = (loaded.kernel, device_index)
    if key not in _RESIDENT:
        from humming_aot import dispatch

        info = dispatch.device_info(device_index)
        _RESIDENT[key] = info.num_sms * dispatch._resident_ctas(loaded, tile, info)
    return _RESIDENT[key]


def grouped_launch_arguments(a: torch.Tensor, experts: PackedExperts, row_expert: torch.Tensor,
                             bias: torch.Tensor | None, out: torch.Tensor, tile: TileConfig,
                             resident: int) -> tuple[tuple[int, int, int], bytes]:
    """The grid and the GroupedGemmParams bytes of one call. The schedule is persistent (each CTA
    walks the dense tiles of all R rows, skipping padding blocks): the grid is those tiles, at most
    the `resident` CTAs the device holds at once. The params: the GemmParams of every row with
    expert 0's weights (one K slice, global scale unused), the row experts pointer, the experts'
    weights (ExpertWeights) and their number (blocks whose id lies outside [0, E) are skipped)."""
    rows = a.shape[0]
    tiles = -(-rows // tile.block_m) * -(-experts.n // tile.block_n)
    if tiles >= 2**31:
        raise ValueError(f"gemm_grouped_kernel: {rows} rows and {experts.n} columns make {tiles} tiles of "
                         f"{tile.block_m} x {tile.block_n}, past the kernel's 2**31: split the rows over calls")
    tail = params_abi.GROUPED_TAIL.pack(row_expert.data_ptr(), *_expert_weights(experts, bias), experts.experts)
    return (max(1, min(tiles, resident)), 1, 1), _gemm_bytes(a, experts, bias, out, lda=a.stride(0), m=rows) + tail


def _gemm_bytes(a: torch.Tensor, experts: PackedExperts, bias: torch.Tensor | None, out: torch.Tensor, *,
                lda: int, m: int, splits: int = 1, workspace: int = 0, counters: int = 0) -> bytes:
    """GemmParams with expert 0's weights: by default one K slice (no workspace or counters);
    global scale 1 (the schedules take each expert's from ExpertWeights)."""
    zero_points = experts.w_zero_point
    return params_abi.GEMM_PARAMS.pack(
        a.data_ptr(), experts.w.data_ptr(), experts.w_scale.data_ptr(),
        0 if zero_points is None else zero_points.data_ptr(), 0 if bias is None else bias.data_ptr(),
        out.data_ptr(), workspace, counters, lda, experts.n, m, experts.n, experts.k, experts.group_size, splits, 1.0,
    )


def _expert_weights(experts: PackedExperts, bias: torch.Tensor | None) -> tuple[int, ...]:
    """ExpertWeights' fields: the global scales pointer and the byte strides between experts'
    packed codes, scales, zero points and biases."""
    zero_points = experts.w_zero_point
    return (experts.global_scale_tensor.data_ptr(), _expert_bytes(experts.w), _expert_bytes(experts.w_scale),
            0 if zero_points is None else _expert_bytes(zero_points), 0 if bias is None else _expert_bytes(bias))


def _expert_bytes(stacked: torch.Tensor) -> int:
    """Bytes from one expert's slice of a stacked (E, ...) tensor to the next."""
    return stacked.stride(0) * stacked.element_size()


def _check_grouped(a: torch.Tensor, experts: PackedExperts, row_expert: torch.Tensor, bias: torch.Tensor | None,
                   out: torch.Tensor | None) -> None:
    what = "gemm_grouped_kernel"
    _check_rows(a, experts, bias, out, what)
    if (not isinstance(row_expert, torch.Tensor) or row_expert.shape != (a.shape[0],)
            or row_expert.dtype != torch.int32 or row_expert.device != a.device or not row_expert.is_contiguous()):
        raise ValueError(f"{what}: row_expert must be ({a.shape[0]},) int32, contiguous, on {a.device} (the kernel "
                         f"reads it there), got {_describe(row_expert)}")


def _check_device_and_rows(a: torch.Tensor, experts: PackedExperts, what: str, loop: str) -> None:
    if not a.is_cuda or a.device != experts.device:
        raise ValueError(f"{what}: a ({a.device}) and the experts ({experts.device}) must be on one CUDA device; "
                         f"on the CPU, humming_aot.moe.{loop} computes the same")
    if a.data_ptr() % 16:
        raise ValueError(f"{what}: a's data must start 16-byte aligned (got address {a.data_ptr():#x}); pass a "
                         "fresh tensor or .clone() it")
    if experts.experts > MAX_EXPERTS:
        raise ValueError(f"{what}: {experts.experts} experts: at most {MAX_EXPERTS}")
    scales = experts.global_scale_tensor
    if (scales.dtype != torch.float32 or scales.shape != (experts.experts,) or not scales.is_contiguous()
            or scales.device != experts.device):
        raise ValueError(f"{what}: the experts' global_scale_tensor must stay ({experts.experts},) float32, contiguous, "
                         f"on {experts.device} (the kernel reads it as fp32), got {_describe(scales)}: pack the "
                         "experts again instead of casting them")


def _check_bias(bias: torch.Tensor | None, experts: PackedExperts, a: torch.Tensor, what: str) -> None:
    if bias is not None and (not isinstance(bias, torch.Tensor)
                             or bias.shape != (experts.experts, experts.out_features)
                             or bias.dtype != a.dtype or bias.device != a.device or not bias.is_contiguous()
                             or bias.data_ptr() % 4):
        raise ValueError(f"{what}: bias must be ({experts.experts}, {experts.out_features}) {a.dtype}, contiguous, on "
                         f"{a.device}, starting on a 4-byte boundary, got {_describe(bias)}")


def _check(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor | None) -> None:
    what = "gemm_masked_kernel"
    if (not isinstance(a, torch.Tensor) or a.dim() != 3 or a.shape[0] != experts.experts
            or a.shape[2] != experts.in_features):
        raise ValueError(f"{what}: a must be ({experts.experts}, max_m, {experts.in_features}), got "
                         f"{tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}")
    if a.dtype != experts.act_dtype or not a.is_contiguous():
        raise ValueError(f"{what}: a must be a contiguous {experts.act_dtype} tensor (the experts were packed for "
                         f"it), got {a.dtype}{'' if a.is_contiguous() else ', not contiguous'}")
    _check_device_and_rows(a, experts, what, "gemm_masked")
    if (not isinstance(masked_m, torch.Tensor) or masked_m.shape != (experts.experts,)
            or masked_m.dtype != torch.int32 or masked_m.device != a.device or not masked_m.is_contiguous()):
        raise ValueError(f"{what}: masked_m must be ({experts.experts},) int32, contiguous, on {a.device} (the kernel "
                         f"reads the counts there), got {_describe(masked_m)}")
    _check_bias(bias, experts, a, what)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (*a.shape[:2], experts.out_features)
                            or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous()
                            or out.data_ptr() % 4):
        raise ValueError(f"{what}: out must be ({a.shape[0]}, {a.shape[1]}, {experts.out_features}) {a.dtype}, "
                         "contiguous, "
                         f"on {a.device}, starting on a 4-byte boundary, got {_describe(out)}")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype} on {value.device}"
    return type(value).__name__
