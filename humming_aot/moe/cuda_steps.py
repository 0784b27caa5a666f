"""The steps around the MoE GEMMs as humming_aot's own kernels (the ``moe`` unit of
humming_aot.helper_kernels; csrc/include/humming_aot/helpers/): routing into the grouped layouts,
the gather of the routed rows, the activation between the GEMMs, and the weighted combine of
each token's top-k outputs.

Each function here computes, bit for bit, what its torch counterpart in humming_aot.moe.routing
computes, in one or two kernel launches and with no host round trip (CUDA-graph capturable).
``routing.py`` calls them, and keeps its torch operations for whatever they return None for (the
CPU, HUMMING_AOT_HELPERS=0, a unit that cannot be had, shapes and dtypes the kernels do not take:
each checks those first, and only then loads the unit). Inputs are checked by the callers in
routing.py. One difference: the routing kernels drop an id outside [0, E) (no row, row_of_slot
-1), where the torch path fails on it.
"""
from __future__ import annotations

import struct

import torch

from humming_aot import env, helper_kernels

# The kernels' constants (helpers/moe_route.cuh, moe_activation.cuh, moe_combine.cuh)
ROUTE_THREADS = 256
ROUTE_WARPS = ROUTE_THREADS // 32
ROUTE_CHUNK = 2048  # slots per CTA
# MoeRouteSegments: one CTA of 1024 threads from this many slots up to its maximum (2048), for at
# most its experts (its table of 32 warps x E ints fits 48 KB)
ROUTE_SEGMENTS_THREADS = 1024
ROUTE_SEGMENTS_WARPS = ROUTE_SEGMENTS_THREADS // 32
ROUTE_SEGMENTS_MIN_SLOTS = 513
ROUTE_SEGMENTS_MAX_SLOTS = 2048
ROUTE_SEGMENTS_MAX_EXPERTS = 256
# ... which lays rows out in shared memory when there are at most this many (its kMaxStagedRows:
# 48 KB), and otherwise stores each slot's row straight to global memory
ROUTE_SEGMENTS_MAX_STAGED_ROWS = 12288
MAX_EXPERTS = 1024
ELEMENTWISE_THREADS = 128

_ROUTE = struct.Struct("<19q")  # helpers::RouteParams
_ACTIVATION = struct.Struct("<6q2f")  # helpers::ActivationParams
_COMBINE = struct.Struct("<9q")  # helpers::CombineParams
_GATHER = struct.Struct("<8q")  # helpers::GatherParams

_ACT_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the helper kernels can serve these tensors: all on one CUDA device, the kernels
    switched on (HUMMING_AOT_HELPERS) and the moe unit loadable there."""
    device = tensors[0].device
    if device.type != "cuda" or any(t.device != device for t in tensors):
        return False
    if not env.helpers_enabled():
        return False
    return helper_kernels.available("moe", device.index if device.index is not None else torch.cuda.current_device())


def _unit(device: torch.device) -> helper_kernels.LoadedUnit:
    return helper_kernels.load("moe", device.index)


def _stream(device: torch.device) -> int:
    from humming_aot.dispatch import current_stream

    return current_stream(device.index)


def _has(device: torch.device, symbol: str) -> bool:
    """Whether the device's unit holds ``symbol`` (an sm_75 unit has no bfloat16 kernels)."""
    return symbol in _unit(device).kernels


def _launch(device: torch.device, symbol: str, grid: tuple[int, int, int], threads: int, smem: int,
            params: bytes) -> None:
    """One launch on the device's current stream. Tensors on a device other than the current one
    are launched with that device made current for the call (a launch on the legacy default
    stream, 0, runs in the current context). From sm_90 builds with HUMMING_AOT_PDL on the launch
    takes Programmatic Dependent Launch: every kernel of the moe unit waits for the upstream grid
    before it touches memory (HELPERS_VERSION 7)."""
    unit = _unit(device)
    with helper_kernels.current_for(device.index):  # PDL where the unit's kernels wait (sm_90+ builds)
        unit.launch(symbol, grid, threads, smem, _stream(device), params, programmatic=unit.programmatic)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def route(topk_ids: torch.Tensor, num_experts: int, block: int, *, pad_slot: int, slot_of_row64: bool = False,
          slot_of_row32: bool = False, row_expert: bool = False, row_of_slot: bool = False,
          offsets64: bool = False, offsets32: bool = False, block_expert_len: int | None = None,
          expert_map: torch.Tensor | None = None, total: bool = False) -> dict[str, torch.Tensor]:
    """A stable counting sort of the flat slots of ``topk_ids`` (M, top_k) by expert, each expert's
    run padded to a multiple of ``block`` rows; returns the outputs asked for (rows arrays sized
    slots + E * (block - 1)): slot_of_row64/32 (pad_slot for padding), row_expert (-1 for
    padding), row_of_slot, offsets64/32 (each expert's first row, then the padded total),
    block_expert (block_expert_len entries: the expert of each block, through expert_map; -1
    past the total), total. One launch when the slots fit one chunk (ROUTE_CHUNK), else two; from
    ROUTE_SEGMENTS_MIN_SLOTS slots the one launch is MoeRouteSegments' (1024 threads)."""
    device = topk_ids.device
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    slots = ids.numel()
    rows = slots + num_experts * (block - 1)
    chunks = max(1, -(-slots // ROUTE_CHUNK))
    out = {}

    def make(name: str, wanted: bool, size: int, dtype: torch.dtype) -> torch.Tensor | None:
        if not wanted:
            return None
        out[name] = torch.empty(size, dtype=dtype, device=device)
        return out[name]

    s64 = make("slot_of_row64", slot_of_row64, rows, torch.int64)
    s32 = make("slot_of_row32", slot_of_row32, rows, torch.int32)
    rex = make("row_expert", row_expert, rows, torch.int32)
    ros = make("row_of_slot", row_of_slot, slots, torch.int32)
    o64 = make("offsets64", offsets64, num_experts + 1, torch.int64)
    o32 = make("offsets32", offsets32, num_experts + 1, torch.int32)
    bex = make("block_expert", block_expert_len is not None, block_expert_len or 0, torch.int32)
    tot = make("total", total, 1, torch.int32)
    counts = torch.empty(chunks * num_experts, dtype=torch.int32, device=device) if chunks > 1 else None
    emap = None
    if expert_map is not None:
        emap = expert_map.to(device=device, dtype=torch.int32).contiguous()
    params = _ROUTE.pack(
        _ptr(ids), slots, num_experts, block, chunks, _ptr(counts), rows, pad_slot, _ptr(s64), _ptr(s32), _ptr(rex),
        _ptr(ros), _ptr(o64), _ptr(o32), _ptr(bex), block_expert_len or 0, _ptr(emap), _ptr(tot), 0,
    )
    suffix = "i32" if ids.dtype == torch.int32 else "i64"
    place_smem = (num_experts * (ROUTE_WARPS + 1) + ROUTE_WARPS) * 4
    if ROUTE_SEGMENTS_MIN_SLOTS <= slots <= ROUTE_SEGMENTS_MAX_SLOTS and num_experts <= ROUTE_SEGMENTS_MAX_EXPERTS:
        _launch(device, f"moe_route_segments_{suffix}", (1, 1, 1), ROUTE_SEGMENTS_THREADS,
                segments_shared_ints(num_experts, rows) * 4, params)
        return out
    if chunks == 1:  # one CTA counts and places: one launch, no workspace
        _launch(device, f"moe_route_single_{suffix}", (1, 1, 1), ROUTE_THREADS, place_smem, params)
        return out
    _launch(device, f"moe_route_count_{suffix}", (chunks, 1, 1), ROUTE_THREADS, num_experts * 4, params)
    _launch(device, f"moe_route_place_{suffix}", (chunks, 1, 1), ROUTE_THREADS, place_smem, params)
    return out


def segments_shared_ints(experts: int, rows: int) -> int:
    """The segments kernel's dynamic shared memory in ints (the layout MoeRouteSegments states): its
    table, run starts, scan sums and total, or the rows where it stages them and they are more."""
    table = (ROUTE_SEGMENTS_WARPS + 1) * experts + ROUTE_SEGMENTS_WARPS + 1
    return rows if table < rows <= ROUTE_SEGMENTS_MAX_STAGED_ROWS else table


def route_supported(topk_ids: torch.Tensor, num_experts: int, block: int = 1) -> bool:
    """Whether the routing kernels take this routing (int32 / int64 ids, up to MAX_EXPERTS experts,
    rows and blocks that fit int32) and can run on its device now (``usable``)."""
    return (topk_ids.dtype in (torch.int32, torch.int64) and 1 <= num_experts <= MAX_EXPERTS
            and 1 <= block and topk_ids.numel() + num_experts * (block - 1) < 2**31 - block
            and usable(topk_ids))


def _pairs(*extents: int) -> int:
    """4 column pairs per thread (16-byte accesses) when every extent is a multiple of 8, else 1."""
    return 4 if all(e % 8 == 0 for e in extents) else 1


def _rows_2d(x: torch.Tensor) -> torch.Tensor | None:
    """x as (rows, columns) with unit column stride and an even row stride, or None."""
    if x.dim() < 1 or x.shape[-1] == 0:
        return None
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.stride(-1) != 1 or x2.shape[-1] % 2 or (x2.shape[0] > 1 and x2.stride(0) % 2) or x2.data_ptr() % 4:
        return None
    return x2


def gather(hidden: torch.Tensor, slot_of_row: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """(rows, K) = hidden[slot_of_row // top_k], zeros where slot_of_row is -1 (the permute step);
    None when the kernel does not take these tensors (the caller's torch path serves them). The
    kernel copies 16-bit words, so rows of other dtypes (8-bit activation codes, float32 scales)
    go through it as their bytes (_as_16_bit), zero bytes for a padding row."""
    if hidden.dtype not in _ACT_NAMES:
        words = _as_16_bit(hidden)
        if words is None:
            return None
        out = gather(words, slot_of_row, top_k)
        return None if out is None else out.view(hidden.dtype)
    if hidden.dim() != 2 or slot_of_row.dtype != torch.int64:
        return None
    x = _rows_2d(hidden) if hidden.shape[0] else None
    if x is None:
        return None
    if not usable(x, slot_of_row):
        return None
    rows, cols = slot_of_row.shape[0], x.shape[1]
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    slots = slot_of_row.contiguous()
    words = 4 if x.data_ptr() % 16 == 0 and cols % 8 == 0 and x.stride(0) % 8 == 0 else 1
    params = _GATHER.pack(x.data_ptr(), slots.data_ptr(), out.data_ptr(), rows, cols, x.stride(0), out.stride(0), top_k)
    grid = (rows, -(-cols // (ELEMENTWISE_THREADS * 2 * words)), 1)
    _launch(x.device, f"moe_gather_v{words}", grid, ELEMENTWISE_THREADS, 0, params)
    return out


def _as_16_bit(x: torch.Tensor) -> torch.Tensor | None:
    """A 2-D tensor's rows as 16-bit words (a bfloat16 view of the same bytes), or None where its
    rows are not whole words (an odd byte count or row stride, an odd base address) or its dtype
    is not a plain number type."""
    if x.dim() != 2 or x.dtype.is_complex or x.dtype == torch.bool or x.stride(-1) != 1 or x.shape[-1] == 0:
        return None
    size = x.element_size()
    if (x.shape[-1] * size) % 2 or (x.shape[0] > 1 and (x.stride(0) * size) % 2) or x.data_ptr() % 2:
        return None
    try:
        return x.view(torch.bfloat16)
    except RuntimeError:  # (a layout torch cannot view as 16-bit words)
        return None


def activation(gate_up: torch.Tensor, kind: str, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor | None:
    """silu_and_mul ("silu") or swiglu_oai of gate_up (..., 2 I) -> (..., I); None when the kernel
    does not take this tensor (dtype, odd I, layout): the caller's torch path then serves it."""
    if gate_up.dtype not in _ACT_NAMES or gate_up.shape[-1] % 4 or gate_up.numel() == 0:
        return None
    x = _rows_2d(gate_up)
    if x is None or not usable(x):
        return None
    rows, inter = x.shape[0], x.shape[1] // 2
    aligned = x.data_ptr() % 16 == 0
    pairs = _pairs(inter, x.stride(0)) if aligned else 1
    name = "silu_and_mul" if kind == "silu" else "swiglu_oai"
    symbol = f"moe_{name}_{_ACT_NAMES[x.dtype]}_v{pairs}"
    if not _has(x.device, symbol):
        return None
    out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    params = _ACTIVATION.pack(x.data_ptr(), out.data_ptr(), rows, inter, x.stride(0), out.stride(0), alpha, limit)
    grid = (rows, -(-inter // (ELEMENTWISE_THREADS * 2 * pairs)), 1)
    _launch(x.device, symbol, grid, ELEMENTWISE_THREADS, 0, params)
    return out.reshape(*gate_up.shape[:-1], inter)


def combine(rows: torch.Tensor, row_of_slot: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor | None:
    """(tokens, N) = sum over j of topk_weights[t, j] * rows[row_of_slot[t * top_k + j]] in fp32, slot
    order, rounded once; slots with row -1 add nothing. None when the kernel does not take these
    tensors (the caller's torch path serves them)."""
    tokens, top_k = topk_weights.shape
    if rows.dtype not in _ACT_NAMES or rows.dim() != 2 or tokens == 0:
        return None
    if topk_weights.dtype not in (torch.float32, rows.dtype) or row_of_slot.dtype != torch.int32:
        return None
    x = _rows_2d(rows)
    if x is None or not usable(x, row_of_slot, topk_weights):
        return None
    n = x.shape[1]
    pairs = _pairs(n, x.stride(0)) if x.data_ptr() % 16 == 0 else 1
    fp32 = topk_weights.dtype == torch.float32
    symbol = f"moe_combine_{_ACT_NAMES[x.dtype]}_{'w32' if fp32 else 'wact'}_v{pairs}"
    if not _has(x.device, symbol):
        return None
    weights = topk_weights.contiguous()
    ros = row_of_slot.contiguous()
    out = torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    params = _COMBINE.pack(x.data_ptr(), ros.data_ptr(), weights.data_ptr(), out.data_ptr(), tokens, top_k, n,
                           x.stride(0), out.stride(0))
    grid = (tokens, -(-n // (ELEMENTWISE_THREADS * 2 * pairs)), 1)
    _launch(x.device, symbol, grid, ELEMENTWISE_THREADS, 0, params)
    return out
