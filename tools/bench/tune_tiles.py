"""Sweep the installed catalog's tiles (and split-K factors) for one format and shape, timing each
with CUDA-graph replays over rotated inputs (humming_aot.testing.bench), and print which wins per M.

    python3 tools/bench/tune_tiles.py --shape 8192x8192 --m 1,16,64,256,1024,4096 --json tune.json

The winners are what catalog/tiles.toml and heuristics.split_k_factor should choose; benchmarks
never assert, so this only reports.
"""
from __future__ import annotations

import argparse
import json

import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.catalog import installed_catalog
from humming_aot.spec import KernelKey
from humming_aot.testing.bench import buffer_sets_for_cold_l2, gemm_flops, tflops, time_cuda_graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x8192", help="NxK")
    parser.add_argument("--m", default="1,16,64,256,1024,4096")
    parser.add_argument("--format", default="int4:g128")
    parser.add_argument("--splits", default="auto,1,2,4,8,16", help="split-K factors to try for small M")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    n, k = map(int, args.shape.split("x"))
    act = torch.bfloat16
    packed0 = humming_aot.pack(humming_aot.quantize(torch.randn(n, k) * 0.02, args.format), act_dtype=act, device="cuda")
    spec = ops.gemm_spec(packed0)
    arch = dispatch.device_info(torch.cuda.current_device()).arches[0]
    keys = [KernelKey.from_name(x) for x in installed_catalog().keys_for(arch)]
    tiles = sorted({key.tile for key in keys if key.spec == spec}, key=lambda t: (t.block_m, t.block_n, t.stages))
    results = []
    for m in map(int, args.m.split(",")):
        per_set = packed0.nbytes + m * k * 2
        sets = buffer_sets_for_cold_l2(per_set)
        weights = [packed0] + [humming_aot.pack(humming_aot.quantize(torch.randn(n, k) * 0.02, args.format), act_dtype=act, device="cuda") for _ in range(min(sets, 4) - 1)]
        acts = [torch.randn(m, k, device="cuda", dtype=act) for _ in weights]
        best = None
        for tile in tiles:
            if tile.block_m > 4 * max(m, 16):
                continue
            split_options = [s for s in args.splits.split(",")] if m <= 256 else ["auto"]
            for split in split_options:
                splits = None if split == "auto" else int(split)
                try:
                    fns = [
                        (lambda a=a, w=w: ops.gemm_with_tile(a, w, tile, splits=splits)) for a, w in zip(acts, weights)
                    ]
                    timing = time_cuda_graph(fns, repeats=args.repeats)
                except Exception as error:  # a combination the kernel rejects: report and go on
                    print(f"m={m} {tile.label} splits={split}: {type(error).__name__}: {error}")
                    continue
                row = {"m": m, "n": n, "k": k, "tile": tile.label, "splits": split, "us": timing["median_us"],
                       "tflops": tflops(gemm_flops(m, n, k), timing["median_us"])}
                results.append(row)
                if best is None or row["us"] < best["us"]:
                    best = row
                print(f"m={m:5d} {tile.label:30s} splits={split:>4s} {row['us']:9.2f} us {row['tflops']:7.1f} TFLOP/s", flush=True)
        if best:
            print(f"BEST m={m}: {best['tile']} splits={best['splits']} {best['us']:.2f} us", flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "format": args.format, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
