"""Run one GEMM configuration a few times inside an NVTX range, for a profiler to attach to.

    ncu --nvtx --nvtx-include "profile/" --set full \\
        python3 tools/bench/profile_gemm.py --m 1 --tile 16x128x64_w1x2x2_s4 --splits 4
    ncu --nvtx --nvtx-include "profile/" --set full python3 tools/bench/profile_gemm.py --m 1 --impl humming

Warm-up calls (JIT compiles, lazy set-up) run before the range; the profiled calls cycle through
enough weight copies that each meets a cold L2, as in the benchmark.
"""
from __future__ import annotations

import argparse

import torch

import humming_aot
from humming_aot import dispatch, heuristics, ops
from humming_aot.testing.bench import buffer_sets_for_cold_l2, sibling_tool

# Humming's weight configs of the formats bench_gemm.py times side by side (int4 as uint4 codes
# with an implicit zero point, and so on): a profile then runs what the benchmark timed.
HUMMING_WEIGHT_CONFIG = sibling_tool("bench_gemm", __file__).HUMMING_WEIGHT_CONFIG


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="humming_aot", choices=["humming_aot", "humming"])
    parser.add_argument("--shape", default="8192x8192", help="NxK")
    parser.add_argument("--m", type=int, default=1)
    parser.add_argument("--format", default="int4:g128")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--tile", default=None, help="humming_aot tile label (default: the heuristic's)")
    parser.add_argument("--splits", type=int, default=None, help="split-K factor (default: the heuristic's)")
    parser.add_argument("--stream-k", type=int, default=None,
                        help="wgmma-ws tiles: persistent CTAs of the stream-K schedule, 0 for none (default: the heuristic's)")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls")
    args = parser.parse_args()
    if args.impl == "humming" and args.format not in HUMMING_WEIGHT_CONFIG:
        parser.error(f"--format {args.format}: Humming is profiled for {', '.join(HUMMING_WEIGHT_CONFIG)} "
                     "(bench_gemm.py's HUMMING_WEIGHT_CONFIG)")
    n, k = map(int, args.shape.split("x"))
    act = getattr(torch, args.dtype)
    copies = buffer_sets_for_cold_l2(n * k // 2)
    weights = [torch.randn(n, k, device="cuda") * 0.02 for _ in range(copies)]
    a = torch.randn(args.m, k, device="cuda", dtype=act)
    if args.impl == "humming":
        from humming.layer import HummingLayer

        layers = []
        for w in weights:
            layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(HUMMING_WEIGHT_CONFIG[args.format]),
                                 torch_dtype=act).cuda()
            layer.load_from_unquantized(w.to(act))
            layer.transform()
            layers.append(layer)
        calls = [lambda layer=layer: layer(a) for layer in layers]
    else:
        packs = [humming_aot.pack(humming_aot.quantize(w, args.format), act_dtype=act) for w in weights]
        info = dispatch.device_info(torch.cuda.current_device())
        # the dispatcher's choice: K, the group size, N and the SM count decide between rows
        spec = ops.gemm_spec(packs[0])
        tile = args.tile or heuristics.select_tile(info.arches[0], args.m, k, packs[0].group_size, spec.w_bits, n=n,
                                                   num_sms=info.num_sms, float_codes=spec.w_is_float)
        calls = [lambda p=p: ops.gemm_with_tile(a, p, tile, splits=args.splits, stream_k=args.stream_k) for p in packs]
    for call in calls:  # warm-up: compiles, allocations
        call()
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("profile"):
        for i in range(args.calls):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
    print(f"profiled {args.calls} calls of {args.impl}: m={args.m} n={n} k={k} {args.format} "
          f"tile={args.tile} splits={args.splits} stream_k={args.stream_k}")


if __name__ == "__main__":
    main()
