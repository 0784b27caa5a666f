#!/usr/bin/env python3
"""What GPTQ act-order costs a QuantizedLinear: forward with and without ``input_perm``, per call.

For each N x K in --shapes and each M in --m (bf16 activations, weight format --format):

  plain      humming_aot.nn.QuantizedLinear without input_perm, forward(x)
  act-order  the same weights with input_perm = torch.randperm(K) (int64, on the device), so that
             forward gathers x.index_select(-1, input_perm) before ops.gemm; checked once per case
             with torch.equal against plain(x.index_select(-1, perm)), so the real path is timed
  gather     x.index_select(-1, perm) alone

Each is timed two ways: "graph" captures --graph-calls calls in one CUDA graph and replays it
--replays times (per-call median, CUDA events); "eager" runs --calls calls then one synchronize
(per call, best of --repeats, wall clock). With --cold-l2 (the default) the calls rotate over
enough copies of the weight and activations that each call starts with a cold L2
(humming_aot.testing.bench.buffer_sets_for_cold_l2), as a served model would see.

    PYTHONPATH=. python3 tools/bench/act_order_cost.py --json act_order.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

_REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_REPO_ROOT))

from humming_aot.nn import QuantizedLinear  # noqa: E402
from humming_aot.packing import pack  # noqa: E402
from humming_aot.quant import quantize  # noqa: E402
from humming_aot.testing.bench import buffer_sets_for_cold_l2  # noqa: E402

DEFAULT_SHAPES = "4096x4096,4096x14336,14336x4096"  # N x K
VARIANTS = ("plain", "act-order", "gather")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma list of NxK (default {DEFAULT_SHAPES})")
    parser.add_argument("--m", default="1,1024", help="comma list of M (default 1,1024)")
    parser.add_argument("--format", dest="fmt", default="int4:g128", help="weight format (default int4:g128)")
    parser.add_argument("--graph-calls", type=int, default=200, help="calls captured in one CUDA graph (default 200)")
    parser.add_argument("--replays", type=int, default=20, help="timed graph replays; the median is kept (default 20)")
    parser.add_argument("--calls", type=int, default=1000, help="eager calls per timing (default 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="eager timings per case; the best is kept (default 5)")
    parser.add_argument("--cold-l2", action=argparse.BooleanOptionalAction, default=True,
                        help="rotate weight and activation copies so each call meets a cold L2 (default on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", default=None, help="write results as JSON here")
    return parser.parse_args(argv)


def graph_us(fns: list[Callable[[], Any]], calls: int, replays: int) -> float:
    """Per-call median us of one CUDA graph of `calls` calls (cycling over `fns`), over `replays` replays."""
    for _ in range(2):  # eager warm-up: lazy set-up and allocator growth happen outside the capture
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()  # untimed
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) * 1e3 / calls for start, end in events]
    del graph
    return statistics.median(samples)


def eager_us(fns: list[Callable[[], Any]], calls: int, repeats: int) -> float:
    """Best over `repeats` of (`calls` eager calls cycling over `fns`, then one synchronize) / calls, in us."""
    for _ in range(20):
        fns[0]()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def measure_shape(n: int, k: int, ms: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    qw = quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, args.fmt)
    packed = [pack(qw, act_dtype=torch.bfloat16, device="cuda")]
    # bytes one plain call moves: weight + scales, x read, y written (bf16)
    sets_for = {m: buffer_sets_for_cold_l2(packed[0].nbytes + 2 * m * (k + n)) if args.cold_l2 else 1 for m in ms}
    packed += [pack(qw, act_dtype=torch.bfloat16, device="cuda") for _ in range(max(sets_for.values()) - 1)]
    # plain and act-order modules share their packed tensors: the same weights, with and without the gather
    perm = torch.randperm(k, device="cuda", generator=gen)  # int64
    plain = [QuantizedLinear(p) for p in packed]
    act_order = [QuantizedLinear(p) for p in packed]
    for module in act_order:
        module.input_perm = perm

    rows = []
    for m in ms:
        sets = sets_for[m]
        xs = [torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(sets)]
        if not torch.equal(act_order[0](xs[0]), plain[0](xs[0].index_select(-1, perm))):
            raise AssertionError(f"{n}x{k} M={m}: act-order forward != plain forward of the gathered input")
        fns = {
            "plain": [lambda x=x, mod=mod: mod(x) for x, mod in zip(xs, plain)],
            "act-order": [lambda x=x, mod=mod: mod(x) for x, mod in zip(xs, act_order)],
            "gather": [lambda x=x: x.index_select(-1, perm) for x in xs],
        }
        for timing in ("graph", "eager"):
            row: dict[str, Any] = {"n": n, "k": k, "m": m, "timing": timing, "buffer_sets": sets}
            for variant in VARIANTS:
                if timing == "graph":
                    row[variant] = graph_us(fns[variant], args.graph_calls, args.replays)
                else:
                    row[variant] = eager_us(fns[variant], args.calls, args.repeats)
            row["delta"] = row["act-order"] - row["plain"]
            row["delta_pct"] = 100.0 * row["delta"] / row["plain"]
            rows.append(row)
            print(f"  {n}x{k} M={m} {timing}: plain {row['plain']:.2f} us, act-order {row['act-order']:.2f} us",
                  flush=True)
        del xs, fns
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| timing | shape NxK | M | plain us | act-order us | delta us | delta % | gather us |",
             "|---|---|---|---|---|---|---|---|"]
    for timing in ("graph", "eager"):
        for r in (r for r in rows if r["timing"] == timing):
            lines.append(f"| {timing} | {r['n']}x{r['k']} | {r['m']} | {r['plain']:.2f} | {r['act-order']:.2f} | "
                         f"{r['delta']:+.2f} | {r['delta_pct']:+.1f} | {r['gather']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("act_order_cost: no CUDA device (torch.cuda.is_available() is False): nothing to measure")
        return 1
    shapes = [tuple(int(v) for v in item.lower().strip().split("x")) for item in args.shapes.split(",")]
    ms = [int(m) for m in args.m.split(",")]
    print(f"act_order_cost: {torch.cuda.get_device_name()}, {args.fmt}, bf16 activations, "
          f"cold L2 {'on' if args.cold_l2 else 'off'}")
    rows = []
    with torch.no_grad():
        for n, k in shapes:
            rows += measure_shape(n, k, ms, args)
            torch.cuda.empty_cache()
    print(markdown(rows))
    if args.json_path:
        result = {
            "benchmark": "act_order_cost",
            "command": [sys.executable, *sys.argv],
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "settings": {key: value for key, value in vars(args).items() if key != "json_path"},
            "units": "us per call",
            "results": [{key: round(v, 3) if isinstance(v, float) else v for key, v in r.items()} for r in rows],
        }
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
