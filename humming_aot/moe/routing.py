"""The steps around the MoE GEMMs, on any device (torch operations; deterministic):

- ``align_block_size``: top-k routing -> the indexed layout of vLLM's fused_moe (rows sorted by
  expert, each expert's rows padded to a whole number of blocks with the pad value M * top_k,
  one expert id per block, -1 for an expert this rank does not hold);
- ``group_rows`` / ``ungroup_rows``: top-k routing -> the grouped contiguous layout (the routed
  rows expert after expert, with prefix offsets (E + 1,) and a per-row expert index) and back;
- ``align_groups`` with ``permute_aligned`` / ``unpermute_aligned``: the same, every expert's rows
  padded to whole blocks (what ``gemm_grouped_kernel`` takes), in arrays of a fixed size;
- ``silu_and_mul`` and ``swiglu_oai`` (gpt-oss: interleaved gate/up, clamped, with alpha);
- ``weighted_sum``: the top-k outputs of each token, times their routing weights, summed in slot
  order; ``combine``: the same straight from the grouped rows (unpermute and weighted_sum in one).

On a GPU the routing functions, the activations and ``combine`` run as humming_aot's own kernels
(humming_aot.moe.cuda_steps: one or two launches each, no host round trip), with the same results
bit for bit; the torch operations here are their reference and serve everything else.

Token i's slot j (0 <= j < top_k) is the flat index t = i * top_k + j throughout.
"""
from __future__ import annotations

import dataclasses
import numbers

import torch

from humming_aot.moe import cuda_steps


def _check_topk_ids(topk_ids: torch.Tensor, num_experts: int, check_range: bool = True) -> None:
    """check_range=False leaves out the ids' range, which reads them back (a host round trip on a
    GPU, not allowed while a CUDA graph is being captured)."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        got = f"{tuple(topk_ids.shape)} {topk_ids.dtype}" if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__
        raise ValueError(f"topk_ids must be (M, top_k) int32 or int64 (a tensor), got {got}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral) or num_experts < 1:
        raise ValueError(f"num_experts must be an int of at least 1, got {num_experts!r}")
    if check_range and topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids hold expert ids outside [0, {num_experts - 1}] "
                         f"(min {int(topk_ids.min())}, max {int(topk_ids.max())})")


@dataclasses.dataclass(frozen=True)
class IndexedRouting:
    """The indexed (fused_moe) layout of one routing.

    sorted_token_ids: (max_padded,) int32: flat slot indices, each expert's in increasing order and
                      padded to a multiple of block_size with pad = M * top_k; after
                      num_tokens_post_padded, pad only
    expert_ids:       (max_padded // block_size,) int32: the expert of each block (its local id
                      through expert_map), -1 for a block to skip; blocks past the padded total: -1
    num_tokens_post_padded: (1,) int32, on the device (the kernels read it there)
    expert_offsets:   (E + 1,) int32 on the device, or None: each expert's first row and then the
                      padded total, where the blocks are in expert order (align_block_size with no
                      expert_map). gemm_indexed_kernel then runs the grouped kernel's offsets form,
                      which takes any block_size; without them the block-aligned form
    """

    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_size: int
    top_k: int
    num_tokens: int
    expert_offsets: torch.Tensor | None = None


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                     expert_map: torch.Tensor | None = None, *, check_range: bool = True) -> IndexedRouting:
    """vLLM's moe_align_block_size: sort the M * top_k routed slots by expert (stable: each
    expert's slots in increasing flat order), pad each expert's run to a multiple of block_size
    with M * top_k, and name each block's expert. Experts with no slot get no block. The arrays
    are sized for the worst case, M * top_k + E * (block_size - 1) rows, so that a CUDA graph can
    hold them. ``expert_map`` (E,) maps a global expert to this rank's local id, -1 where another
    rank holds it (its blocks are skipped). check_range=False skips reading the ids back (the one
    host round trip on a GPU; CUDA-graph capturable): the kernel then drops an id outside
    [0, E), and the torch path fails on it."""
    _check_topk_ids(topk_ids, num_experts, check_range=check_range)
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be at least 1 (an int), got {block_size!r}")
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.shape[0] != num_experts):
        raise ValueError(f"expert_map must be ({num_experts},), got {tuple(expert_map.shape)}")
    device = topk_ids.device
    m, top_k = topk_ids.shape
    slots = m * top_k
    max_padded = slots + num_experts * (block_size - 1)
    if cuda_steps.route_supported(topk_ids, num_experts, block_size):
        out = cuda_steps.route(topk_ids, num_experts, block_size, pad_slot=slots, slot_of_row32=True,
                               block_expert_len=-(-max_padded // block_size), expert_map=expert_map, total=True,
                               offsets32=expert_map is None)
        return IndexedRouting(sorted_token_ids=out["slot_of_row32"], expert_ids=out["block_expert"],
                              num_tokens_post_padded=out["total"], block_size=block_size, top_k=top_k, num_tokens=m,
                              expert_offsets=out.get("offsets32"))
    flat = topk_ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded  # where each expert's run begins
    total = padded.sum().reshape(1).to(torch.int32)
    order = torch.argsort(flat, stable=True)  # slots by expert, increasing within each
    rank = torch.arange(slots, device=device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    sorted_ids = torch.full((max_padded,), slots, dtype=torch.int32, device=device)
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    blocks = -(-max_padded // block_size)
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=device), padded // block_size)
    if expert_map is not None:
        block_expert = expert_map.to(device=device, dtype=torch.long)[block_expert]
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=device)
    expert_ids[: block_expert.shape[0]] = block_expert.to(torch.int32)
    offsets = None
    if expert_map is None:  # each expert's first row, then the padded total
        offsets = torch.cat([starts, total.to(starts.dtype)]).to(torch.int32)
    return IndexedRouting(sorted_token_ids=sorted_ids, expert_ids=expert_ids,
                          num_tokens_post_padded=total,
                          block_size=block_size, top_k=top_k, num_tokens=m, expert_offsets=offsets)


@dataclasses.dataclass(frozen=True)
class GroupedRouting:
    """The grouped contiguous layout of one routing: row r of the grouped activations is flat slot
    slot_of_row[r] (token slot_of_row[r] // top_k), rows expert after expert, each expert's in
    increasing slot order; expert e owns rows [offsets[e], offsets[e + 1]); row_expert[r] is its
    expert; row_of_slot inverts slot_of_row (what combine reads). A kernel-made routing drops ids
    outside [0, E): their slots have row -1, and the rows past offsets[E] slot and expert -1."""

    slot_of_row: torch.Tensor  # (M * top_k,) int64
    offsets: torch.Tensor  # (E + 1,) int64
    row_expert: torch.Tensor  # (M * top_k,) int32
    top_k: int
    row_of_slot: torch.Tensor  # (M * top_k,) int32
    offsets_int32: torch.Tensor  # (E + 1,) int32: offsets, as gemm_grouped_kernel takes them


def group_rows(topk_ids: torch.Tensor, num_experts: int, *, check_range: bool = True) -> GroupedRouting:
    """The grouped contiguous layout of a top-k routing (see GroupedRouting): the routing kernels on
    a GPU (moe/cuda_steps.py), else torch operations. check_range=False skips reading the ids back
    to check their range, the one host synchronization (a CUDA-graph capturable caller): an id
    out of range is then dropped by the kernels (its slot gets no row) and fails on the device
    on the torch path."""
    _check_topk_ids(topk_ids, num_experts, check_range=check_range)
    if cuda_steps.route_supported(topk_ids, num_experts):
        out = cuda_steps.route(topk_ids, num_experts, 1, pad_slot=-1, slot_of_row64=True, row_expert=True,
                               row_of_slot=True, offsets64=True, offsets32=True)
        return GroupedRouting(slot_of_row=out["slot_of_row64"], offsets=out["offsets64"], row_expert=out["row_expert"],
                              top_k=topk_ids.shape[1], row_of_slot=out["row_of_slot"],
                              offsets_int32=out["offsets32"])
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    # (scatter_add_, not bincount: bincount on a GPU reads the largest id back to the host)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.zeros(num_experts + 1, dtype=torch.long, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return GroupedRouting(slot_of_row=order, offsets=offsets, row_expert=flat[order].to(torch.int32),
                          top_k=topk_ids.shape[1], row_of_slot=_inverse(order, order.numel(), order.numel()),
                          offsets_int32=offsets.to(torch.int32))


def _inverse(slot_of_row: torch.Tensor, slots: int, rows: int) -> torch.Tensor:
    """(slots,) int32: the row holding each slot (-1 for none), from (rows,) slot_of_row (-1: padding)."""
    inverse = torch.full((slots + 1,), -1, dtype=torch.int32, device=slot_of_row.device)
    inverse[torch.where(slot_of_row >= 0, slot_of_row, slots)] = torch.arange(rows, dtype=torch.int32,
                                                                               device=slot_of_row.device)
    return inverse[:slots]


def permute(hidden: torch.Tensor, routing: GroupedRouting) -> torch.Tensor:
    """(M, K) tokens -> (M * top_k, K) grouped rows: row r is token slot_of_row[r] // top_k (zeros
    for a row of no slot: the tail a kernel-made routing leaves for dropped ids)."""
    tokens = routing.row_of_slot.shape[0] // routing.top_k
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or hidden.shape[0] != tokens:
        got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise ValueError(f"permute: hidden must be ({tokens}, K), one row per token the routing was made for, got "
                         f"{got} (flatten batch and sequence into one dimension first)")
    return gather_rows(hidden, routing.slot_of_row, routing.top_k)


def gather_rows(hidden: torch.Tensor, slot_of_row: torch.Tensor, top_k: int) -> torch.Tensor:
    """(rows, K) = hidden[slot_of_row // top_k], zeros where slot_of_row (int64) is -1: the gather
    kernel where it takes these tensors, else torch operations (no host round trip either way)."""
    out = cuda_steps.gather(hidden, slot_of_row, top_k)
    if out is not None:
        return out
    return _gather_rows(hidden, slot_of_row, top_k)


def _gather_rows(hidden: torch.Tensor, slot_of_row: torch.Tensor, top_k: int) -> torch.Tensor:
    """hidden[slot_of_row // top_k], zeros where slot_of_row is -1, with torch operations (no host
    round trip)."""
    real = slot_of_row >= 0
    if hidden.shape[0] == 0:  # no token: padding rows only
        return hidden.new_zeros(slot_of_row.shape[0], hidden.shape[-1])
    return hidden.index_select(0, torch.where(real, slot_of_row // top_k, 0)).masked_fill_(~real.unsqueeze(1), 0)


def unpermute(rows: torch.Tensor, routing: GroupedRouting) -> torch.Tensor:
    """(M * top_k, N) grouped rows -> (M, top_k, N) in slot order (the inverse of the grouping); a
    slot of no row (an id a kernel-made routing dropped) is zeros."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != routing.slot_of_row.shape[0]:
        got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"unpermute: rows must be ({routing.slot_of_row.shape[0]}, N), the routing's grouped rows, "
                         f"got {got}")
    present = routing.row_of_slot >= 0
    out = rows.index_select(0, torch.where(present, routing.row_of_slot, 0).long())
    return out.masked_fill_(~present.unsqueeze(1), 0).reshape(-1, routing.top_k, rows.shape[-1])


@dataclasses.dataclass(frozen=True)
class AlignedGrouping:
    """The grouped contiguous layout with every expert's rows padded to whole blocks of
    ``block`` rows (the layout ``gemm_grouped_kernel`` takes; ``moe.grouped_block_m`` names its
    block), in arrays of a fixed size, M * top_k + E * (block - 1) rows, that a CUDA graph can
    hold: expert e's rows start at a multiple of ``block``; padding rows (in an expert's last block,
    and every row past the last expert's) have row_expert -1 and slot -1."""

    row_expert: torch.Tensor  # (rows,) int32: each row's expert, -1 for padding
    slot_of_row: torch.Tensor  # (rows,) int64: each row's flat slot (token slot // top_k), -1 for padding
    block: int
    top_k: int
    row_of_slot: torch.Tensor  # (M * top_k,) int32: the row of each slot (what combine reads)


def align_groups(topk_ids: torch.Tensor, num_experts: int, block: int) -> AlignedGrouping:
    """The block-aligned grouped contiguous layout of a top-k routing (see AlignedGrouping), with no
    host synchronization (the sizes depend on M, top_k, E and the block alone; CUDA-graph
    capturable): each expert's slots in increasing flat order, as group_rows orders them. The
    ids' range is checked on the CPU only (on a GPU that would read them back; an id out of range
    there is dropped by the routing kernels, and fails as a device-side assert on the torch path)."""
    _check_topk_ids(topk_ids, num_experts, check_range=not topk_ids.is_cuda)
    if type(block) is not int or block < 1:
        raise ValueError(f"align_groups: block must be a positive int (moe.grouped_block_m), got {block!r}")
    if cuda_steps.route_supported(topk_ids, num_experts, block):
        out = cuda_steps.route(topk_ids, num_experts, block, pad_slot=-1, slot_of_row64=True, row_expert=True,
                               row_of_slot=True)
        return AlignedGrouping(row_expert=out["row_expert"], slot_of_row=out["slot_of_row64"], block=block,
                               top_k=topk_ids.shape[1], row_of_slot=out["row_of_slot"])
    flat = topk_ids.reshape(-1).long()
    device = flat.device
    rows = flat.numel() + num_experts * (block - 1)
    order = torch.argsort(flat, stable=True)
    sorted_expert = flat[order]
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(counts, 0) - counts
    padded_starts = torch.cumsum(padded, 0) - padded
    rank = torch.arange(flat.numel(), device=device) - starts[sorted_expert]
    dest = padded_starts[sorted_expert] + rank
    row_expert = torch.full((rows,), -1, dtype=torch.int32, device=device)
    row_expert[dest] = sorted_expert.to(torch.int32)
    slot_of_row = torch.full((rows,), -1, dtype=torch.long, device=device)
    slot_of_row[dest] = order
    return AlignedGrouping(row_expert=row_expert, slot_of_row=slot_of_row, block=block, top_k=topk_ids.shape[1],
                           row_of_slot=_inverse(slot_of_row, flat.numel(), rows))


def align_offsets(offsets: torch.Tensor, rows: int, block: int) -> AlignedGrouping:
    """The block-aligned layout of rows already grouped expert after expert by prefix offsets (E + 1,)
    (expert e owns rows offsets[e] to offsets[e + 1]; rows outside every expert's range belong to
    none), with torch operations only and no host synchronization (CUDA-graph capturable): each
    expert's rows moved to a start at a multiple of ``block``, in a fixed size of rows + E *
    (block - 1) rows. ``slot_of_row`` is the source row (top_k 1), so that permute_aligned gathers
    the rows and unpermute_aligned(out, grouping, rows) brings them back. The offsets are not
    checked on the device (rising, within [0, rows]): that is the caller's contract."""
    if type(block) is not int or block < 1:
        raise ValueError(f"align_offsets: block must be a positive int (moe.grouped_block_m), got {block!r}")
    if offsets.dim() != 1 or offsets.numel() < 2:
        raise ValueError(f"align_offsets: offsets must be (E + 1,) with E >= 1, got shape {tuple(offsets.shape)}")
    device = offsets.device
    offsets = offsets.long()
    experts = offsets.numel() - 1
    size = rows + experts * (block - 1)
    counts = offsets[1:] - offsets[:-1]
    padded = (counts + block - 1) // block * block
    padded_starts = torch.cumsum(padded, 0) - padded
    source = torch.arange(rows, device=device)
    expert = torch.searchsorted(offsets[1:], source, right=True).clamp_(max=experts - 1)
    owned = (source >= offsets[0]) & (source < offsets[-1])
    dest = torch.where(owned, padded_starts[expert] + source - offsets[expert], size)  # size: a spare row
    row_expert = torch.full((size + 1,), -1, dtype=torch.int32, device=device)
    row_expert[dest] = torch.where(owned, expert, -1).to(torch.int32)
    slot_of_row = torch.full((size + 1,), -1, dtype=torch.long, device=device)
    slot_of_row[dest] = torch.where(owned, source, -1)
    return AlignedGrouping(row_expert=row_expert[:size], slot_of_row=slot_of_row[:size], block=block, top_k=1,
                           row_of_slot=_inverse(slot_of_row[:size], rows, size))


def permute_aligned(hidden: torch.Tensor, grouping: AlignedGrouping) -> torch.Tensor:
    """(M, K) tokens -> (rows, K) aligned grouped rows: row r is token slot_of_row[r] // top_k, and
    zeros for padding rows (whose outputs are then the bias, or zeros)."""
    out = cuda_steps.gather(hidden, grouping.slot_of_row, grouping.top_k)
    if out is not None:
        return out
    return _gather_rows(hidden, grouping.slot_of_row, grouping.top_k)


def unpermute_aligned(rows: torch.Tensor, grouping: AlignedGrouping, num_tokens: int) -> torch.Tensor:
    """(rows, N) aligned grouped rows -> (M, top_k, N) in slot order (padding rows dropped)."""
    slots = num_tokens * grouping.top_k
    out = torch.empty(slots + 1, rows.shape[-1], dtype=rows.dtype, device=rows.device)
    out.index_copy_(0, torch.where(grouping.slot_of_row >= 0, grouping.slot_of_row, slots), rows)
    return out[:slots].reshape(num_tokens, grouping.top_k, rows.shape[-1])


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(..., 2 I) -> (..., I): silu(gate) * up with gate the first half, computed in fp32 and
    rounded once to the input dtype."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: the last dimension holds gate and up halves, got {gate_up.shape[-1]}")
    out = cuda_steps.activation(gate_up, "silu")
    if out is not None:
        return out
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def swiglu_oai(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's activation: (..., 2 I) with gate and up interleaved (even and odd columns) ->
    (..., I) = (up + 1) * gate * sigmoid(alpha * gate), gate clamped above at `limit` and up to
    [-limit, limit]; fp32, rounded once to the input dtype."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_oai: the last dimension interleaves gate and up, got {gate_up.shape[-1]}")
    out = cuda_steps.activation(gate_up, "swiglu_oai", alpha, limit)
    if out is not None:
        return out
    x = gate_up.float()
    gate, up = x[..., 0::2].clamp(max=limit), x[..., 1::2].clamp(min=-limit, max=limit)
    return ((up + 1) * gate * torch.sigmoid(alpha * gate)).to(gate_up.dtype)


def weighted_sum(outputs: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """(M, top_k, N) expert outputs x (M, top_k) routing weights -> (M, N): in fp32, slots added in
    order 0..top_k-1 (deterministic), rounded once to the outputs' dtype."""
    if outputs.dim() != 3 or topk_weights.shape != outputs.shape[:2]:
        raise ValueError(f"weighted_sum: outputs (M, top_k, N) and weights (M, top_k), got "
                         f"{tuple(outputs.shape)} and {tuple(topk_weights.shape)}")
    total = torch.zeros(outputs.shape[0], outputs.shape[2], dtype=torch.float32, device=outputs.device)
    for j in range(outputs.shape[1]):
        total += outputs[:, j].float() * topk_weights[:, j : j + 1].float()
    return total.to(outputs.dtype)


def combine(rows: torch.Tensor, routing: GroupedRouting | AlignedGrouping, topk_weights: torch.Tensor) -> torch.Tensor:
    """(R, N) grouped rows (the second GEMM's output) -> (M, N): each token's top-k rows times its
    routing weights, summed in fp32 in slot order and rounded once to the rows' dtype, exactly
    weighted_sum(unpermute(rows, routing), topk_weights) (unpermute_aligned for an AlignedGrouping),
    without the (M, top_k, N) intermediate; a slot with no row (an id a kernel-made routing
    dropped) adds nothing. topk_weights (M, top_k): fp32 or the rows' dtype."""
    slots = routing.row_of_slot.shape[0]
    if rows.dim() != 2 or topk_weights.dim() != 2 or topk_weights.shape[1] != routing.top_k \
            or topk_weights.shape[0] * routing.top_k != slots:
        raise ValueError(f"combine: rows must be (R, N) and topk_weights (M, {routing.top_k}) for the routing's "
                         f"{slots} slots, got {tuple(rows.shape)} and {tuple(topk_weights.shape)}")
    if rows.shape[0] < routing.slot_of_row.shape[0]:
        raise ValueError(f"combine: the routing has {routing.slot_of_row.shape[0]} rows, rows has {rows.shape[0]}")
    out = cuda_steps.combine(rows, routing.row_of_slot, topk_weights)
    if out is not None:
        return out
    tokens = topk_weights.shape[0]
    present = routing.row_of_slot >= 0
    gathered = rows.index_select(0, torch.where(present, routing.row_of_slot, 0).long())
    gathered = gathered.masked_fill(~present.unsqueeze(1), 0).reshape(tokens, routing.top_k, rows.shape[1])
    # a slot of no row adds nothing, whatever its weight (the kernel skips it)
    weights = topk_weights.masked_fill(~present.reshape(tokens, routing.top_k), 0)
    return weighted_sum(gathered, weights)


def check_indexed_arguments(what: str, routing, a_rows_per_token, rows: str = "a") -> None:
    """The indexed GEMMs' common checks (CPU loop and kernels): `routing` an IndexedRouting and
    a_rows_per_token its top_k (`rows` holds one row per token) or 1 (one per slot)."""
    if not isinstance(routing, IndexedRouting):
        raise ValueError(f"{what}: routing must be an IndexedRouting (moe.align_block_size), got "
                         f"{type(routing).__name__}")
    if type(a_rows_per_token) is not int or a_rows_per_token not in (1, routing.top_k):
        raise ValueError(f"{what}: a_rows_per_token must be the routing's top_k ({routing.top_k}: {rows} holds one row "
                         f"per token) or 1 (one row per slot), got {a_rows_per_token!r}")


def check_topk_weights(what: str, routing: "IndexedRouting", topk_weights, device: torch.device) -> None:
    """topk_weights None or (M, top_k) floating on `device`, M and top_k the routing's."""
    if topk_weights is not None and (not isinstance(topk_weights, torch.Tensor)
                                     or topk_weights.shape != (routing.num_tokens, routing.top_k)
                                     or not topk_weights.is_floating_point() or topk_weights.device != device):
        from humming_aot.moe.kernels import _describe

        raise ValueError(f"{what}: topk_weights must be ({routing.num_tokens}, {routing.top_k}) floating on "
                         f"{device}, got {_describe(topk_weights)}")
