#!/usr/bin/env python3
"""Eager per-call cost of the public GEMM against torch's own linear, and eager against a CUDA graph.

What a decode step that is not captured in a graph pays (issue 25), in one fresh process:

  tiny      N = K = 256, M = 1 (--tiny-n, --tiny-k), bf16: ``F.linear`` (cuBLAS, bf16 weight),
            ``humming_aot.ops.gemm`` and ``humming_aot.nn.QuantizedLinear`` on the same weight,
            each with a 2-d input, a 3-d input (1, 1, K) and with bias; --calls eager calls then
            one synchronize, best of --repeats. Host-bound: this is the per-call overhead.
  graph     M = 1 on N x K = 4096 x 4096 (--big-n, --big-k): --calls back-to-back eager
            ``ops.gemm`` calls against the same calls replayed from one CUDA graph (per call);
            on sm_90 the same for ``w8a8.gemm`` (float8e4m3 channel x token, pre-quantized).

The goals of issue 25 are printed beside each ratio (ops.gemm <= 1.3x and QuantizedLinear <= 1.5x
of F.linear; eager <= 1.2x of the graph); nothing is asserted.

    PYTHONPATH=. python3 tools/bench/eager_overhead.py --json eager.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

_REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_REPO_ROOT))

import humming_aot  # noqa: E402
from humming_aot import ops  # noqa: E402
from humming_aot.testing.bench import eager_per_call_us, graph_replay_per_call_us  # noqa: E402

GOALS = {"ops.gemm": 1.3, "QuantizedLinear": 1.5, "graph": 1.2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", dest="fmt", default="int4:g128", help="weight format (default int4:g128)")
    parser.add_argument("--tiny-n", type=int, default=256)
    parser.add_argument("--tiny-k", type=int, default=256)
    parser.add_argument("--big-n", type=int, default=4096)
    parser.add_argument("--big-k", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000, help="eager calls per timing (default 2000)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per case; the best is kept (default 5)")
    parser.add_argument("--graph-calls", type=int, default=200, help="calls captured in the graph (default 200)")
    parser.add_argument("--json", dest="json_path", default=None, help="write results as JSON here")
    return parser.parse_args(argv)


def eager_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Best over `repeats` of (`calls` eager calls, then one synchronize) / calls, in us."""
    return eager_per_call_us(fn, calls, repeats)


def graph_us(fn: Callable[[], Any], calls: int, total_calls: int, repeats: int) -> float:
    """The same calls replayed from one CUDA graph of `calls` calls, per call, in us (best of
    `repeats` runs of total_calls / calls replays, then one synchronize)."""
    return graph_replay_per_call_us(fn, calls, max(1, total_calls // calls), repeats)


def _weights(n: int, k: int, fmt: str, with_bias: bool):
    gen = torch.Generator(device="cuda").manual_seed(0)
    linear = torch.nn.Linear(k, n, bias=with_bias).cuda().to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, device="cuda", generator=gen) * 0.05)
    module = humming_aot.nn.QuantizedLinear.from_linear(linear, fmt)
    return linear, module


def tiny_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    n, k = args.tiny_n, args.tiny_k
    rows = []
    for variant in ("2-d", "3-d", "bias"):
        with_bias = variant == "bias"
        linear, module = _weights(n, k, args.fmt, with_bias)
        packed = module.packed
        bias = module.bias
        x = torch.randn(*((1, 1, k) if variant == "3-d" else (1, k)), device="cuda").to(torch.bfloat16)
        weight, linear_bias = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
        # as a new user calls them: grad mode on, no input that requires grad
        base = eager_us(lambda: F.linear(x, weight, linear_bias), args.calls, args.repeats)
        timings = {
            "F.linear": base,
            "ops.gemm": eager_us(lambda: ops.gemm(x, packed, bias), args.calls, args.repeats),
            "QuantizedLinear": eager_us(lambda: module(x), args.calls, args.repeats),
        }
        for call, us in timings.items():
            rows.append({
                "case": f"tiny {n}x{k} M=1 {variant}", "call": call, "us_per_call": round(us, 2),
                "ratio": round(us / base, 3), "goal": GOALS.get(call),
            })
    return rows


def _eager_against_graph(args: argparse.Namespace, case: str, name: str, fn: Callable[[], Any],
                         goal: float | None) -> list[dict[str, Any]]:
    """Rows of `fn` (the call `name`) replayed from a CUDA graph and called eagerly, the second's
    ratio to the first."""
    eager = eager_us(fn, args.calls, args.repeats)
    graph = graph_us(fn, args.graph_calls, args.calls, args.repeats)
    return [
        {"case": case, "call": f"{name} graph replay", "us_per_call": round(graph, 2), "ratio": 1.0, "goal": None},
        {"case": case, "call": f"{name} eager", "us_per_call": round(eager, 2), "ratio": round(eager / graph, 3),
         "goal": goal},
    ]


def graph_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    n, k = args.big_n, args.big_k
    _, module = _weights(n, k, args.fmt, False)
    packed = module.packed
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    return _eager_against_graph(args, f"{n}x{k} {args.fmt} M=1", "ops.gemm", lambda: ops.gemm(x, packed),
                                GOALS["graph"])


def w8a8_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same at N x K for the W8A8 float8 GEMM on pre-quantized activations (sm_90 only): its
    launch packs its Params in Python each call, so this is where its host cost shows."""
    from humming_aot import quant, w8a8

    if torch.cuda.get_device_capability() != (9, 0):
        return []
    n, k = args.big_n, args.big_k
    packed = w8a8.pack(quant.quantize(torch.randn(n, k), "float8e4m3:channel")).to("cuda")
    qa = ops.quantize_activation(torch.randn(1, k, device="cuda").to(torch.bfloat16), "float8e4m3:token")
    return _eager_against_graph(args, f"{n}x{k} float8e4m3 W8A8 M=1", "w8a8.gemm", lambda: w8a8.gemm(qa, packed),
                                None)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | call | us per call | ratio | goal |", "|---|---|---|---|---|"]
    for row in rows:
        goal = row["goal"]
        verdict = "" if goal is None else f"<= {goal}x ({'met' if row['ratio'] <= goal else 'missed'})"
        lines.append(f"| {row['case']} | {row['call']} | {row['us_per_call']:.2f} | {row['ratio']:.2f}x | {verdict} |")
    return "\n".join(lines)


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip() or None
    except Exception:  # noqa: BLE001  (a benchmark reports what it cannot learn)
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("eager_overhead: no CUDA device: nothing to measure")
        return 1
    rows = tiny_rows(args) + graph_rows(args) + w8a8_rows(args)
    print(markdown(rows))
    if args.json_path:
        result = {
            "benchmark": "eager_overhead",
            "device": torch.cuda.get_device_name(),
            "cuda": torch.version.cuda,
            "torch": torch.__version__,
            "git_sha": _git_sha(),
            "settings": {key: value for key, value in vars(args).items() if key != "json_path"},
            "results": rows,
        }
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
