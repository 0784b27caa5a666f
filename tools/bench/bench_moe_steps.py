"""Time the steps around the MoE GEMMs on their helper kernels against the same steps as torch
operations, in one run.

    python3 tools/bench/bench_moe_steps.py --models deepseek-v3-tp8,qwen3-30b-a3b --tokens 1,16,256 --json s.json

Steps (humming_aot.moe; GEMM1's output width 2 I and the hidden size H from bench_moe.py's model
table):
  align       align_block_size (vLLM's indexed layout, block 16, check_range=False)
  group       group_rows (the grouped contiguous layout the QuantizedMoE forward uses)
  permute     permute: the routed rows of (M, H) hidden states, grouped
  activation  silu_and_mul of (M * top_k, 2 I)
  combine     combine of (M * top_k, H) rows with fp32 weights (unpermute + weighted_sum)
Each in CUDA-graph replays (humming_aot.testing.bench.time_cuda_graph) over --routings routings;
"kernel" is the helper kernel, "torch" the same function with HUMMING_AOT_HELPERS=0. torch's
align_block_size reads a count back to the host (not capturable): its column is the eager time
per call with that synchronization, marked "eager". Benchmarks never assert.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot.testing.bench import (  # noqa: E402
    eager_per_call_us,
    sibling_tool,
    time_cuda_graph,
    write_results_json,
)

bench_moe = sibling_tool("bench_moe", __file__)

STEPS = ("align", "group", "permute", "activation", "combine")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="deepseek-v3-tp8,qwen3-30b-a3b")
    parser.add_argument("--tokens", default="1,4,16,64,256,1024,4096,16384")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma list from {', '.join(STEPS)}")
    parser.add_argument("--impls", default="kernel,torch", help="comma list from kernel, torch")
    parser.add_argument("--routings", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    for name, allowed in (("steps", STEPS), ("impls", ("kernel", "torch"))):
        bad = [x for x in getattr(args, name).split(",") if x not in allowed]
        if bad:
            parser.error(f"--{name}: {', '.join(bad)} not in {', '.join(allowed)}")
    return args


def closures(step: str, experts: int, top_k: int, gate_up_n: int, hidden: int, tokens: int, seed: int):
    from humming_aot import moe

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randn(tokens, experts, generator=gen).topk(top_k, dim=1).indices.to(torch.int32).cuda()
    slots = tokens * top_k
    if step == "align":
        return lambda: moe.align_block_size(ids, experts, 16, check_range=False)
    if step == "group":
        return lambda: moe.group_rows(ids, experts, check_range=False)
    if step == "permute":
        routing = moe.group_rows(ids, experts, check_range=False)
        hidden_states = torch.randn(tokens, hidden, generator=gen).bfloat16().cuda()
        return lambda: moe.permute(hidden_states, routing)
    if step == "activation":
        x = torch.randn(slots, gate_up_n, generator=gen).bfloat16().cuda()
        return lambda: moe.silu_and_mul(x)
    routing = moe.group_rows(ids, experts, check_range=False)
    rows = torch.randn(slots, hidden, generator=gen).bfloat16().cuda()
    weights = torch.rand(tokens, top_k, generator=gen).cuda()
    return lambda: moe.combine(rows, routing, weights)


def bench(args: argparse.Namespace) -> list[dict]:
    results = []
    print(f"{'model':>16} {'step':>10} {'tokens':>6} {'kernel us':>10} {'torch us':>10}  note")
    for model in args.models.split(","):
        experts, top_k, gemms = bench_moe.model_spec(model)
        gate_up_n, hidden = gemms[0][1], gemms[0][2]
        for step in args.steps.split(","):
            for tokens in (int(t) for t in args.tokens.split(",")):
                row = dict(model=model, step=step, tokens=tokens, experts=experts, top_k=top_k)
                for impl in args.impls.split(","):
                    os.environ["HUMMING_AOT_HELPERS"] = "1" if impl == "kernel" else "0"
                    fns = [closures(step, experts, top_k, gate_up_n, hidden, tokens, args.seed + i)
                           for i in range(args.routings)]
                    if impl == "torch" and step == "align":
                        row["torch_us"] = eager_per_call_us(fns[0], calls=200, repeats=5)
                        row["torch_mode"] = "eager"
                    else:
                        row[f"{impl}_us"] = time_cuda_graph(fns, repeats=args.repeats)["median_us"]
                os.environ.pop("HUMMING_AOT_HELPERS")
                results.append(row)
                kernel_us, torch_us = row.get("kernel_us", float("nan")), row.get("torch_us", float("nan"))
                print(f"{model:>16} {step:>10} {tokens:>6} {kernel_us:>10.1f} {torch_us:>10.1f}  "
                      f"{row.get('torch_mode', '')}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = bench(args)
    if args.json:
        write_results_json(args.json, results)


if __name__ == "__main__":
    main()
