"""Sweep the W8A8 body's tiles and schedules at each (shape, M), beside cuBLAS, in one run.

For every N x K and M: ``humming_aot.w8a8.gemm`` with each tile of --tiles ("table" is the tile
w8a8.select_tile picks) under each schedule of --stream-k ("auto": the dispatcher's choice, "0":
the tail split, an integer: that many persistent stream-K CTAs) and each tail-split walk of
--persistent ("auto", "1": at most a wave of resident CTAs walks the whole tiles, "0": a CTA per
tile), and torch._scaled_mm with rowwise scales (float8 channel x token) or torch._int_mm with the
scales after it (--int8: int8 channel x token; M > 16), each in a CUDA graph over
buffer sets that keep L2 cold, median of repeats. What the tile tables of humming_aot/w8a8.py are
chosen from.

    python3 tools/bench/tune_w8a8.py --shapes 4096x4096,8192x8192 --m 128,512,2048 \\
        --tiles table,wgmma-ss:64x128x128_w1x8_s6,wgmma-ss:128x128x128_w1x8_s6 --stream-k auto,0
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot import ops, quant, w8a8  # noqa: E402
from humming_aot.testing.bench import buffer_sets_for_cold_l2, gemm_flops, tflops, time_cuda_graph, write_results_json  # noqa: E402


def _schedules(text: str) -> list[int | None]:
    return [None if v == "auto" else int(v) for v in text.split(",")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x4096,8192x8192", help="N x K list")
    parser.add_argument("--m", default="128,256,512,1024,2048")
    parser.add_argument("--tiles", default="table", help="wgmma-ss tile labels, or 'table'")
    parser.add_argument("--stream-k", default="auto,0", help="schedules: auto, 0 (tail split) or a CTA count")
    parser.add_argument("--persistent", default="auto",
                        help="tail-split walks: auto, 1 (a wave of CTAs walks the tiles), 0 (a CTA per tile)")
    parser.add_argument("--blocks", action="store_true", help="128 x 128 weight blocks x 1 x 128 token groups")
    parser.add_argument("--int8", action="store_true", help="int8:channel weights x int8:token activations")
    parser.add_argument("--no-cublas", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    schedules = _schedules(args.stream_k)
    weights, act = ("float8e4m3:b128x128", "float8e4m3:g128") if args.blocks else ("float8e4m3:channel",
                                                                                    "float8e4m3:token")
    if args.int8:
        weights, act = "int8:channel", "int8:token"
    element = "int8" if args.int8 else "float8e4m3"
    gen = torch.Generator().manual_seed(0)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    results = []
    for n, k in shapes:
        # enough sets that the smallest M's calls (the weight, mostly) meet a cold L2; larger M only
        # have more to evict
        sets = min(8, buffer_sets_for_cold_l2(n * k + min(ms) * k * 3))
        qw = quant.quantize(torch.randn(n, k, generator=gen), weights)
        packed = w8a8.pack(qw).to("cuda")
        packs = [packed] + [dataclasses.replace(packed, w=packed.w.clone(), w_scale=packed.w_scale.clone())
                            for _ in range(sets - 1)]
        cublas = []
        if not args.blocks and not args.no_cublas:
            codes = qw.codes.cuda().view(torch.int8 if args.int8 else torch.float8_e4m3fn).t()
            cublas = [(codes.clone(), qw.scales.cuda().reshape(1, n).clone()) for _ in range(sets)]
        for m in ms:
            qas = [ops.quantize_activation(torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16), act)
                   for _ in range(sets)]
            ref = w8a8.reference(qas[0], packs[0]).float()
            calls = {}
            for label in args.tiles.split(","):
                tile = (w8a8.select_tile(m, args.blocks, n=n, num_sms=sms, element=element, k=k).label if label == "table"
                        else label)
                for stream_k in schedules:
                    for walk in args.persistent.split(","):
                        persistent = None if walk == "auto" else bool(int(walk))
                        name = (f"{label if label == 'table' else tile}|sk={'auto' if stream_k is None else stream_k}"
                                f"|p={walk}")
                        knobs = {"tile": tile, "stream_k": stream_k}
                        if persistent is not None:  # (a build from before the knob takes the others)
                            knobs["persistent"] = persistent
                        calls[name] = (tile, [lambda qa=qa, p=p, knobs=knobs: w8a8.gemm(qa, p, **knobs)
                                              for qa, p in zip(qas, packs)])
            if args.int8 and not args.no_cublas and m > 16:
                calls["int_mm"] = (None, [lambda qa=qa, c=c: (torch._int_mm(qa.codes.view(torch.int8), c[0]).float()
                                                              * qa.scales.reshape(-1, 1) * c[1]).to(torch.bfloat16)
                                          for qa, c in zip(qas, cublas)])
            elif not args.blocks and not args.no_cublas and not args.int8:
                calls["scaled_mm"] = (None, [lambda qa=qa, c=c: torch._scaled_mm(
                    qa.codes.view(torch.float8_e4m3fn), c[0], scale_a=qa.scales, scale_b=c[1],
                    out_dtype=torch.bfloat16) for qa, c in zip(qas, cublas)])
            for name, (tile, fns) in calls.items():
                try:
                    relerr = ((fns[0]().float() - ref).abs().max() / ref.abs().max()).item()
                    timing = time_cuda_graph(fns, repeats=args.repeats)
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
                    print(f"{n:>6} {k:>6} {m:>5} {name:>40} failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                us = timing["median_us"]
                results.append({"n": n, "k": k, "m": m, "variant": name, "tile": tile, "us": us,
                                "tflops": tflops(gemm_flops(m, n, k), us), "relerr": relerr, "blocks": args.blocks,
                                "int8": args.int8})
                print(f"{n:>6} {k:>6} {m:>5} {name:>40} {us:9.1f} {results[-1]['tflops']:8.1f} {relerr:8.1e}")
    if args.json_path:
        write_results_json(args.json_path, results, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
