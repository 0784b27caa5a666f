"""Time ops.quantize_activation's kernels against the memory floor, in one run.

    python3 tools/bench/bench_act_quant.py --shapes 8192x8192,4096x7168,16x4096 --json q.json

For each shape (M x K, bfloat16) and recipe, the CUDA-graph time per call (humming_aot.testing.bench),
the bytes it must move (M K reads of 2 bytes, M K code bytes, the scales) and the fraction of
--peak-gbps (default 3500, the weight-streaming rate measured on the H200) that makes. (The
reference path is no baseline: it checks finiteness on the host and encodes in float64.)
A recipe ending in "@static" is its per-tensor form with a given (calibrated) scale tensor: one
pass; the plain per-tensor recipe finds its scale first (an amax pass, then the apply pass), so
it reads the activations twice against the same one-pass floor. Benchmarks never assert.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot.testing.bench import gbps, time_cuda_graph, write_results_json  # noqa: E402 - after the path fix above

RECIPES = ("float8e4m3:token", "float8e4m3:g128", "float8e4m3:tensor@static", "float8e4m3:tensor", "int8:token",
           "int8:g128", "mxfp4", "nvfp4")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8192x8192,4096x7168,1024x4096,16x4096,1x7168")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--peak-gbps", type=float, default=3500.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from humming_aot import ops
    from humming_aot.quant import ActivationFormat

    args = parse_args(argv)
    results = []
    print(f"{'shape':>12} {'recipe':>20} {'kernel us':>10} {'GB/s':>8} {'of peak':>8}")
    for shape in args.shapes.split(","):
        m, k = (int(x) for x in shape.split("x"))
        a = [torch.randn(m, k, device="cuda").bfloat16() for _ in range(2)]
        for recipe in args.recipes.split(","):
            spelling, static = recipe.removesuffix("@static"), recipe.endswith("@static")
            fmt = ActivationFormat.parse(spelling)
            if static and fmt.granularity.value != "tensor":
                sys.exit(f"bench_act_quant.py: {recipe}: a given scale is a per-tensor recipe's (e.g. "
                         "float8e4m3:tensor@static)")
            given = torch.tensor([0.05], device="cuda") if static else None
            scales = 4 * (1 if fmt.granularity.value == "tensor" else m * (k // fmt.group_size if fmt.group_size else 1))
            moved = 3 * m * k + scales
            row = dict(m=m, k=k, recipe=recipe, bytes=moved)
            row["kernel_us"] = time_cuda_graph([lambda x=x: ops.quantize_activation(x, fmt, static_scale=given) for x in a],
                                               repeats=args.repeats)["median_us"]
            row["gbps"] = gbps(moved, row["kernel_us"])
            results.append(row)
            print(f"{shape:>12} {recipe:>20} {row['kernel_us']:>10.1f} {row['gbps']:>8.0f} "
                  f"{row['gbps'] / args.peak_gbps:>8.0%}", flush=True)
    if args.json:
        write_results_json(args.json, results)


if __name__ == "__main__":
    main()
