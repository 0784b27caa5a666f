"""Time the MoE expert GEMMs of real models side by side, in one run: humming_aot against Humming
(humming-kernels) and torch._grouped_mm (bf16 weights), over token counts.

    python3 tools/bench/bench_moe.py --models deepseek-v3-tp8,qwen3-30b-a3b --tokens 1,16,256,4096 --json moe.json

Every implementation computes one layout (--layout): grouped contiguous (the routed rows of one
routing, expert after expert, with prefix offsets (E + 1,)) or grouped masked ((E, max_m, K), each
expert's rows first, with per-expert counts (E,); max_m is the largest count, rounded up to 16):

  humming_aot        on pack_experts(quantize(w, fmt)), one launch: contiguous,
                     humming_aot.moe.gemm_grouped_kernel on the routing's prefix offsets (int32,
                     as Humming takes them, int64); masked, humming_aot.moe.gemm_masked_kernel.
                     Expected rows per expert: tokens x top_k / E
  humming_aot_aligned (contiguous only) gemm_grouped_kernel on the routing's rows aligned to its
                     block (moe.align_groups, outside the timing: the padding rows are part of
                     what it multiplies)
  humming_aot_loop   the expert loop (humming_aot.moe.gemm_grouped / gemm_masked: one dense catalog
                     GEMM per expert with rows; it reads the offsets or counts on the host, so it is
                     timed as an eager loop, see the mode column), for comparison
  humming            humming.layer.HummingLayer(num_experts=E), gemm_type grouped_contiguous or grouped_masked
  torch_grouped_mm   torch._grouped_mm on the bf16 weights (sm_90+; masked: every expert's max_m
                     rows, batched)
  humming_aot_a8     (with --activations, e.g. float8e4m3:token) pack_a8_experts(quantize(w, fmt)):
                     W4A8 or W8A8 experts on gemm_grouped_a8_kernel / gemm_masked_a8_kernel, on the
                     rows quantized once per routing outside the timing; humming_aot_a8+quant
                     quantizes them inside it (ops.quantize_activation, then the GEMM);
                     humming_aot_a8_sync runs the portable mma.sync body's table tile (for
                     comparison where the default is the wgmma-w4a8 body: float8 W4A8 on sm90a);
                     humming_aot_a8_aligned (contiguous only) runs the row-expert form on the
                     routing aligned to moe.grouped_a8_block_m's block (align_groups, outside the
                     timing, as for humming_aot_aligned: DeepGEMM's contiguous layout)
  humming_a8         Humming's layer with input_config dtype = the activations' element,
                     dynamic_token (it quantizes inside its call)

Routing: --tokens tokens, each to top_k distinct experts drawn from random scores (seeded). Each
point rotates --routings routings (different experts, so small token counts meet cold weights),
timed with CUDA-graph replays where the implementation can be captured (humming_aot.testing.bench).
The relerr column compares each implementation's output, over the rows of the first two experts
with rows, with float64 on its own weights (humming_aot: the exact operands; the others: the
unquantized weights, so their column holds the quantization error too). Benchmarks never assert.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot.testing.bench import sibling_tool, time_cuda_graph, write_results_json  # noqa: E402

bench_gemm = sibling_tool("bench_gemm", __file__)

# model -> (experts, top_k, ((gemm, N, K), ...)): GEMM1 is gate_up (N = 2 x intermediate), GEMM2 down
MODELS = {
    "deepseek-v3": (256, 8, (("gemm1", 4096, 7168), ("gemm2", 7168, 2048))),
    "deepseek-v3-tp8": (256, 8, (("gemm1", 512, 7168), ("gemm2", 7168, 256))),
    "qwen3-30b-a3b": (128, 8, (("gemm1", 1536, 2048), ("gemm2", 2048, 768))),
    "qwen3-235b-a22b": (128, 8, (("gemm1", 3072, 4096), ("gemm2", 4096, 1536))),  # (hidden 4096, experts' 1536)
    "gpt-oss-120b": (128, 4, (("gemm1", 5760, 2880), ("gemm2", 2880, 2880))),
}
DEFAULT_TOKENS = "1,4,16,64,256,1024,4096,16384"  # (at top-8 of 128 or 256 experts, rows an expert on the tile table's bounds)
TOKEN_SETS = {"issue": DEFAULT_TOKENS, "between": "2,8,24,48,80,128,192,320,512,768,2048,8192"}  # --tokens issue|between


def model_spec(name: str) -> tuple[int, int, tuple[tuple[str, int, int], ...]]:
    """A MODELS entry, or a shape of one's own written 'ExTOP_K:NxK' (e.g. '256x8:7168x512': one
    GEMM named 'gemm' of 256 experts, top-8), for experiments off the model table (how a time
    moves with K at a fixed N, say). A ValueError for anything else."""
    if name in MODELS:
        return MODELS[name]
    try:
        routing, shape = name.split(":")
        experts, top_k = (int(x) for x in routing.split("x"))
        n, k = (int(x) for x in shape.split("x"))
    except ValueError:
        raise ValueError(f"model {name!r}: not one of {', '.join(MODELS)}, nor ExTOP_K:NxK") from None
    if not (1 <= top_k <= experts and n > 0 and k > 0):
        raise ValueError(f"model {name!r}: needs 1 <= top_k <= experts and positive N, K")
    return experts, top_k, (("gemm", n, k),)
ALL_IMPLS = ("humming_aot", "humming", "torch_grouped_mm", "humming_aot_loop", "humming_aot_aligned",
             "humming_aot_indexed", "humming_aot_a8", "humming_aot_a8+quant", "humming_aot_a8_sync",
             "humming_aot_a8_aligned", "humming_a8")
DEFAULT_IMPLS = ALL_IMPLS[:3]
# the impls --tile forces a tile on
TILED_IMPLS = ("humming_aot", "humming_aot_aligned", "humming_aot_indexed", "humming_aot_a8", "humming_aot_a8+quant",
               "humming_aot_a8_aligned")


@dataclasses.dataclass(frozen=True)
class Routed:
    """One routing's rows on the device: grouped contiguous a (R, K) with offsets (E + 1,) int64,
    and the same rows grouped masked, masked_a (E, max_m, K) with counts (E,) int32."""

    a: torch.Tensor
    offsets: torch.Tensor
    masked_a: torch.Tensor
    counts: torch.Tensor
    expected_m: int  # the mean rows per expert, at least 1
    topk_ids: torch.Tensor  # (tokens, top_k) on the device
    hidden: torch.Tensor  # (tokens, K) on the device


def route(tokens: int, experts: int, top_k: int, k: int, seed: int, device: torch.device,
          dtype: torch.dtype = torch.bfloat16) -> Routed:
    """Random top-k routing of `tokens` tokens; the routed rows (token rows repeated per slot)
    grouped expert after expert, each expert's slots in flat order."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    topk_ids = torch.randn(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    hidden = torch.randn(tokens, k, generator=gen).to(dtype)
    slots = topk_ids.reshape(-1)
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots, minlength=experts)
    offsets = torch.zeros(experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts, 0)
    rows = hidden.index_select(0, order // top_k)
    max_m = max(16, -(-int(counts.max()) // 16) * 16)
    masked = torch.zeros(experts, max_m, k, dtype=dtype)
    for e in range(experts):
        masked[e, : int(counts[e])] = rows[int(offsets[e]):int(offsets[e + 1])]
    return Routed(a=rows.to(device), offsets=offsets.to(device), masked_a=masked.to(device),
                  counts=counts.to(torch.int32).to(device), expected_m=max(1, -(-tokens * top_k // experts)),
                  topk_ids=topk_ids.to(device), hidden=hidden.to(device))


@dataclasses.dataclass
class MoeImpl:
    name: str
    call: Callable[[Routed], torch.Tensor]  # the layout's output: (R, N), or (E, max_m, N) masked
    weight: Callable[[int], torch.Tensor]  # expert -> the (N, K) weight its relerr is taken against
    note: str = ""
    # the call's output in the layout's row order, where the call works on other rows (relerr only)
    to_layout: Callable[[Routed, torch.Tensor], torch.Tensor] | None = None
    reset: Callable[[], None] | None = None  # drops what the impl kept for the routings timed so far


LAYOUTS = ("contiguous", "masked")


def prepare_humming_aot(w: torch.Tensor, fmt: str, layout: str, loop: bool = False, aligned: bool = False,
                        tile: str | None = None, splits: int | None = None) -> MoeImpl:
    import humming_aot
    from humming_aot.enumerate import parse_tile_field
    from humming_aot.moe import (
        align_groups,
        gemm_grouped,
        gemm_grouped_kernel,
        gemm_masked,
        gemm_masked_kernel,
        grouped_block_m,
        pack_experts,
        permute_aligned,
    )

    if aligned and layout != "contiguous":
        raise bench_gemm.Unavailable("the aligned rows are a contiguous layout's")
    if splits is not None and (aligned or loop or layout != "contiguous"):
        raise bench_gemm.Unavailable("K slices are the offsets form's (humming_aot on the contiguous layout)")
    forced = " ".join(([f"tile {tile}"] if tile else []) + ([f"splits {splits}"] if splits else []))  # the note column
    experts = pack_experts(humming_aot.quantize(w.float(), fmt), act_dtype=w.dtype)
    weight = lambda e: experts.expert(e).effective_weight(scales_in_fp32=False)  # noqa: E731
    name = "humming_aot_loop" if loop else "humming_aot_aligned" if aligned else "humming_aot"
    if layout == "masked" and loop:
        return MoeImpl(name, lambda r: gemm_masked(r.masked_a, experts, r.counts), weight)
    if layout == "masked":
        # an output per routing, made once: the timed call is the GEMM alone, as Humming's (whose
        # output is new_empty) and the contiguous layout's are; a new output of gemm_masked_kernel
        # is zero-filled (E * max_m * N: 58 MB for DeepSeek-V3's GEMM2, ~20 us)
        outs: dict[int, torch.Tensor] = {}

        def masked_call(r: Routed) -> torch.Tensor:
            if id(r) not in outs:
                outs[id(r)] = (r, r.masked_a.new_empty(*r.masked_a.shape[:2], experts.out_features))
            return gemm_masked_kernel(r.masked_a, experts, r.counts, expected_m=r.expected_m, out=outs[id(r)][1],
                                      tile=tile)
        return MoeImpl(name, masked_call, weight, forced, None, outs.clear)
    if loop:
        return MoeImpl(name, lambda r: gemm_grouped(r.a, experts, offsets=r.offsets), weight)
    if not aligned:
        # per routing, made once: the offsets in int32 (the kernel's) and an output (every row
        # belongs to an expert: no zero-fill), so that the timed call is the GEMM alone
        kept: dict[int, tuple] = {}

        def offsets_call(r: Routed) -> torch.Tensor:
            if id(r) not in kept:
                kept[id(r)] = (r, r.offsets.to(torch.int32), r.a.new_empty(r.a.shape[0], experts.out_features))
            _, offsets, out = kept[id(r)]
            try:
                return gemm_grouped_kernel(r.a, experts, offsets=offsets, expected_m=r.expected_m, out=out, tile=tile,
                                           splits=splits)
            except ValueError as why:  # a forced count this point's tile does not take: its row says why
                if splits is None:
                    raise
                raise bench_gemm.Unavailable(str(why)) from why
        return MoeImpl(name, offsets_call, weight, forced, None, kept.clear)
    # the grouped kernel on the routing aligned to its block (align_groups and permute_aligned run once
    # per routing, outside the timing: they are the routing's step, not the GEMM's)
    # per routing: the aligned rows, their grouping and an output (made once, so that the timed call
    # is the GEMM alone: no zero-fill of the padded output)
    kept_rows: dict[int, tuple] = {}

    def rows_of(r: Routed):
        if id(r) not in kept_rows:
            block = parse_tile_field(tile).block_m if tile else grouped_block_m(experts, r.expected_m)
            grouping = align_groups(r.topk_ids, experts.experts, block)
            rows = permute_aligned(r.hidden, grouping)
            kept_rows[id(r)] = (r, rows, grouping, rows.new_empty(rows.shape[0], experts.out_features))
        return kept_rows[id(r)][1:]

    def call(r: Routed) -> torch.Tensor:
        rows, grouping, out = rows_of(r)
        return gemm_grouped_kernel(rows, experts, grouping.row_expert, expected_m=r.expected_m, out=out, tile=tile)

    def to_layout(r: Routed, out: torch.Tensor) -> torch.Tensor:
        return out[rows_of(r)[1].slot_of_row >= 0]  # the real rows, in group_rows' order
    return MoeImpl(name, call, weight, f"aligned rows {forced}".strip(), to_layout, kept_rows.clear)


def prepare_humming_aot_loop(w: torch.Tensor, fmt: str, layout: str) -> MoeImpl:
    return prepare_humming_aot(w, fmt, layout, loop=True)


def prepare_humming_aot_aligned(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None) -> MoeImpl:
    return prepare_humming_aot(w, fmt, layout, aligned=True, tile=tile)


def prepare_humming(w: torch.Tensor, fmt: str, layout: str) -> MoeImpl:
    if fmt not in bench_gemm.HUMMING_WEIGHT_CONFIG:
        raise bench_gemm.Unavailable(f"no humming weight_config mapped for {fmt}")
    try:
        from humming.layer import HummingLayer
    except Exception as exc:  # noqa: BLE001
        raise bench_gemm.Unavailable(f"import humming failed: {exc}") from exc
    e, n, k = w.shape
    layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(bench_gemm.HUMMING_WEIGHT_CONFIG[fmt]),
                         torch_dtype=w.dtype, num_experts=e).cuda()
    layer.load_from_unquantized(w)
    layer.transform()
    start = time.perf_counter()
    try:
        return _humming_impl(layer, w, layout, start)
    except Exception as exc:  # noqa: BLE001 - another library's refusal is a row of the table, not a crash
        raise bench_gemm.Unavailable(f"humming failed on this configuration: {type(exc).__name__}: {exc}") from exc


def _humming_impl(layer, w: torch.Tensor, layout: str, start: float) -> MoeImpl:
    e, n, k = w.shape
    if layout == "masked":
        config = {"gemm_type": "grouped_masked"}
        # Humming's masked GEMM takes the (E, max_m, K) batch flattened to (E * max_m, K) rows
        layer(torch.zeros(e * 16, k, device=w.device, dtype=w.dtype),
              expert_layout=torch.ones(e, device=w.device, dtype=torch.int32), compute_config=config)

        def call(r: Routed) -> torch.Tensor:
            experts, max_m, _ = r.masked_a.shape
            out = layer(r.masked_a.reshape(experts * max_m, k), expert_layout=r.counts, compute_config=config)
            return out.view(experts, max_m, -1)
    else:
        config = {"gemm_type": "grouped_contiguous"}
        layer(torch.zeros(1, k, device=w.device, dtype=w.dtype),
              expert_layout=torch.tensor([0] + [1] * e, device=w.device, dtype=torch.int64), compute_config=config)
        call = lambda r: layer(r.a, expert_layout=r.offsets, compute_config=config)  # noqa: E731
    torch.cuda.synchronize()
    note = f"first call (JIT) {time.perf_counter() - start:.1f} s"
    return MoeImpl("humming", call, lambda x: w[x], note)


def prepare_torch_grouped_mm(w: torch.Tensor, fmt: str, layout: str) -> MoeImpl:
    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability()[0] < 9:
        raise bench_gemm.Unavailable("torch._grouped_mm needs torch with it and an sm_90+ GPU")
    w_t = w.transpose(1, 2)  # (E, K, N), each expert's K x N column-major
    # its int32 end offsets, made once per routing (outside the timing, as ours are)
    ends: dict[int, tuple] = {}

    def call(r: Routed) -> torch.Tensor:
        if layout == "masked":
            return torch._grouped_mm(r.masked_a, w_t)  # batched: every expert's max_m rows
        if id(r) not in ends:
            ends[id(r)] = (r, r.offsets[1:].to(torch.int32))
        return torch._grouped_mm(r.a, w_t, offs=ends[id(r)][1])
    return MoeImpl("torch_grouped_mm", call, lambda x: w[x], "bf16 weights", None, ends.clear)


def prepare_humming_aot_indexed(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None) -> MoeImpl:
    """vLLM fused_moe's indexed layout (moe.gemm_indexed_kernel: gather, the grouped kernel's
    offsets form on align_block_size's blocks, scatter), from the tokens' rows: the first GEMM's form (one row per token). The
    routing's align_block_size runs once per routing, outside the timing (the routing's step)."""
    import humming_aot
    from humming_aot.enumerate import parse_tile_field
    from humming_aot.moe import align_block_size, gemm_indexed_kernel, grouped_block_m, pack_experts

    if layout != "contiguous":
        raise bench_gemm.Unavailable("the indexed layout is compared on the contiguous layout's rows")
    experts = pack_experts(humming_aot.quantize(w.float(), fmt), act_dtype=w.dtype)
    weight = lambda e: experts.expert(e).effective_weight(scales_in_fp32=False)  # noqa: E731
    kept: dict[int, tuple] = {}

    def routing_of(r: Routed):
        if id(r) not in kept:
            block = parse_tile_field(tile).block_m if tile else grouped_block_m(experts, r.expected_m)
            kept[id(r)] = (r, align_block_size(r.topk_ids, experts.experts, block, check_range=False))
        return kept[id(r)][1]

    def call(r: Routed) -> torch.Tensor:
        return gemm_indexed_kernel(r.hidden, experts, routing_of(r), a_rows_per_token=r.topk_ids.shape[1],
                                   expected_m=r.expected_m, tile=tile)

    def to_layout(r: Routed, out: torch.Tensor) -> torch.Tensor:  # slot order -> expert after expert
        return out.index_select(0, torch.argsort(r.topk_ids.reshape(-1), stable=True))
    return MoeImpl("humming_aot_indexed", call, weight, f"tile {tile}" if tile else "", to_layout, kept.clear)


# The 8-bit activation format of the a8 implementations (--activations; None: they are not run)
ACTIVATIONS: dict[str, str | None] = {"format": None}


def prepare_humming_aot_a8(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None,
                           quantize: bool = False, portable: bool = False, aligned: bool = False) -> MoeImpl:
    """Experts for 8-bit activations (moe.pack_a8_experts: W4A8 or W8A8) on the grouped kernels of
    the layout, on the routing's rows quantized once per routing outside the timing (as
    humming_aot_a8+quant does inside it: ops.quantize_activation of the rows, then the GEMM);
    aligned: the row-expert form on the routing's rows aligned to the tile's block."""
    import humming_aot
    from humming_aot import ops
    from humming_aot.enumerate import parse_tile_field
    from humming_aot.moe import (
        align_groups,
        gemm_grouped_a8_kernel,
        gemm_masked_a8_kernel,
        grouped_a8_block_m,
        pack_a8_experts,
        permute_aligned,
    )
    from humming_aot.moe.a8 import sync_tile

    activations = ACTIVATIONS["format"]
    if activations is None:
        raise bench_gemm.Unavailable("give --activations (e.g. float8e4m3:token) for the a8 implementations")
    if aligned and layout != "contiguous":
        raise bench_gemm.Unavailable("the aligned rows are a contiguous layout's")
    experts = pack_a8_experts(humming_aot.quantize(w.float(), fmt))
    weight = lambda e: experts.expert(e).effective_weight()  # noqa: E731
    kept: dict[int, tuple] = {}
    if aligned:  # (the routing's aligned rows quantized, their grouping and an output, made once)
        def aligned_rows(r: Routed):
            if id(r) not in kept:
                block = parse_tile_field(tile).block_m if tile else grouped_a8_block_m(experts, r.expected_m, activations)
                grouping = align_groups(r.topk_ids, experts.experts, block)
                rows = permute_aligned(r.hidden, grouping)
                kept[id(r)] = (r, ops.quantize_activation(rows, activations), grouping,
                               torch.empty(rows.shape[0], experts.n, dtype=w.dtype, device=w.device))
            return kept[id(r)][1:]

        def aligned_call(r: Routed) -> torch.Tensor:
            qa, grouping, out = aligned_rows(r)
            return gemm_grouped_a8_kernel(qa, experts, row_expert=grouping.row_expert, expected_m=r.expected_m,
                                          out=out, tile=tile)

        def to_layout(r: Routed, out: torch.Tensor) -> torch.Tensor:
            return out[aligned_rows(r)[1].slot_of_row >= 0]  # the real rows, in group_rows' order
        return MoeImpl("humming_aot_a8_aligned", aligned_call, weight,
                       f"{activations} aligned rows" + (f" tile {tile}" if tile else ""), to_layout, kept.clear)

    def operands(r: Routed):
        if id(r) not in kept:
            a = r.masked_a if layout == "masked" else r.a
            shape = (*a.shape[:-1], experts.n)
            kept[id(r)] = (r, ops.quantize_activation(a, activations), r.offsets.to(torch.int32),
                           torch.empty(shape, dtype=w.dtype, device=w.device))
        return kept[id(r)][1:]

    def call(r: Routed) -> torch.Tensor:
        qa, offsets, out = operands(r)
        if quantize:
            qa = ops.quantize_activation(r.masked_a if layout == "masked" else r.a, activations)
        forced = tile
        if portable and forced is None:  # the portable body's table tile (moe.a8.sync_tile)
            forced = sync_tile(experts, r.expected_m)
        if layout == "masked":
            return gemm_masked_a8_kernel(qa, experts, r.counts, expected_m=r.expected_m, out=out, tile=forced)
        return gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=r.expected_m, out=out, tile=forced)
    name = "humming_aot_a8_sync" if portable else "humming_aot_a8+quant" if quantize else "humming_aot_a8"
    return MoeImpl(name, call, weight, activations + (f" tile {tile}" if tile else ""), None, kept.clear)


def prepare_humming_aot_a8_quant(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None) -> MoeImpl:
    return prepare_humming_aot_a8(w, fmt, layout, tile, quantize=True)


def prepare_humming_aot_a8_sync(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None) -> MoeImpl:
    return prepare_humming_aot_a8(w, fmt, layout, tile, portable=True)


def prepare_humming_aot_a8_aligned(w: torch.Tensor, fmt: str, layout: str, tile: str | None = None) -> MoeImpl:
    return prepare_humming_aot_a8(w, fmt, layout, tile, aligned=True)


def prepare_humming_a8(w: torch.Tensor, fmt: str, layout: str) -> MoeImpl:
    """Humming's layer with its input config for 8-bit activations (dynamic per token; DeepSeek-V3's
    float8e4m3:b128x128 x float8e4m3:g128: its 128 x 128 weight groups and dynamic 1 x 128 groups),
    which quantizes the 16-bit rows inside its call."""
    activations = ACTIVATIONS["format"]
    if activations is None:
        raise bench_gemm.Unavailable("give --activations (e.g. float8e4m3:token) for the a8 implementations")
    element, _, granularity = activations.partition(":")
    input_config = {"dtype": element, "quant_mode": "dynamic_token"}
    if (fmt, activations) == ("float8e4m3:b128x128", "float8e4m3:g128"):
        weight_config = {"dtype": "float8e4m3", "group_size": 128, "group_size_n": 128}
        input_config = {"dtype": element, "group_size": 128, "quant_mode": "dynamic_group"}
    elif granularity == "token" and fmt in bench_gemm.HUMMING_WEIGHT_CONFIG:
        weight_config = dict(bench_gemm.HUMMING_WEIGHT_CONFIG[fmt])
    else:
        raise bench_gemm.Unavailable(f"no humming config mapped for {fmt} x {activations}")
    try:
        from humming.layer import HummingLayer
    except Exception as exc:  # noqa: BLE001
        raise bench_gemm.Unavailable(f"import humming failed: {exc}") from exc
    e, n, k = w.shape
    start = time.perf_counter()
    try:
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=weight_config, input_config=input_config,
                             torch_dtype=w.dtype, num_experts=e).cuda()
        layer.load_from_unquantized(w)
        layer.transform()
        impl = _humming_impl(layer, w, layout, start)
    except Exception as exc:  # noqa: BLE001 - another library's refusal is a row of the table, not a crash
        raise bench_gemm.Unavailable(f"humming failed on this configuration: {type(exc).__name__}: {exc}") from exc
    return dataclasses.replace(impl, name="humming_a8", note=f"{activations}, {impl.note}")


PREPARE = {"humming_aot": prepare_humming_aot, "humming": prepare_humming, "torch_grouped_mm": prepare_torch_grouped_mm,
           "humming_aot_loop": prepare_humming_aot_loop, "humming_aot_aligned": prepare_humming_aot_aligned,
           "humming_aot_indexed": prepare_humming_aot_indexed, "humming_aot_a8": prepare_humming_aot_a8,
           "humming_aot_a8+quant": prepare_humming_aot_a8_quant, "humming_aot_a8_sync": prepare_humming_aot_a8_sync,
           "humming_aot_a8_aligned": prepare_humming_aot_a8_aligned,
           "humming_a8": prepare_humming_a8}


def impl_variants(impls: str, tiles: str | None, splits: str | None = None) -> list[tuple[str, str | None, int | None]]:
    """(implementation, forced tile or None, forced K slices or None) for --impls, --tile and
    --splits: each tile of the comma list --tile ('default': the table's) makes the
    implementations that take one (TILED_IMPLS) an implementation of its own, and each count of
    --splits ('default': the offsets form's own choice) humming_aot's, timed side by side on the
    same routings."""
    out = []
    for name in impls.split(","):
        for tile in (tiles.split(",") if tiles and name in TILED_IMPLS else [None]):
            for count in (splits.split(",") if splits and name == "humming_aot" else [None]):
                out.append((name, None if tile == "default" else tile,
                            None if count in (None, "default") else int(count)))
    return out


def relerr(impl: MoeImpl, routed: Routed, layout: str) -> float | None:
    """max |out - ref| / max |ref| over the rows of the first two experts with rows."""
    out = impl.call(routed)
    if impl.to_layout is not None:
        out = impl.to_layout(routed, out)
    bounds = routed.offsets.tolist()
    errors, scale = [], 0.0
    for e in [e for e in range(len(bounds) - 1) if bounds[e + 1] > bounds[e]][:2]:
        if layout == "masked":
            a, got = routed.masked_a[e, : bounds[e + 1] - bounds[e]], out[e, : bounds[e + 1] - bounds[e]]
        else:
            a, got = routed.a[bounds[e]:bounds[e + 1]], out[bounds[e]:bounds[e + 1]]
        ref = a.double() @ impl.weight(e).double().T
        errors.append(float((got.double() - ref).abs().max()))
        scale = max(scale, float(ref.abs().max()))
    return max(errors) / scale if errors and scale > 0 else None


# Other libraries' implementations: a configuration one of them refuses (an exception in its
# set-up or at some token count) is reported as its row, and the run goes on.
EXTERNAL_IMPLS = ("humming", "torch_grouped_mm", "humming_a8")


def bench(args: argparse.Namespace, checkpoint=None, device: str = "cuda") -> list[dict[str, Any]]:
    """The rows of every point; checkpoint(rows so far) after each GEMM (a run cut short keeps them)."""
    device, dtype, results = torch.device(device), torch.bfloat16, []
    print(f"{'tokens':>6} {'model':>16} {'gemm':>5} {'N':>6} {'K':>6} {'E':>4} {'topk':>4} {'format':<12} "
          f"{'impl':<17} {'us':>9} {'relerr':>8}  mode")
    for model in args.models.split(","):
        experts, top_k, gemms = model_spec(model)
        for gemm, n, k in gemms:
            if args.gemms and gemm not in args.gemms.split(","):
                continue

            def row(tokens, fmt, impl, us, **extra):  # (a result row of this GEMM)
                return dict(tokens=tokens, model=model, gemm=gemm, layout=args.layout, n=n, k=k, experts=experts,
                            top_k=top_k, format=fmt, impl=impl, us=us, **extra)
            gen = torch.Generator(device="cpu").manual_seed(args.seed)
            w = (torch.randn(experts, n, k, generator=gen) * 0.02).to(dtype).to(device)
            for fmt in args.formats.split(","):
                impls = []
                for name, tile, splits in impl_variants(args.impls, args.tile, args.splits):
                    try:
                        forced = {"tile": tile} if tile is not None else {}
                        if splits is not None:
                            forced["splits"] = splits
                        impls.append(PREPARE[name](w, fmt, args.layout, **forced))
                    except bench_gemm.Unavailable as why:
                        print(f"{name} {fmt} {model} {gemm}: n/a: {why}")
                    except ValueError as why:  # a format this model's shapes do not take (g128 on K = 2880)
                        print(f"{name} {fmt} {model} {gemm}: n/a: {why}")
                        results.append(row(None, fmt, name, None, error=f"ValueError: {why}"))
                for tokens in map(int, TOKEN_SETS.get(args.tokens, args.tokens).split(",")):
                    routings = [route(tokens, experts, top_k, k, args.seed + i, device, dtype)
                                for i in range(args.routings)]
                    for impl in impls:
                        try:
                            timing = time_cuda_graph([lambda r=r, impl=impl: impl.call(r) for r in routings],
                                                     repeats=args.repeats)
                            err = relerr(impl, routings[0], args.layout)
                        except bench_gemm.Unavailable as why:  # (a forced K slice count the tile refuses)
                            print(f"{tokens:>6} {model:>16} {gemm:>5} {impl.name} {impl.note}: n/a: {why}")
                            results.append(row(tokens, fmt, impl.name, None, note=impl.note, error=f"Unavailable: {why}"))
                            continue
                        except Exception as exc:  # noqa: BLE001
                            if impl.name not in EXTERNAL_IMPLS:
                                raise  # this project's failures stop the run
                            print(f"{tokens:>6} {model:>16} {gemm:>5} {impl.name}: failed: {type(exc).__name__}: {exc}")
                            results.append(row(tokens, fmt, impl.name, None, error=f"{type(exc).__name__}: {exc}"))
                            continue
                        mode = timing["mode"] if timing["mode"] == "graph" else "eager"
                        print(f"{tokens:>6} {model:>16} {gemm:>5} {n:>6} {k:>6} {experts:>4} {top_k:>4} {fmt:<12} "
                              f"{impl.name:<17} {timing['median_us']:>9.1f} "
                              f"{'-' if err is None else f'{err:.1e}':>8}  {mode} {impl.note}")
                        if impl.reset is not None:
                            impl.reset()
                        results.append(row(tokens, fmt, impl.name, timing["median_us"], p10_us=timing["p10_us"],
                                           p90_us=timing["p90_us"], mode=timing["mode"], relerr=err, note=impl.note))
            del w
            torch.cuda.empty_cache()
            if checkpoint is not None:
                checkpoint(results)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma list from {', '.join(MODELS)}, or shapes ExTOP_K:NxK (e.g. 256x8:7168x512)")
    parser.add_argument("--gemms", default="", help="only these of each model: gemm1, gemm2 (default both)")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"comma list or one of {', '.join(TOKEN_SETS)} (issue)")
    parser.add_argument("--formats", default="int4:g128", help="comma list of weight formats")
    parser.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                        help=f"comma list from {', '.join(ALL_IMPLS)} (default {','.join(DEFAULT_IMPLS)})")
    parser.add_argument("--layout", default="contiguous", choices=LAYOUTS, help="grouped contiguous or masked")
    parser.add_argument("--tile", default=None,
                        help="force these MoE tile labels on humming_aot, humming_aot_aligned and humming_aot_indexed (a "
                             "comma list, each timed as an implementation of its own beside the others, 'default' "
                             "for the table's; e.g. default,wgmma-ws:128x256x64_w1x8_s4); default the table's")
    parser.add_argument("--splits", default=None,
                        help="force these K slice counts on humming_aot's offsets form (the contiguous layout; a "
                             "comma list, each timed as an implementation of its own, 'default' for its own choice)")
    parser.add_argument("--activations", default=None,
                        help="the 8-bit activation format of the a8 implementations (humming_aot_a8, "
                             "humming_aot_a8+quant, humming_a8), e.g. float8e4m3:token, int8:token, float8e4m3:g128")
    parser.add_argument("--routings", type=int, default=4, help="routings rotated per point")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    unknown = []
    for m in args.models.split(","):
        try:
            model_spec(m)
        except ValueError:
            unknown.append(m)
    unknown += [i for i in args.impls.split(",") if i not in ALL_IMPLS]
    if unknown:
        parser.error(f"unknown models or impls: {', '.join(unknown)}")
    if args.splits is not None and not all(v == "default" or (v.isdigit() and int(v) >= 1) for v in args.splits.split(",")):
        parser.error(f"--splits takes 'default' and counts of at least 1, got {args.splits!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_moe.py needs a CUDA GPU")
    ACTIVATIONS["format"] = args.activations
    def write(rows, complete=False):  # (after each GEMM, then the whole run)
        if args.json_path:
            write_results_json(args.json_path, rows, args=vars(args), complete=complete)

    write(bench(args, checkpoint=write), complete=True)


if __name__ == "__main__":
    main()
