"""Run one MoE expert GEMM configuration a few times inside an NVTX range, for a profiler to attach to.

    ncu --nvtx --nvtx-include "profile/" --set full -o moe python3 tools/bench/profile_moe.py \\
        --model deepseek-v3-tp8 --gemm gemm2 --tokens 16 --layout masked
    ncu --nvtx --nvtx-include "profile/" --set full python3 tools/bench/profile_moe.py --impl humming ...

The configuration is bench_moe.py's (the same models, routings, layouts and implementations, so
a point of its table can be profiled as it was timed). Warm-up calls (JIT compiles, lazy set-up)
run before the range; the profiled calls rotate over --routings routings, whose experts differ,
so that each call meets weights its predecessor did not read.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot.testing.bench import sibling_tool  # noqa: E402 - after the path fix above

bench_moe = sibling_tool("bench_moe", __file__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3-tp8",
                        help=f"one of {', '.join(bench_moe.MODELS)}, or a shape ExTOP_K:NxK (its GEMM: 'gemm')")
    parser.add_argument("--gemm", default="gemm2", choices=["gemm1", "gemm2", "gemm"])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--layout", default="masked", choices=bench_moe.LAYOUTS)
    parser.add_argument("--format", default="int4:g128")
    parser.add_argument("--impl", default="humming_aot", choices=bench_moe.ALL_IMPLS)
    parser.add_argument("--activations", default=None,
                        help="the 8-bit activation format of the a8 implementations (e.g. float8e4m3:g128)")
    parser.add_argument("--tile", default=None, help="force a MoE tile label (humming_aot, humming_aot_aligned)")
    parser.add_argument("--routings", type=int, default=4)
    parser.add_argument("--calls", type=int, default=4, help="profiled calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        _, _, gemms = bench_moe.model_spec(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    if args.gemm not in [g for g, _, _ in gemms]:
        parser.error(f"--gemm {args.gemm}: {args.model} has {', '.join(g for g, _, _ in gemms)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_moe.py needs a CUDA GPU")
    experts, top_k, gemms = bench_moe.model_spec(args.model)
    n, k = next((n, k) for gemm, n, k in gemms if gemm == args.gemm)
    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    w = (torch.randn(experts, n, k, generator=gen) * 0.02).to(torch.bfloat16).to(device)
    bench_moe.ACTIVATIONS["format"] = args.activations
    forced = {"tile": args.tile} if args.tile and args.impl in bench_moe.TILED_IMPLS else {}
    impl = bench_moe.PREPARE[args.impl](w, args.format, args.layout, **forced)
    routings = [bench_moe.route(args.tokens, experts, top_k, k, args.seed + i, device) for i in range(args.routings)]
    for r in routings:  # warm-up: compiles, allocations, what the impl keeps per routing
        impl.call(r)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("profile"):
        for i in range(args.calls):
            impl.call(routings[i % len(routings)])
        torch.cuda.synchronize()
    print(f"profiled {args.calls} calls of {impl.name} {impl.note}: {args.model} {args.gemm} (N {n}, K {k}, E "
          f"{experts}, top-{top_k}) {args.tokens} tokens, {args.layout}, {args.format}"
          + (f" x {args.activations}" if args.activations else ""))


if __name__ == "__main__":
    main()
