"""MoE experts with 8-bit activations: W4A8 (int4, uint4 with integer zero points or MXFP4
experts) and W8A8 (float8e4m3 per channel or per 128 x 128 block, int8 per channel) times
float8e4m3 or int8 activation codes with float32 scales per row (W8A8 blocks: per row and 128 of K).

- ``pack_w4a8_experts(qw)`` / ``pack_w8a8_experts(qw)``: a stacked (E, N, K) QuantizedWeight packed
  expert by expert as ``w4a8.pack`` / ``w8a8.pack`` packs a dense one, stacked along a leading
  expert dimension (``experts.expert(e)`` is the dense packed weight, of views);
- ``gemm_grouped_a8`` / ``gemm_masked_a8``: the grouped contiguous layout (rows by prefix offsets)
  and the grouped masked one as a loop of the dense GEMM (``w4a8.gemm`` / ``w8a8.gemm``), one call
  per expert with rows: the definition of what the kernels compute, the reference they are tested
  against, and the path on a CPU (the float64 reference of each expert's operands);
- ``gemm_grouped_a8_kernel`` / ``gemm_masked_a8_kernel``: one launch each, the persistent grouped
  masked schedule (kernel/grouped_masked.cuh, its offsets and slab forms) around the portable
  mma.sync body of the pairing (mma-w4a8, mma-ss) on MaskedScaledGemmParams (or on sm90a around
  the wgmma-w4a8 and wgmma-ss bodies, below); no host round trip
  (CUDA-graph capturable).

The activations are quantized per row before the GEMM (``ops.quantize_activation(x,
"float8e4m3:token")``): the grouped rows carry their codes and scales along, so a row gathered for
its experts keeps its own; a per-tensor scale is widened to one per row. int8 codes run from
sm80, float8 ones from sm89 (mma.sync on e4m3; on sm90 / sm100 ptxas emulates it). On sm90a the
masked schedule and its offsets form run W4A8 experts with float8 activations on the warp-specialized
wgmma-w4a8 body and W8A8 experts (channel or DeepSeek-V3 block scales) on the wgmma-ss body instead
(kernel/grouped_masked_scaled_ws.cuh); body and tile choice, and the Params bytes:
humming_aot.moe.a8_launch.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import w4a8, w8a8
from humming_aot.moe import kernels as _moe
from humming_aot.moe.a8_launch import (  # noqa: F401  (the Params layouts, re-exported)
    GROUPED_SCALED_PARAMS_BYTES,
    GROUPED_SCALED_TAIL,
    MASKED_SCALED_PARAMS_BYTES,
    SCALED_TAIL,
    grouped_scaled_params,
    moe_key,
    portable_slices_win,
    scaled_params,
    select_kernel,
    ws_map,
)
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.spec import GemmType, MmaKind, TileConfig
from humming_aot.w8a8 import K_ALIGN, PackedRows

_OUT_DTYPES = (torch.bfloat16, torch.float16)
# The W8A8 experts' tile for more rows than this is w8a8.select_sync_tile's for this many: its
# 128-row tile, with the schedule's walk beside its accumulators, spills 24 bytes in the e4m3 build
# for sm90a (ptxas 13.0: 255 registers; sm89's native e4m3 build holds it in 239).
W8A8_MAX_TILE_ROWS = 64


@dataclasses.dataclass(frozen=True, eq=False)
class _PackedExperts(PackedRows):
    """What both kinds of stacked 8-bit-activation experts share (out_features, in_features,
    device: PackedRows'): the stacked codes and scales, E, the kernel's N, the weights' K, the
    format, the weights' own N where pack padded it, and (E,) float32 ones on the weights' device
    (the schedule reads a global scale per expert; these weights have none)."""

    w: torch.Tensor
    w_scale: torch.Tensor
    experts: int
    n: int
    k: int
    format: str
    global_scale_tensor: torch.Tensor
    n_valid: int | None

    def _check_index(self, e: int) -> None:
        if type(e) is not int or not 0 <= e < self.experts:
            raise IndexError(f"expert {e!r} of {self.experts}: expert indices lie in [0, {self.experts - 1}]")

    def to(self, device):
        """The same experts with their tensors on `device`."""
        return dataclasses.replace(self, w=self.w.to(device), w_scale=self.w_scale.to(device),
                                   global_scale_tensor=self.global_scale_tensor.to(device))


@dataclasses.dataclass(frozen=True, eq=False)
class PackedW4A8Experts(_PackedExperts):
    """E W4A8 experts on one device: w (E, k_tiles, n / 64, 4096) uint8 packed codes, w_scale (E, ...)
    each expert's scale entries, and PackedW4A8Weight's group_size, element and layout_version."""

    group_size: int = 0
    element: str = w4a8.WEIGHT_ELEMENT
    layout_version: int | None = None

    def expert(self, e: int) -> w4a8.PackedW4A8Weight:
        """Expert e as a dense PackedW4A8Weight (views of the stacked tensors: no copy)."""
        self._check_index(e)
        return w4a8.PackedW4A8Weight(w=self.w[e], w_scale=self.w_scale[e], n=self.n, k=self.k,
                                     group_size=self.group_size, format=self.format, n_valid=self.n_valid,
                                     layout_version=self.layout_version, element=self.element)


@dataclasses.dataclass(frozen=True, eq=False)
class PackedW8A8Experts(_PackedExperts):
    """E W8A8 experts on one device: w (E, n, k) uint8 codes, w_scale (E, n) float32 channel scales
    or, with ``blocks``, (E, ceil(n / 128), ceil(k / 128)) block scales."""

    blocks: bool = False

    def expert(self, e: int) -> w8a8.PackedW8A8Weight:
        """Expert e as a dense PackedW8A8Weight (views of the stacked tensors: no copy)."""
        self._check_index(e)
        return w8a8.PackedW8A8Weight(w=self.w[e], w_scale=self.w_scale[e], n=self.n, k=self.k, format=self.format,
                                     n_valid=self.n_valid, blocks=self.blocks)


PackedA8Experts = PackedW4A8Experts | PackedW8A8Experts


def _pack_each(qw: QuantizedWeight, pack, what: str) -> list:
    from humming_aot.moe.packing import expert_weight

    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{what} takes a humming_aot.quant.QuantizedWeight, got {type(qw).__name__}")
    if qw.codes.dim() != 3:
        raise ValueError(f"{what}: expected stacked expert codes (E, N, K), got shape {tuple(qw.codes.shape)}; a "
                         "dense (N, K) weight is packed with the dense module's pack")
    experts = qw.codes.shape[0]
    if experts == 0:
        raise ValueError(f"{what}: the weight holds no expert (E = 0)")
    if experts > _moe.MAX_EXPERTS:
        raise ValueError(f"{what}: {experts} experts: at most {_moe.MAX_EXPERTS}")
    packed = []
    for e in range(experts):
        try:
            packed.append(pack(expert_weight(qw, e)))
        except ValueError as error:
            raise ValueError(f"expert {e}: {error}") from None
    return packed


def _common(packed: list) -> dict:
    first = packed[0]
    return dict(w=torch.stack([p.w for p in packed]), w_scale=torch.stack([p.w_scale for p in packed]),
                experts=len(packed), n=first.n, k=first.k, format=first.format, n_valid=first.n_valid,
                global_scale_tensor=torch.ones(len(packed), dtype=torch.float32, device=first.w.device))


def pack_w4a8_experts(qw: QuantizedWeight) -> PackedW4A8Experts:
    """Pack a stacked (E, N, K) QuantizedWeight for the W4A8 MoE GEMMs: each expert as
    ``w4a8.pack`` packs a dense weight (same formats, same errors, naming the expert), stacked
    along the expert dimension, on the weight's device. MXFP4 experts share one fold span (the
    kernels read it from group_size): the shortest of the experts' own."""
    packed = _pack_each(qw, w4a8.pack, "pack_w4a8_experts")
    spans = {p.group_size for p in packed}
    if len(spans) > 1:
        span = min(spans) // w4a8.K_TILE
        packed = _pack_each(qw, lambda q: w4a8.pack(q, mxfp4_span=span), "pack_w4a8_experts")
    first = packed[0]
    return PackedW4A8Experts(**_common(packed), group_size=first.group_size, element=first.element,
                             layout_version=first.layout_version)


def pack_w8a8_experts(qw: QuantizedWeight) -> PackedW8A8Experts:
    """Pack a stacked (E, N, K) QuantizedWeight for the W8A8 MoE GEMMs: each expert as ``w8a8.pack``
    packs a dense one ("float8e4m3:channel", DeepSeek-V3's "float8e4m3:b128x128", "int8:channel";
    int4 weights, W4A4, have no MoE kernels), stacked along the expert dimension."""
    if isinstance(qw, QuantizedWeight) and qw.format.element == w8a8.INT4:
        raise ValueError("pack_w8a8_experts: int4 x int4 (W4A4) has no MoE kernels; pack int4 experts for 8-bit "
                         "activations with pack_w4a8_experts, or for 16-bit ones with humming_aot.moe.pack_experts")
    packed = _pack_each(qw, w8a8.pack, "pack_w8a8_experts")
    return PackedW8A8Experts(**_common(packed), blocks=packed[0].blocks)


def pack_a8_experts(qw: QuantizedWeight) -> PackedA8Experts:
    """pack_w8a8_experts for 8-bit float / int weights (float8e4m3, int8), else pack_w4a8_experts."""
    if isinstance(qw, QuantizedWeight) and qw.format.element in w8a8.ELEMENTS:
        return pack_w8a8_experts(qw)
    return pack_w4a8_experts(qw)


def _dense(experts) -> object:
    """The dense module of the experts' pairing: w4a8 or w8a8."""
    if isinstance(experts, PackedW4A8Experts):
        return w4a8
    if isinstance(experts, PackedW8A8Experts):
        return w8a8
    raise TypeError(f"experts must be PackedW4A8Experts or PackedW8A8Experts (humming_aot.moe.pack_w4a8_experts, "
                    f"pack_w8a8_experts), got {type(experts).__name__}")


# ---------------------------------------------------------------------------------------------
# The loops: what each layout computes


def _scales_per_row(qa: QuantizedActivation) -> int:
    """The floats of one row's scales: K / 128 per token group (W8A8 blocks), else 1."""
    return qa.scales.shape[-1] if qa.granularity is ActivationGranularity.GROUP else 1


def _row_scales(qa: QuantizedActivation, rows: int) -> torch.Tensor:
    """(rows, scales per row) float32, contiguous: each row's scales (a per-tensor scale repeated)."""
    if qa.granularity is ActivationGranularity.TENSOR:
        return qa.scales.reshape(1, 1).expand(rows, 1).contiguous()
    return qa.scales.reshape(rows, _scales_per_row(qa)).contiguous()


def _rows(qa: QuantizedActivation, select) -> QuantizedActivation:
    """The rows `select` (an index or slice of the leading dims) of the activations, as (rows, K)
    ones with their own scales (per tensor: per token)."""
    codes = qa.codes[select]
    rows = codes.reshape(-1, codes.shape[-1]).shape[0]
    if qa.granularity is ActivationGranularity.TENSOR:
        return QuantizedActivation(element=qa.element, granularity=ActivationGranularity.TOKEN, group_size=None,
                                   scale_dtype="float32", codes=codes.reshape(rows, -1),
                                   scales=qa.scales.reshape(1, 1).expand(rows, 1).contiguous())
    return dataclasses.replace(qa, codes=codes.reshape(rows, -1),
                               scales=qa.scales[select].reshape(rows, _scales_per_row(qa)).contiguous())


def _check_pairing(qa: QuantizedActivation, experts, what: str, dims: int):
    """The experts' dense module after its pairing checks (element, scales, K, devices)."""
    dense = _dense(experts)
    if not isinstance(qa, QuantizedActivation):
        raise TypeError(f"{what}: activations must be a humming_aot.quant.QuantizedActivation "
                        f"(ops.quantize_activation(x, 'float8e4m3:token')), got {type(qa).__name__}")
    dense._check_activation(qa, experts.expert(0))
    if qa.codes.dim() != dims:
        raise ValueError(f"{what}: activation codes must have {dims} dims, got shape {tuple(qa.codes.shape)}")
    return dense


def gemm_grouped_a8(qa: QuantizedActivation, experts: PackedA8Experts, offsets: torch.Tensor, *,
                    bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """out[r] = decode(qa)[r] @ W[e]^T (+ bias[e]) for the rows r in [offsets[e], offsets[e + 1])
    of every expert e; rows of no expert are zeros. qa: (R, K) codes with their scales; offsets:
    (E + 1,) rising, within [0, R]; bias: (E, N) in out_dtype or None. A loop of the dense GEMM
    (one host read of the offsets)."""
    what = "gemm_grouped_a8"
    dense = _check_pairing(qa, experts, what, 2)
    rows = qa.codes.shape[0]
    bounds = _offsets_list(offsets, experts.experts, rows, what)
    out = torch.zeros(rows, experts.out_features, dtype=out_dtype, device=qa.codes.device)
    for e in range(experts.experts):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = dense.gemm(_rows(qa, slice(lo, hi)), experts.expert(e),
                                    bias=None if bias is None else bias[e], out_dtype=out_dtype)
    return out


def gemm_masked_a8(qa: QuantizedActivation, experts: PackedA8Experts, masked_m: torch.Tensor, *,
                   bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """out[e, :masked_m[e]] = decode(qa)[e, :masked_m[e]] @ W[e]^T (+ bias[e]); rows past each
    count are zeros. qa: (E, max_m, K) codes with their scales. A loop of the dense GEMM (one host
    read of the counts)."""
    what = "gemm_masked_a8"
    dense = _check_pairing(qa, experts, what, 3)
    e_count, max_m, _ = qa.codes.shape
    if e_count != experts.experts:
        raise ValueError(f"{what}: activations hold {e_count} experts' slabs, the weights {experts.experts}")
    counts = [int(c) for c in masked_m.reshape(-1).tolist()]
    if len(counts) != e_count or any(not 0 <= c <= max_m for c in counts):
        raise ValueError(f"{what}: masked_m must hold {e_count} counts in [0, {max_m}], got {counts[:8]}...")
    out = torch.zeros(e_count, max_m, experts.out_features, dtype=out_dtype, device=qa.codes.device)
    for e, count in enumerate(counts):
        if count:
            out[e, :count] = dense.gemm(_rows(qa, (e, slice(0, count))), experts.expert(e),
                                        bias=None if bias is None else bias[e], out_dtype=out_dtype)
    return out


def _offsets_list(offsets: torch.Tensor, experts: int, rows: int, what: str) -> list[int]:
    if not isinstance(offsets, torch.Tensor) or offsets.shape != (experts + 1,) \
            or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{what}: offsets must be ({experts + 1},) int32 or int64, got {_moe._describe(offsets)}")
    bounds = [int(v) for v in offsets.tolist()]
    if bounds[0] < 0 or bounds[-1] > rows or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{what}: offsets must rise from >= 0 to <= R = {rows}, got {bounds[:8]}...")
    return bounds


# ---------------------------------------------------------------------------------------------
# The kernels


def gemm_masked_a8_kernel(qa: QuantizedActivation, experts: PackedA8Experts, masked_m: torch.Tensor, *,
                          expected_m: int | None = None, bias: torch.Tensor | None = None,
                          out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
                          tile: TileConfig | str | None = None) -> torch.Tensor:
    """What gemm_masked_a8 computes, in one launch (the counts read on the device).

    qa:         (E, max_m, K) contiguous codes with their scales
    masked_m:   (E,) int32 on the device: each expert's valid rows, 0 <= count <= max_m (a count
                outside is read as the nearest bound)
    expected_m: the rows an expert is expected to hold, which picks the tile (default max_m)
    bias:       (E, N) in out_dtype, or None
    out:        (E, max_m, N) contiguous to write (rows past each count are left as they are;
                N the kernels' padded N); default a new zero tensor
    tile:       a forced tile (tuning and tests): of the pairing's portable body, or on sm90a of its
                warp-specialized one (a8_launch.ws_takes); default a8_launch.select_kernel's
    """
    what = "gemm_masked_a8_kernel"
    _check_pairing(qa, experts, what, 3)
    codes = qa.codes
    e, max_m, k = codes.shape
    if e != experts.experts:
        raise ValueError(f"{what}: activations hold {e} experts' slabs, the weights {experts.experts}")
    if (not isinstance(masked_m, torch.Tensor) or masked_m.shape != (e,) or masked_m.dtype != torch.int32
            or masked_m.device != codes.device or not masked_m.is_contiguous()):
        raise ValueError(f"{what}: masked_m must be ({e},) int32, contiguous, on {codes.device} (the kernel reads the "
                         f"counts there), got {_moe._describe(masked_m)}")
    _check_codes(codes, experts, what)
    scales = _row_scales(qa, e * max_m)
    bias = _check_bias(bias, experts, out_dtype, what)
    n = experts.n
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (e, max_m, n) or out.dtype != out_dtype
                            or out.device != codes.device or not out.is_contiguous()):
        raise ValueError(f"{what}: out must be ({e}, {max_m}, {n}) {out_dtype}, contiguous, on {codes.device}, got "
                         f"{_moe._describe(out)}")
    rows = max_m if expected_m is None else max(1, min(int(expected_m), max_m))
    tile, loaded = select_kernel(qa, experts, out_dtype, rows, tile, what)
    if out is None:
        out = torch.zeros(e, max_m, n, dtype=out_dtype, device=codes.device)
    if max_m == 0:
        return _valid(out, experts)
    resident = _moe._resident(loaded, tile, codes.device.index)
    tiles = e * -(-max_m // tile.block_m) * -(-n // tile.block_n)
    if tiles >= 2**31:
        raise ValueError(f"{what}: {e} experts of {max_m} rows and {n} columns make {tiles} tiles, past the kernel's "
                         "2**31: split the experts over calls")
    per_row = scales.shape[1]
    params = scaled_params(
        codes=codes.data_ptr(), lda=k, experts=experts, bias=bias, out=out.data_ptr(), m=max_m, splits=1,
        expert_rows=masked_m.data_ptr(), a_stride=max_m * k, out_stride=max_m * n * out.element_size(),
        offsets=0, a_scale=scales.data_ptr(), a_scale_stride=max_m * per_row, a_scale_row_stride=per_row)
    params += ws_map(codes, e * max_m, tile, experts)  # (the wgmma bodies' maps: every slab's rows)
    loaded.launch((max(1, min(tiles, resident)), 1, 1), _moe._stream(codes), params)
    return _valid(out, experts)


def gemm_grouped_a8_kernel(qa: QuantizedActivation, experts: PackedA8Experts, offsets: torch.Tensor | None = None,
                           *, row_expert: torch.Tensor | None = None, expected_m: int,
                           bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                           out: torch.Tensor | None = None, tile: TileConfig | str | None = None,
                           splits: int | None = None) -> torch.Tensor:
    """What gemm_grouped_a8 computes, in one launch (the offsets or row experts read on the device;
    rows of no expert are left as they are in `out`, zeros in a new one).

    qa:         (R, K) codes (rows 16-byte aligned) with their scales
    offsets:    (E + 1,) int32 or int64 on the device, rising within [0, R] (the caller's contract:
                the kernel clamps each to [0, R] and does not check that they rise); or
    row_expert: (R,) int32 on the device, each row's expert, -1 for a padding row (DeepGEMM's
                contiguous layout): every block of grouped_a8_block_m(experts, expected_m, qa) rows
                (or of the forced tile's block_m) from row 0 holds one expert's rows then padding,
                or padding only (aligning every expert's rows to 128 serves every tile). A block
                of padding only is skipped; padding rows inside an expert's block are computed
                with its weights (their output rows hold whatever that gives)
    expected_m: the rows an expert is expected to hold (tokens x top_k / E for a uniform
                routing), which picks the tile
    bias, out:  as for gemm_masked_a8_kernel, (E, N) and (R, N)
    splits:     K slices reduced through a float32 workspace in slice order (the same bits every
                run); default moe.kernels.offsets_splits' choice (slices only when the rows' tiles
                leave most CTA slots idle); 1 on the wgmma-w4a8 tiles
    """
    what = "gemm_grouped_a8_kernel"
    if (row_expert is None) == (offsets is None):
        raise ValueError(f"{what}: give the experts' rows as offsets (E + 1,) or as row_expert (R,) (block-aligned), "
                         "one of them")
    if row_expert is not None:
        if splits not in (None, 1):
            raise ValueError(f"{what}: splits={splits!r}: K slices are for the offsets form; the aligned rows run one")
        return _grouped_by_row_expert(qa, experts, row_expert, expected_m=expected_m, bias=bias, out_dtype=out_dtype,
                                      out=out, tile=tile)
    _check_pairing(qa, experts, what, 2)
    codes = qa.codes
    rows, k = codes.shape
    if (not isinstance(offsets, torch.Tensor) or offsets.shape != (experts.experts + 1,)
            or offsets.dtype not in (torch.int32, torch.int64) or offsets.device != codes.device):
        raise ValueError(f"{what}: offsets must be ({experts.experts + 1},) int32 or int64 on {codes.device} (the "
                         f"kernel reads them there), got {_moe._describe(offsets)}")
    scales, bias = _check_rows(qa, experts, bias, out, out_dtype, what)
    n = experts.n
    forced = tile is not None
    tile, loaded = select_kernel(qa, experts, out_dtype, max(1, int(expected_m)), tile, what)
    k_tiles = -(-k // 128)
    ws = tile.mma in (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS)  # (kernel/grouped_masked_scaled_ws.cuh)
    if ws and not forced and splits is None and rows:
        # a few rows on long K: the portable body's K slices beat one slice per tile
        # (a8_launch.portable_slices_win)
        portable = portable_slices_win(qa, experts, out_dtype, rows, max(1, int(expected_m)), k_tiles, what)
        if portable is not None:
            tile, loaded = portable
            ws = False
    one_slice = tile.mma is MmaKind.WGMMA_W4A8  # (its schedule runs one K slice a tile; wgmma-ss slices K)
    bound = _moe.offsets_tile_bound(rows, experts.experts, n, tile)
    counters_size = _moe._split_k_counters_size()
    resident = _moe._resident(loaded, tile, codes.device.index) if rows else 1
    if splits is None:
        splits = 1 if one_slice else _moe.offsets_splits(bound, k_tiles, resident)
    elif one_slice and splits != 1:
        raise ValueError(f"{what}: splits={splits!r}: the {tile.mma.value} tiles run one K slice (leave splits None)")
    elif type(splits) is not int or not 1 <= splits <= k_tiles or (splits > 1 and bound > counters_size):
        raise ValueError(f"{what}: splits={splits!r} must be an int in [1, K tiles of 128 = {k_tiles}], and 1 when "
                         f"the rows make more than {counters_size} tiles (here up to {bound})")
    if bound >= 2**31:
        raise ValueError(f"{what}: {rows} rows of {experts.experts} experts make up to {bound} tiles, past the "
                         "kernel's 2**31: split the rows over calls")
    ws_bytes = 4 * splits * bound * tile.block_m * tile.block_n if ws and splits > 1 else 0
    if ws_bytes > WS_WORKSPACE_BYTES:
        raise ValueError(f"{what}: splits={splits} on {tile.label} would take a "
                         f"{ws_bytes / 2**30:.1f} GiB workspace (up to {bound} "
                         f"tiles x {splits} slices x {tile.block_m} x {tile.block_n} floats), past "
                         f"{WS_WORKSPACE_BYTES // 2**30} GiB: pass fewer splits, or None (offsets_splits slices only "
                         "when the tiles fill at most a quarter of the CTAs)")
    if out is None:
        out = torch.zeros(rows, n, dtype=out_dtype, device=codes.device)
    if rows == 0:
        return _valid(out, experts)
    splits = _moe.nonempty_slices(k_tiles, splits)
    workspace = counters = 0
    if splits > 1:
        from humming_aot import dispatch

        # the portable bodies: each expert's (splits, rows, N) partials from its first row; wgmma-ss:
        # (tiles, splits, block_m x block_n) in fragment order, by the tile's walk index
        floats = bound * tile.block_m * tile.block_n if ws else rows * n
        workspace_tensor = torch.empty(splits * floats, dtype=torch.float32, device=codes.device)
        workspace = workspace_tensor.data_ptr()
        counters = dispatch._split_k_counters(codes.device, _moe._stream(codes)).data_ptr()
    offsets = offsets.to(torch.int32).contiguous()
    params = scaled_params(
        codes=codes.data_ptr(), lda=codes.stride(0), experts=experts, bias=bias, out=out.data_ptr(), m=rows,
        splits=splits, workspace=workspace, counters=counters, expert_rows=0, a_stride=0, out_stride=0,
        offsets=offsets.data_ptr(), a_scale=scales.data_ptr(), a_scale_stride=0, a_scale_row_stride=scales.shape[1])
    params += ws_map(codes, rows, tile, experts)
    loaded.launch((max(1, min(bound, resident // splits)), splits, 1), _moe._stream(codes), params)
    return _valid(out, experts)


# The most workspace K slices on the wgmma-ss tiles may take: (walk's tile bound, slices, tile
# outputs) fp32 (kernel/grouped_masked_scaled_ws.cuh); offsets_splits' own choices take a few MB.
WS_WORKSPACE_BYTES = 2**30


def _check_rows(qa: QuantizedActivation, experts, bias, out, out_dtype, what: str):
    """(the rows' scales, the bias padded to N) of a grouped call on (R, K) codes, after the checks
    of the codes, bias and output both grouped forms share."""
    codes = qa.codes
    rows, n = codes.shape[0], experts.n
    _check_codes(codes, experts, what)
    bias = _check_bias(bias, experts, out_dtype, what)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (rows, n) or out.dtype != out_dtype
                            or out.device != codes.device or not out.is_contiguous()):
        raise ValueError(f"{what}: out must be ({rows}, {n}) {out_dtype}, contiguous, on {codes.device}, got "
                         f"{_moe._describe(out)}")
    return _row_scales(qa, rows), bias


def sync_tile(experts: PackedA8Experts, expected_m: int) -> TileConfig:
    """The portable body's table tile for `expected_m` rows per expert: the dense module's
    select_sync_tile (W8A8: at most W8A8_MAX_TILE_ROWS' tile)."""
    rows = max(1, int(expected_m))
    if isinstance(experts, PackedW4A8Experts):
        return w4a8.select_sync_tile(rows)
    return w8a8.select_sync_tile(min(rows, W8A8_MAX_TILE_ROWS))


def grouped_a8_block_m(experts: PackedA8Experts, expected_m: int,
                       activations: str | QuantizedActivation | None = None) -> int:
    """The rows of the tile the row-expert form runs for `expected_m` rows per expert on the
    experts' device: every expert's rows must fill whole blocks of it from row 0 (128 is a multiple
    of every one). The warp-specialized table's tile where a8_launch.ws_takes the row-expert form
    (sm90a), else the portable body's. activations: the rows' format (a QuantizedActivation or
    its spelling, e.g. "float8e4m3:token"), which W4A8 experts on sm90a need (float8 rows run the
    wgmma-w4a8 table, int8 ones the portable one)."""
    return _row_expert_tile(experts, expected_m, activations).block_m


def _row_expert_tile(experts: PackedA8Experts, expected_m: int,
                     activations: str | QuantizedActivation | None = None) -> TileConfig:
    """The table tile of the row-expert form for `expected_m` rows per expert (grouped_a8_block_m)."""
    from humming_aot.moe.a8_launch import ws_takes, ws_tile

    if experts.device.type == "cuda":
        from humming_aot import dispatch

        if ws_takes(None, experts, dispatch.device_info(experts.device.index), GemmType.GROUPED):
            if isinstance(experts, PackedW4A8Experts):  # (float8 rows only: int8 ones run the portable body)
                if activations is None:
                    raise ValueError("grouped_a8_block_m: W4A8 experts on an sm90a GPU run the row-expert form on "
                                     "different tiles for float8 and int8 rows: pass activations= (the rows' "
                                     "QuantizedActivation or format, e.g. 'float8e4m3:token'), or align each "
                                     "expert's rows to 128, which serves every tile")
                element = (activations.element if isinstance(activations, QuantizedActivation)
                           else str(activations).split(":")[0])
                if element != w4a8.ACT_ELEMENT:
                    return sync_tile(experts, expected_m)
            return ws_tile(experts, expected_m, GemmType.GROUPED)
    return sync_tile(experts, expected_m)


def _grouped_by_row_expert(qa: QuantizedActivation, experts: PackedA8Experts, row_expert: torch.Tensor, *,
                           expected_m: int, bias, out_dtype, out, tile) -> torch.Tensor:
    """gemm_grouped_a8_kernel on block-aligned rows with a per-row expert index: the grouped
    contiguous schedule (kernel/grouped_contiguous.cuh) around the pairing's portable body, or,
    where a8_launch.ws_takes the form (sm90a), the warp-specialized schedule over the row blocks
    (kernel/grouped_masked_scaled_ws.cuh with schedule/row_block_walk.cuh)."""
    what = "gemm_grouped_a8_kernel"
    _check_pairing(qa, experts, what, 2)
    codes = qa.codes
    rows, k = codes.shape
    if (not isinstance(row_expert, torch.Tensor) or row_expert.shape != (rows,) or row_expert.dtype != torch.int32
            or row_expert.device != codes.device or not row_expert.is_contiguous()):
        raise ValueError(f"{what}: row_expert must be ({rows},) int32, contiguous, on {codes.device} (the kernel reads "
                         f"it there), got {_moe._describe(row_expert)}")
    scales, bias = _check_rows(qa, experts, bias, out, out_dtype, what)
    n = experts.n
    tile, loaded = select_kernel(qa, experts, out_dtype, max(1, int(expected_m)), tile, what, GemmType.GROUPED)
    if out is None:
        out = torch.zeros(rows, n, dtype=out_dtype, device=codes.device)
    if rows == 0:
        return _valid(out, experts)
    tiles = -(-rows // tile.block_m) * -(-n // tile.block_n)
    if tiles >= 2**31:
        raise ValueError(f"{what}: {rows} rows make {tiles} tiles, past the kernel's 2**31: split the rows over calls")
    resident = _moe._resident(loaded, tile, codes.device.index)
    if tile.mma in (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS):
        # the masked schedule's Params with the row experts where the counts go (row_block_walk.cuh)
        params = scaled_params(
            codes=codes.data_ptr(), lda=codes.stride(0), experts=experts, bias=bias, out=out.data_ptr(), m=rows,
            splits=1, workspace=0, counters=0, expert_rows=row_expert.data_ptr(), a_stride=0, out_stride=0,
            offsets=0, a_scale=scales.data_ptr(), a_scale_stride=0, a_scale_row_stride=scales.shape[1])
        params += ws_map(codes, rows, tile, experts)
    else:
        params = grouped_scaled_params(codes=codes.data_ptr(), lda=codes.stride(0), experts=experts, bias=bias,
                                       out=out.data_ptr(), m=rows, row_expert=row_expert.data_ptr(),
                                       a_scale=scales.data_ptr(), a_scale_row_stride=scales.shape[1])
    loaded.launch((max(1, min(tiles, resident)), 1, 1), _moe._stream(codes), params)
    return _valid(out, experts)


def _check_codes(codes: torch.Tensor, experts, what: str) -> None:
    """The codes the kernel reads by cp.async: on the experts' CUDA device, rows of K contiguous
    bytes starting 16-byte aligned, at least K and a multiple of 16 bytes apart."""
    if not codes.is_cuda or codes.device != experts.device:
        raise ValueError(f"{what}: the activation codes ({codes.device}) and the experts ({experts.device}) must be "
                         f"on one CUDA device; on the CPU, humming_aot.moe.{what.replace('_kernel', '')} computes "
                         "the same")
    row_stride = codes.stride(-2) if codes.shape[-2] > 1 else codes.shape[-1]
    if (codes.stride(-1) != 1 or codes.data_ptr() % 16 or row_stride % K_ALIGN or row_stride < codes.shape[-1]
            or (codes.dim() == 3 and not codes.is_contiguous())):
        raise ValueError(f"{what}: the activation codes' rows must be contiguous and start 16-byte aligned, a multiple "
                         f"of {K_ALIGN} bytes apart, at least K (strides {tuple(codes.stride())}); pass "
                         "qa.codes.contiguous()")
    scales = experts.global_scale_tensor
    w8_scales = isinstance(experts, PackedW8A8Experts) and experts.w_scale.dtype != torch.float32
    if (scales.shape != (experts.experts,) or scales.dtype != torch.float32 or not scales.is_contiguous()
            or scales.device != experts.device or w8_scales or not experts.w_scale.is_contiguous()
            or not experts.w.is_contiguous()):
        raise ValueError(f"{what}: the experts' tensors must stay as packed (global_scale_tensor ({experts.experts},) "
                         f"float32, scales {'float32 ' if isinstance(experts, PackedW8A8Experts) else ''}contiguous, "
                         f"on {experts.device}; the kernel reads them so), got global scales {_moe._describe(scales)} "
                         f"and scales {experts.w_scale.dtype}: pack the experts again instead of casting them")


def _check_bias(bias: torch.Tensor | None, experts, out_dtype: torch.dtype, what: str) -> torch.Tensor | None:
    """The bias checked and, where pack padded N, padded with zeros to the kernels' N (a copy)."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"{what}: out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    if bias is None:
        return None
    if (not isinstance(bias, torch.Tensor) or bias.shape != (experts.experts, experts.out_features)
            or bias.dtype != out_dtype or bias.device != experts.device or not bias.is_contiguous()):
        raise ValueError(f"{what}: bias must be ({experts.experts}, {experts.out_features}) {out_dtype}, contiguous, "
                         f"on {experts.device}, got {_moe._describe(bias)}")
    if experts.n_valid is not None:
        bias = torch.nn.functional.pad(bias, (0, experts.n - experts.n_valid)).contiguous()
    return bias


def _valid(out: torch.Tensor, experts) -> torch.Tensor:
    """The experts' own N of a kernel output of the padded N (a view)."""
    return out if experts.n_valid is None else out[..., : experts.n_valid]


