#!/usr/bin/env python3
"""Where an eager ``ops.gemm`` call spends its host time: each piece of the planned path timed alone.

The eager path (ops.gemm -> ops._gemm_planned -> LaunchPlan.launch -> the launcher's PlannedLaunch,
then for a shape seen before ops._gemm_bound -> the launcher's BoundLaunch) does a guard, argument
checks, a plan lookup, one output allocation and one launch. This times each
piece on its own (``--calls`` calls, best of ``--repeats``; pieces that launch end with a
synchronize) beside F.linear, so a change to the path can say which piece it moved. M = 1, bf16,
N = K = --n (default 256); then at --big-n x --big-k (4096 x 4096 int4:g128) ops.gemm and F.linear
eager and in a CUDA graph, beside the floor of any eager call: one output allocation and one
launch of the planned kernel, with no checks.

    PYTHONPATH=. python3 tools/bench/eager_breakdown.py --json breakdown.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import humming_aot  # noqa: E402
from humming_aot import dispatch, ops  # noqa: E402
from humming_aot.packing import PackedWeight  # noqa: E402
from humming_aot.testing.bench import eager_per_call_us, graph_replay_per_call_us  # noqa: E402


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int, sync: bool) -> float:
    return eager_per_call_us(fn, calls, repeats, sync=sync, warmup=50)


def pieces(n: int, fmt: str) -> dict[str, tuple[Callable[[], Any], bool]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(n, n, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    packed = humming_aot.pack(humming_aot.quantize(weight, fmt), act_dtype=torch.bfloat16)
    a = torch.randn(1, n, device="cuda", generator=gen).to(torch.bfloat16)
    ops.gemm(a, packed)  # makes the plan
    plan = next(p for p in ops._plans.values() if p.n == n and p.m == 1)
    out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    stream = dispatch.current_stream(0)
    ints = (a.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, 0, out.data_ptr(), 0, n, n,
            packed.global_scale, None)
    params = plan.planned.params(*ints)
    kernel = plan.kernel
    bound = plan.planned.bind(stream, packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, n, packed.global_scale)

    def old_launch():  # the path before PlannedLaunch: struct packing and the keyword launch
        raw = dispatch._PARAMS.pack(a.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, 0,
                                    out.data_ptr(), 0, plan.counters_ptr, n, n, 1, n, n, packed.group_size,
                                    plan.splits, packed.global_scale)
        humming_aot._launcher.launch(kernel.kernel, plan.grid, plan.block, kernel.smem_bytes, stream, raw,
                                     kernel.device, programmatic_dependent_launch=kernel.programmatic_launch,
                                     cluster=plan.cluster)

    def guard():
        return (not ops._is_compiling() and type(a) is torch.Tensor and type(packed) is PackedWeight and a.is_cuda
                and not a.requires_grad and ops._no_torch_modes())

    real_launch = type(plan).launch

    def planned_without_launch():
        type(plan).launch = lambda *args: None
        try:
            return ops._gemm_planned(a, packed.w, packed.w_scale, packed.w_zero_point, None, packed.w_dtype,
                                     packed.act_dtype, packed.n, packed.k, packed.group_size, packed.global_scale,
                                     packed.float_zero_point, packed.layout_version)
        finally:
            type(plan).launch = real_launch

    return {
        "F.linear (bf16 weight)": (lambda: F.linear(a, weight), True),
        "ops.gemm (whole call)": (lambda: ops.gemm(a, packed), True),
        "guard in ops.gemm": (guard, False),
        "current_stream": (lambda: dispatch.current_stream(0), False),
        "torch.empty(1, n, dtype=, device=)": (lambda: torch.empty(1, n, dtype=torch.bfloat16, device="cuda"), False),
        "a.new_empty((1, n))": (lambda: a.new_empty((1, n)), False),
        "six data_ptr()": (lambda: (a.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), out.data_ptr(),
                                    a.data_ptr(), out.data_ptr()), False),
        "_gemm_planned without the launch": (planned_without_launch, False),
        "LaunchPlan.launch (into a given out)": (
            lambda: plan.launch(a, n, packed.w, packed.w_scale, None, None, out, n, packed.global_scale), True),
        "PlannedLaunch.launch (ints ready)": (lambda: plan.planned.launch(stream, *ints), True),
        "BoundLaunch.launch (ints ready)": (lambda: bound.launch(ints[0], 0, ints[5], n), True),
        "_gemm_bound (a whole call through the bound launch)": (lambda: ops._gemm_bound(a, packed, None, 0), True),
        "old: struct pack + keyword launch": (old_launch, True),
        "_launcher.launch without PDL (cuLaunchKernel where no cluster)": (
            lambda: humming_aot._launcher.launch(kernel.kernel, plan.grid, plan.block, kernel.smem_bytes, stream,
                                                 params, kernel.device, programmatic_dependent_launch=False,
                                                 cluster=plan.cluster), True),
        "_launcher.launch (bytes ready)": (
            lambda: humming_aot._launcher.launch(kernel.kernel, plan.grid, plan.block, kernel.smem_bytes, stream,
                                                 params, kernel.device,
                                                 programmatic_dependent_launch=kernel.programmatic_launch,
                                                 cluster=plan.cluster), True),
    }


def graph_per_call_us(fn: Callable[[], Any], calls: int = 200, replays: int = 20) -> float:
    return graph_replay_per_call_us(fn, calls, replays)


def floor_rows(n: int, k: int, fmt: str, calls: int, repeats: int) -> list[dict[str, Any]]:
    """At N x K, M = 1: ops.gemm eager and in a graph, beside the least any eager call must do (one
    output allocation and one launch of the planned kernel, no checks), and F.linear likewise."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    packed = humming_aot.pack(humming_aot.quantize(weight, fmt), act_dtype=torch.bfloat16)
    a = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    ops.gemm(a, packed)
    plan = next(p for p in ops._plans.values() if p.n == n and p.k == k and p.m == 1)
    stream = dispatch.current_stream(0)
    fixed = (a.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, 0)

    def floor():
        out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        plan.planned.launch(stream, *fixed, out.data_ptr(), 0, k, n, packed.global_scale, None)
        return out

    bound = plan.planned.bind(stream, packed.w.data_ptr(), packed.w_scale.data_ptr(), 0, n, packed.global_scale)

    def bound_floor():
        out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        bound.launch(fixed[0], 0, out.data_ptr(), k)
        return out

    if plan.workspace_shape is not None:
        floor = None  # a workspace plan allocates twice: no single floor to state
    rows = []
    cases = {"ops.gemm": lambda: ops.gemm(a, packed), "F.linear": lambda: F.linear(a, weight)}
    if floor is not None:
        cases["allocation + launch only"] = floor
        cases["allocation + bound launch only"] = bound_floor
    for name, fn in cases.items():
        eager = per_call_us(fn, calls, repeats, True)
        graph = graph_per_call_us(fn)
        rows.append({"piece": f"{n}x{k} M=1 {name}: eager", "us_per_call": round(eager, 3)})
        rows.append({"piece": f"{n}x{k} M=1 {name}: graph", "us_per_call": round(graph, 3)})
        print(f"{eager:8.3f} us eager, {graph:8.3f} us graph ({eager / graph:.2f}x)  {n}x{k} M=1 {name}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--format", dest="fmt", default="int4:g128")
    parser.add_argument("--big-n", type=int, default=4096)
    parser.add_argument("--big-k", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("eager_breakdown: no CUDA device: nothing to measure")
        return 1
    rows = []
    for name, (fn, sync) in pieces(args.n, args.fmt).items():
        us = per_call_us(fn, args.calls, args.repeats, sync)
        rows.append({"piece": name, "us_per_call": round(us, 3)})
        print(f"{us:8.3f} us  {name}")
    rows += floor_rows(args.big_n, args.big_k, args.fmt, args.calls, args.repeats)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "benchmark": "eager_breakdown", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "settings": vars(args), "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
