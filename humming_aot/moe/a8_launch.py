"""How the 8-bit-activation MoE GEMMs (humming_aot.moe.a8) reach a kernel: the Params bytes of
their schedules (kernel/params.cuh: MaskedScaledGemmParams, GroupedScaledGemmParams and, for the
warp-specialized Hopper bodies, MaskedScaledTmaGemmParams) and the choice of body, tile and
kernel for a call.

Bodies: the portable mma.sync ones of each pairing (mma-w4a8, mma-ss) everywhere, in both
schedules; on sm90a, in the masked schedule and its offsets form, W4A8 experts with float8
activations run the warp-specialized wgmma-w4a8 body and W8A8 experts (channel or 128 x 128 block
scales) the wgmma-ss body (kernel/grouped_masked_scaled_ws.cuh), on the tiles of WS_TILES /
W8A8_WS_TILES / W8A8_BLOCK_WS_TILES, and so do the row-expert form's calls (the same schedule
over schedule/row_block_walk.cuh; ws_takes says where).
"""
from __future__ import annotations

import dataclasses
import functools
import struct

import torch

from humming_aot import params_abi, w4a8, w8a8
from humming_aot.moe import kernels as _moe
from humming_aot.quant.activation import QuantizedActivation
from humming_aot.spec import GemmType, MmaKind, TileConfig

# MaskedScaledGemmParams (kernel/params.cuh): MaskedGemmParams, the rows' scales pointer, the
# floats between experts' slabs of them, the codes' own K (W4A8) and the floats between rows'
# scales (208 bytes).
SCALED_TAIL = struct.Struct("<Qq2i")
MASKED_SCALED_PARAMS_BYTES = params_abi.MASKED_PARAMS_BYTES + SCALED_TAIL.size
# GroupedScaledGemmParams: GroupedGemmParams, the rows' scales pointer, the codes' own K and the
# floats between rows' scales (176 bytes)
GROUPED_SCALED_TAIL = struct.Struct("<Q2i")
GROUPED_SCALED_PARAMS_BYTES = params_abi.GROUPED_PARAMS_BYTES + GROUPED_SCALED_TAIL.size
# MaskedScaledTmaGemmParams: MaskedScaledGemmParams, padding to byte 256, the 128-byte tensor maps
# of the activation codes and of the weight codes (W8A8; zeros for W4A8) (512 bytes)
WS_MAP_OFFSET = 256
WS_PARAMS_BYTES = WS_MAP_OFFSET + 2 * params_abi.TMA_MAP_BYTES

# The warp-specialized W4A8 body's MoE tiles by expected rows per expert (most rows, tile): the
# dense table's one-warpgroup shapes up to 32 rows (the 32-row one with 7 of its 8 stages, so that
# two CTAs per SM fit the schedule's own staging tile and walk table: bodies/wgmma_w4a8.py
# masked_smem_bytes), then two warpgroups of 128 and 192 rows. Routing is uneven, so many experts
# hold more rows than expected: each row switches to the next tile at a quarter to a half of its
# rows. H200, DeepSeek-V3 TP8's down projection (N 7168, K 256, E 256, top 8; log section 56) at 256
# / 1,024 / 4,096 tokens (8 / 32 / 128 rows expected): 8 / 16 / 32 / 64 / 128-row tiles took
# 123.7 / 100.1 / 116.1 / 213.6 / 285.5, 172.4 / 237.9 / 172.8 / 221.5 / 305.4 and
# 561.3 / 796.7 / 516.4 / 560.6 / 503.6 us.
WS_TILES = (
    (4, "wgmma-w4a8:8x128x128_w1x4_s8"),
    (16, "wgmma-w4a8:16x128x128_w1x4_s8"),
    (64, "wgmma-w4a8:32x128x128_w1x4_s7"),
    (1536, "wgmma-w4a8:128x128x128_w1x8_s7"),
    (1 << 62, "wgmma-w4a8:192x128x128_w1x8_s5"),
)
# The wgmma-ss body's (W8A8 with channel scales, float8 or int8): humming_aot.w8a8._TILES' shapes,
# the 16-row tile with 5 stages of its 6 (bodies/wgmma_ss.py masked_smem_bytes, two CTAs per SM).
# As W4A8's, each row moves on at half of its tile's rows (past 4 expected rows: the decode rows
# stay): a tile of twice the expected rows covers the experts routing gives more, and amortizes
# each tile's fill and epilogue. H200, block-scaled float8 (log section 59; ours / the dense
# table's rows before, us): Qwen3-30B-A3B gate_up at 256 / 1,024 / 2,048 tokens (16 / 64 / 128
# rows expected) 102.2 / 134.3 / 196.7 against 122.1 / 154.3 / 242.2, its down projection 56.4 /
# 84.0 / 119.8 against 64.3 / 88.9 / 143.4, DeepSeek-V3 TP8's gate_up at 256 tokens (8 rows)
# 228.8 against 272.3; channel scales at Qwen3's gate_up, 256 tokens: 102.1 against 120.8.
W8A8_WS_TILES = (
    (4, "wgmma-ss:8x128x128_w1x4_s6"),
    (8, "wgmma-ss:16x128x128_w1x4_s5"),
    (16, "wgmma-ss:32x128x128_w1x4_s5"),
    (32, "wgmma-ss:64x128x128_w1x8_s6"),
    (1 << 62, "wgmma-ss:128x128x128_w1x8_s5"),
)
# Block scales (DeepSeek-V3's float8 experts): W8A8_WS_TILES' shapes and rows, the 32-row tile with
# 4 stages, since its slots also hold the K block's 32 row scales (bodies/wgmma_ss.py
# key_masked_smem_bytes: two CTAs per SM). Its sweep (log section 59) set both tables' rows. Near
# 128 rows expected, about half the experts hold more than 128 (routing's spread is about the
# square root of the mean) and take a second, nearly empty 128-row tile; a 160-row tile (transposed
# layout, serial promotion: about 1.25x a 128-row tile's time) holds them in one. It wins only
# there: from about 112 rows expected (few experts past 128) to 144 (many past 160). H100, log
# section 61, 128 / 160 rows (us): at 128 rows expected DeepSeek-V3 TP8's down projection 386.0 /
# 348.9, its gate_up 439.3 / 430.3, Qwen3-30B-A3B's down 115.4 / 113.9, gate_up 195.0 / 194.9; at
# 64 and at 256 rows the 160-row tile lost 12-38 %.
W8A8_BLOCK_WS_TILES = (
    (4, "wgmma-ss:8x128x128_w1x4_s6"),
    (8, "wgmma-ss:16x128x128_w1x4_s5"),
    (16, "wgmma-ss:32x128x128_w1x4_s4"),
    (32, "wgmma-ss:64x128x128_w1x8_s6"),
    (112, "wgmma-ss:128x128x128_w1x8_s5"),
    (144, "wgmma-ss:160x128x128_w1x8_s4"),
    (1 << 62, "wgmma-ss:128x128x128_w1x8_s5"),
)
_WS_ARCH = "sm90a"


def ws_tile(experts, rows: int, gemm_type: GemmType = GemmType.MASKED) -> TileConfig:
    """The tile of the experts' warp-specialized table (WS_TILES for W4A8, W8A8_WS_TILES or, with
    block scales, W8A8_BLOCK_WS_TILES for W8A8) for `rows` expected rows per expert. The row-expert
    form (gemm_type GROUPED) takes the table's tiles whose rows divide 128 (its callers align each
    expert's rows to its tile's, and 128 is the alignment that serves every one): W4A8's 192-row
    tile gives way to its 128-row one."""
    from humming_aot.moe.a8 import PackedW4A8Experts

    if isinstance(experts, PackedW4A8Experts):
        table = WS_TILES
    else:
        table = W8A8_BLOCK_WS_TILES if experts.blocks else W8A8_WS_TILES
    if gemm_type is GemmType.GROUPED:
        table = row_expert_table(table)
    return w8a8.table_tile(table, max(1, int(rows)))


@functools.cache
def row_expert_table(table: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
    """A (most rows, tile) table's rows for the row-expert form: the tiles whose rows divide 128, the
    last of them taking every row count above (cached: ws_tile asks on every call)."""
    from humming_aot.enumerate import parse_tile_field

    kept = [(most, label) for most, label in table if 128 % parse_tile_field(label).block_m == 0]
    return (*kept[:-1], (table[-1][0], kept[-1][1]))


def ws_takes(qa: QuantizedActivation | None, experts, info, gemm_type: GemmType) -> bool:
    """Whether a warp-specialized body serves this call on a GPU with sm90a: the masked schedule
    (its offsets form) and the row-expert form (gemm_type GROUPED: the same schedule over row
    blocks), for W4A8 experts with float8 activations (wgmma-w4a8) or W8A8 experts (wgmma-ss:
    float8 x float8 with channel or block scales, int8 x int8). qa None: W4A8's experts are taken
    to meet float8 activations (their int8 ones run the portable body)."""
    from humming_aot.moe.a8 import PackedW4A8Experts

    if gemm_type not in (GemmType.MASKED, GemmType.GROUPED) or _WS_ARCH not in info.arches:
        return False
    if isinstance(experts, PackedW4A8Experts):
        return qa is None or qa.element == w4a8.ACT_ELEMENT
    return True


def portable_slices_win(qa: QuantizedActivation, experts, out_dtype: torch.dtype, rows: int, expected_m: int,
                        k_tiles: int, what: str):
    """(tile, loaded kernel) of the portable body for an offsets-form call that select_kernel gave a
    wgmma-w4a8 tile, where the portable body's K slices win; else None. The wgmma-w4a8 schedule
    runs one K slice per tile, so a few rows on long K leave most SMs idle: DeepSeek-V3 TP8's
    gate_up (N 512, K 7168) at one token, 32 tiles for 264 CTA slots, took 21.8 us against
    Humming's 15.3 (H200, log section 56); the portable slices 14.7 (log section 59). Where the portable table tile's rows would take K
    slices (moe.kernels.offsets_splits > 1: its tiles fill at most a quarter of its resident CTAs),
    its kernel runs instead (float8 on sm90a: ptxas's emulated e4m3 mma.sync, which streams the
    weights as fast at a few rows). Not for W8A8: its wgmma-ss schedule takes K slices itself."""
    from humming_aot import dispatch
    from humming_aot.moe.a8 import PackedW4A8Experts, sync_tile

    if not isinstance(experts, PackedW4A8Experts):
        return None
    sync = sync_tile(experts, expected_m)
    bound = _moe.offsets_tile_bound(rows, experts.experts, experts.n, sync)
    if bound * 4 > 8 * dispatch.device_info(qa.codes.device.index).num_sms:
        return None  # (before loading its kernel: more tiles than a quarter of 8 CTAs an SM never split)
    tile, loaded = select_kernel(qa, experts, out_dtype, expected_m, sync, what)
    resident = _moe._resident(loaded, tile, qa.codes.device.index)
    return (tile, loaded) if _moe.offsets_splits(bound, k_tiles, resident) > 1 else None


def ws_map(codes: torch.Tensor, rows: int, tile: TileConfig, experts=None) -> bytes:
    """What MaskedScaledTmaGemmParams adds to MaskedScaledGemmParams' bytes for a warp-specialized
    tile: padding to byte 256, the TMA map over the (rows, K) codes (every slab end to end, or the
    offsets form's rows) in boxes of the tile's rows x 128 codes, then for wgmma-ss the map over
    every expert's (N, K) weight codes as one (E x N, K) array in boxes of the tile's channels
    (zeros for wgmma-w4a8, which copies its codes in bulk); nothing for the portable bodies."""
    if tile.mma not in (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS):
        return b""
    from humming_aot._w8a8_launch import _codes_map

    k = codes.shape[-1]
    row_bytes = codes.stride(-2) if codes.shape[-2] > 1 else k  # (slabs are contiguous: K)
    a_map = _codes_map(codes, rows, k, row_bytes, tile.block_m)
    if tile.mma is MmaKind.WGMMA_W4A8:
        w_map = bytes(params_abi.TMA_MAP_BYTES)
    else:
        e, n, wk = experts.w.shape
        w_map = _codes_map(experts.w, e * n, wk, wk, tile.block_n)
    return bytes(WS_MAP_OFFSET - MASKED_SCALED_PARAMS_BYTES) + a_map + w_map


def grouped_scaled_params(*, codes: int, lda: int, experts, bias: torch.Tensor | None, out: int,
                          m: int, row_expert: int, a_scale: int, a_scale_row_stride: int) -> bytes:
    """GroupedScaledGemmParams' bytes (kernel/params.cuh): scaled_params' GemmParams of every row
    with expert 0's weights (one K slice), the row experts pointer, ExpertWeights and E, then the
    rows' scales pointer, the codes' own K (W4A8; 0 for W8A8) and the floats between rows' scales."""
    masked = scaled_params(codes=codes, lda=lda, experts=experts, bias=bias, out=out, m=m, splits=1, expert_rows=0,
                           a_stride=0, out_stride=0, offsets=0, a_scale=a_scale, a_scale_stride=0,
                           a_scale_row_stride=a_scale_row_stride)
    gemm = masked[:params_abi.GEMM_PARAMS.size]
    weights = params_abi.MASKED_TAIL.unpack(masked[params_abi.GEMM_PARAMS.size:params_abi.MASKED_PARAMS_BYTES])[1:6]
    a_k = SCALED_TAIL.unpack(masked[params_abi.MASKED_PARAMS_BYTES:])[2]
    params = gemm + params_abi.GROUPED_TAIL.pack(row_expert, *weights, experts.experts) + GROUPED_SCALED_TAIL.pack(
        a_scale, a_k, a_scale_row_stride)
    assert len(params) == GROUPED_SCALED_PARAMS_BYTES
    return params


def scaled_params(*, codes: int, lda: int, experts, bias: torch.Tensor | None, out: int, m: int,
                  splits: int, expert_rows: int, a_stride: int, out_stride: int, offsets: int, a_scale: int,
                  a_scale_stride: int, a_scale_row_stride: int, workspace: int = 0, counters: int = 0) -> bytes:
    """MaskedScaledGemmParams' bytes (kernel/params.cuh): GemmParams of expert 0's weights (a: the
    codes, lda in bytes; k: whole K tiles of 128; group_size: W4A8's group, W8A8's codes' own K;
    global scale 1, the schedule reads each expert's), the masked tail (counts, ExpertWeights,
    slab strides in bytes, E, offsets), then the rows' scales pointer, the floats between experts'
    slabs of them, the codes' own K (W4A8; 0 for W8A8) and the floats between rows' scales."""
    k_tiles = -(-experts.k // 128)
    from humming_aot.moe.a8 import PackedW4A8Experts

    w4 = isinstance(experts, PackedW4A8Experts)
    group = experts.group_size if w4 else experts.k
    gemm = params_abi.GEMM_PARAMS.pack(
        codes, experts.w.data_ptr(), experts.w_scale.data_ptr(), 0, 0 if bias is None else bias.data_ptr(), out,
        workspace, counters, lda, experts.n, m, experts.n, 128 * k_tiles, group, splits, 1.0)
    weights = (experts.global_scale_tensor.data_ptr(), _moe._expert_bytes(experts.w),
               _moe._expert_bytes(experts.w_scale), 0, 0 if bias is None else _moe._expert_bytes(bias))
    tail = params_abi.MASKED_TAIL.pack(expert_rows, *weights, a_stride, out_stride, experts.experts, offsets)
    params = gemm + tail + SCALED_TAIL.pack(a_scale, a_scale_stride, experts.k if w4 else 0, a_scale_row_stride)
    assert len(params) == MASKED_SCALED_PARAMS_BYTES
    return params


def moe_key(arch: str, experts, out_dtype: torch.dtype, tile: TileConfig, act_element: str,
            gemm_type: GemmType = GemmType.MASKED):
    """The grouped masked (or contiguous) KernelKey of the experts' pairing on `tile` for an arch."""
    from humming_aot.moe.a8 import PackedW4A8Experts

    if isinstance(experts, PackedW4A8Experts):
        key = w4a8.kernel_key(arch, out_dtype, tile, act_element, experts.element)
    else:
        key = w8a8.kernel_key(arch, out_dtype, tile, experts.blocks, act_element)
    return dataclasses.replace(key, spec=dataclasses.replace(key.spec, gemm_type=gemm_type))


def select_kernel(qa: QuantizedActivation, experts, out_dtype: torch.dtype, rows: int,
                  tile: TileConfig | str | None, what: str, gemm_type: GemmType = GemmType.MASKED):
    """(tile, loaded kernel) of a MoE call on `rows` expected rows per expert: for tile None the
    warp-specialized body's table where ws_takes (ws_tile; key arch sm90a), else the
    pairing's portable body with a8.sync_tile (key arch as the dense
    portable GEMM picks it: the GPU's arches with mma.sync on the codes, the installed catalog's
    first); else the forced tile, refused unless one of those bodies takes it here."""
    from humming_aot import _w8a8_launch, dispatch
    from humming_aot import obtain as _obtain
    from humming_aot.enumerate import parse_tile_field
    from humming_aot.moe.a8 import _dense, sync_tile

    dense = _dense(experts)
    body, fast_body = (MmaKind.MMA_W4A8, MmaKind.WGMMA_W4A8) if dense is w4a8 else (MmaKind.MMA_SS, MmaKind.WGMMA_SS)
    info = dispatch.device_info(qa.codes.device.index)
    fast = ws_takes(qa, experts, info, gemm_type)
    if tile is None:
        if fast:
            tile = ws_tile(experts, rows, gemm_type)
        else:
            tile = sync_tile(experts, rows)
    elif isinstance(tile, str):
        tile = parse_tile_field(tile)
    if not isinstance(tile, TileConfig) or (tile.mma is not body and not (fast and tile.mma is fast_body)):
        label = tile.label if isinstance(tile, TileConfig) else repr(tile)
        also = (f" (and {fast_body.value} tiles on sm90a in the masked schedule, its offsets form and the "
                "row-expert form, for " + ("float8e4m3 activations)" if dense is w4a8 else "W8A8 experts)"))
        raise ValueError(f"{what}: tile {label}: these MoE GEMMs run {body.value} tiles{also} (leave tile None for "
                         "the table's)")
    kind = (qa.codes.device.index, body, experts.element if dense is w4a8 else experts.blocks, experts.format,
            qa.element, out_dtype, tile, gemm_type)
    if kind in _LOADED:  # (the eager path looks a kernel up once, not on every call)
        return tile, _LOADED[kind]
    from humming_aot import ops

    # the pairing's support on this GPU first (float8 W8A8 MoE: native e4m3 mma.sync, or sm90a's
    # masked wgmma-ss schedule), before a key the body may refuse is built
    spec = (w4a8.gemm_spec(out_dtype, qa.element, experts.element) if dense is w4a8
            else w8a8.gemm_spec(out_dtype, experts.blocks, qa.element))
    reason = ops._unsupported_on_device(dataclasses.replace(spec, gemm_type=gemm_type), qa.codes.device.index)
    if reason:
        raise ValueError(reason.replace("gemm:", f"{what}:", 1))
    if tile.mma is fast_body:
        key = moe_key(_WS_ARCH, experts, out_dtype, tile, qa.element, gemm_type)
    else:
        if dense is w4a8:
            label = "MXFP4 W4A8" if experts.element == w4a8.MXFP4_ELEMENT else "W4A8"
        else:
            label = "W8A8"
        key = _w8a8_launch._portable_key(info, qa.element, label,
                                         lambda arch: moe_key(arch, experts, out_dtype, tile, qa.element, gemm_type))
    loaded = _obtain.load(key, info)
    if tile.mma is fast_body:
        wanted = WS_PARAMS_BYTES
    else:
        wanted = MASKED_SCALED_PARAMS_BYTES if gemm_type is GemmType.MASKED else GROUPED_SCALED_PARAMS_BYTES
    if loaded.params_bytes != wanted:
        raise ValueError(f"kernel {loaded.name}: takes {loaded.params_bytes} bytes of params, not {wanted}; the Python "
                         "Params layout differs from kernel/params.cuh")
    _LOADED[kind] = loaded
    return tile, loaded


# select_kernel's loaded kernels: (device, body, weight element or blocks, format, activation element,
# out dtype, tile, GEMM type) -> LoadedKernel
_LOADED: dict[tuple, object] = {}
