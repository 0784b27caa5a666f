"""Time the W4A8 GEMM (int4:g128, uint4:g128:zp or mxfp4 weights x float8e4m3:token activations) side by side, in one run,
over real layer shapes and M: humming_aot.w4a8.gemm on pre-quantized activations, the same with
ops.quantize_activation in front (what a layer pays), our own W4A16 of the same weights
(humming_aot.ops.gemm on bfloat16 activations: what W4A8 must beat by its tensor-core rate),
Humming's W4A8 layer of the same pairing (its forward quantizes the bf16 input itself), and two
cuBLAS baselines of the same layer: ``torch_bf16`` (F.linear with the weight dequantized to
bfloat16) and ``scaled_mm`` (torch._scaled_mm on the same float8 activations with the weight
quantized to float8e4m3 per channel: what an FP8 W8A8 deployment of the layer runs; its relerr is
against the W4A8 reference, so it shows that weight's own error), each in a CUDA graph over buffer
sets that keep L2 cold, median of repeats.

    python3 tools/bench/bench_w4a8.py --shape-set large-m --m 1,16,64,128,512,2048,8192 --json out.json
    python3 tools/bench/bench_w4a8.py --shapes 8192x8192 --m 1,1024,4096 --impls humming_aot,w4a16,humming
    python3 tools/bench/bench_w4a8.py --weights mxfp4 --shapes 5760x2880,2880x2880 --impls humming_aot,w4a16,humming
    python3 tools/bench/bench_w4a8.py --weights uint4:g128:zp --int8 --shapes 8192x8192 --impls humming_aot,humming
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import humming_aot  # noqa: E402
from humming_aot import ops, quant, w4a8  # noqa: E402
from humming_aot.testing.bench import (  # noqa: E402
    add_front_argument,
    add_quant_split_argument,
    apply_quant_split,
    buffer_sets_for_cold_l2,
    gemm_flops,
    sibling_tool,
    tflops,
    time_cuda_graph,
    with_front,
    write_results_json,
)

IMPLS = ("humming_aot", "humming_aot+quant", "w4a16", "humming", "torch_bf16", "scaled_mm")
WEIGHTS, ACTIVATIONS = "int4:g128", "float8e4m3:token"
# Humming's spellings of a symmetric int4 g128 weight, tried in order (bench_gemm: it stores int-b as
# uint-b codes with the implicit zero point), of AWQ's uint4 with zero points, and of MXFP4
HUMMING_WEIGHTS = {
    "int4:g128": ({"dtype": "uint4", "group_size": 128}, {"dtype": "int4", "group_size": 128}),
    "uint4:g128:zp": ({"dtype": "uint4", "group_size": 128, "has_zero_point": True},),
    "mxfp4": ({"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"},),
}


def _prepare(n: int, k: int, sets: int, gen: torch.Generator, cublas: bool, weights: str = WEIGHTS):
    """`sets` copies of a `weights` weight: ours for W4A8 and for W4A16, the float weight for
    Humming, and with `cublas` the cuBLAS baselines' weights: the dequantized bfloat16 (N, K) and
    the float8e4m3 per-channel (K, N) column-major codes with their (1, N) scales."""
    w = torch.randn(n, k, generator=gen)
    qw = quant.quantize(w, weights)
    packed = w4a8.pack(qw).to("cuda")
    w16 = humming_aot.pack(qw, torch.bfloat16, device="cuda")
    baselines = []
    if cublas:
        dequantized = packed.effective_weight().to("cuda", torch.bfloat16)
        q8 = quant.quantize(dequantized.float().cpu(), "float8e4m3:channel")
        codes, scales = q8.codes.cuda().view(torch.float8_e4m3fn), q8.scales.cuda().reshape(1, n)
        baselines = [(dequantized.clone(), codes.clone().t(), scales.clone()) for _ in range(sets)]
    return w, ([packed] + [dataclasses.replace(packed, w=packed.w.clone(), w_scale=packed.w_scale.clone())
                           for _ in range(sets - 1)],
               [w16] + [humming_aot.pack(qw, torch.bfloat16, device="cuda") for _ in range(sets - 1)], baselines)


def _humming_layers(w: torch.Tensor, sets: int, int8: bool = False, weights: str = WEIGHTS):
    from humming.layer import HummingLayer

    n, k = w.shape
    input_config = {"dtype": "int8" if int8 else "float8e4m3", "quant_mode": "dynamic_token"}
    error = None
    for weight_config in HUMMING_WEIGHTS[weights]:
        try:
            layers = []
            for _ in range(sets):
                layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(weight_config),
                                     input_config=dict(input_config), torch_dtype=torch.bfloat16).cuda()
                layer.load_from_unquantized(w.to(torch.bfloat16).cuda())
                layer.transform()
                layers.append(layer)
            print(f"humming weight_config {weight_config}")
            return layers
        except Exception as exc:  # noqa: BLE001 - the next spelling
            error = exc
    raise error


def main(argv=None) -> int:
    bench_gemm = sibling_tool("bench_gemm", __file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape-set", default="large-m", help=f"names from {', '.join(bench_gemm.SHAPE_SETS)}")
    parser.add_argument("--shapes", default=None, help="N x K list instead of the set, e.g. 8192x8192,4096x14336")
    parser.add_argument("--m", default="1,16,32,64,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tile", default=None, help="force this wgmma-w4a8 (or mma-w4a8) tile on humming_aot")
    parser.add_argument("--portable", action="store_true", help="humming_aot through the mma-w4a8 body's table "
                        "(w4a8.select_sync_tile: what GPUs without wgmma run) instead of wgmma-w4a8's")
    parser.add_argument("--int8", action="store_true", help="int8:token activations (int4 x int8: the mma-w4a8 body; "
                        "scaled_mm is left out, Humming gets its int8 input config)")
    parser.add_argument("--weights", default=WEIGHTS, choices=tuple(HUMMING_WEIGHTS),
                        help="the weight format (float8e4m3 activations for mxfp4)")
    parser.add_argument("--mxfp4-spans", default=None,
                        help="with --weights mxfp4: also time humming_aot on the weight packed with each of these "
                             "fold spans (K tiles, comma list; impls humming_aot:spanS beside humming_aot's default)")
    add_front_argument(parser)
    add_quant_split_argument(parser)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    try:
        quant_split = apply_quant_split(args.quant_split)
    except ValueError as exc:
        parser.error(str(exc))
    if args.weights == "mxfp4" and args.int8:
        parser.error("--weights mxfp4 takes float8 activations only: leave out --int8")
    if args.mxfp4_spans and args.weights != "mxfp4":
        parser.error("--mxfp4-spans takes --weights mxfp4")
    spans = [int(v) for v in args.mxfp4_spans.split(",")] if args.mxfp4_spans else []
    shapes_text = args.shapes or ",".join(bench_gemm.SHAPE_SETS[s] for s in args.shape_set.split(","))
    shapes = list(dict.fromkeys(tuple(int(v) for v in s.split("x")) for s in shapes_text.split(",")))
    impls = args.impls.split(",")
    ms = [int(v) for v in args.m.split(",")]
    gen = torch.Generator().manual_seed(0)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    results = []
    print(f"{'N':>6} {'K':>6} {'M':>5} {'impl':>18} {'us':>9} {'TFLOP/s':>8} {'relerr':>8}")
    for n, k in shapes:
        sets = min(8, buffer_sets_for_cold_l2(n * k // 2 + min(ms) * k * 3))
        w, (packs, packs16, baselines) = _prepare(n, k, sets, gen, cublas=bool({"torch_bf16", "scaled_mm"} & set(impls)),
                                                  weights=args.weights)
        # (the same weight packed with each fold span)
        qw = quant.quantize(w, args.weights) if spans else None
        span_packs = {}
        for span in spans:
            first = w4a8.pack(qw, mxfp4_span=span).to("cuda")
            span_packs[span] = [first] + [dataclasses.replace(first, w=first.w.clone(), w_scale=first.w_scale.clone())
                                          for _ in range(sets - 1)]
        humming = None
        if "humming" in impls:
            try:
                start = time.perf_counter()
                humming = _humming_layers(w, sets, args.int8, args.weights)
                print(f"humming layers for {n}x{k}: {time.perf_counter() - start:.1f} s")
            except Exception as exc:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                print(f"humming unavailable for {n}x{k}: {type(exc).__name__}: {exc}"[:300])
        activations = "int8:token" if args.int8 else ACTIVATIONS
        for m in ms:
            tile = w4a8.select_sync_tile(m).label if args.portable else args.tile
            xs = [torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16) for _ in range(sets)]
            qas = [ops.quantize_activation(x, activations) for x in xs]
            ref = w4a8.reference(qas[0], packs[0]).float()
            calls = {
                "humming_aot": [lambda qa=qa, p=p: w4a8.gemm(qa, p, tile=tile) for qa, p in zip(qas, packs)],
                "humming_aot+quant": [lambda x=x, p=p: w4a8.gemm(ops.quantize_activation(x, activations), p,
                                                                 tile=tile) for x, p in zip(xs, packs)],
                "w4a16": [lambda x=x, p=p: ops.gemm(x, p) for x, p in zip(xs, packs16)],
            }
            for span, sp in span_packs.items():
                calls[f"humming_aot:span{span}"] = [lambda qa=qa, p=p: w4a8.gemm(qa, p, tile=tile)
                                                    for qa, p in zip(qas, sp)]
            if humming is not None:
                calls["humming"] = [lambda x=x, layer=layer: layer(x) for x, layer in zip(xs, humming)]
            if baselines:
                calls["torch_bf16"] = [lambda x=x, b=b: torch.nn.functional.linear(x, b[0]) for x, b in zip(xs, baselines)]
            if baselines and not args.int8:  # (float8 activations only)
                calls["scaled_mm"] = [lambda qa=qa, b=b: torch._scaled_mm(qa.codes.view(torch.float8_e4m3fn), b[1],
                                                                          scale_a=qa.scales, scale_b=b[2],
                                                                          out_dtype=torch.bfloat16)
                                      for qa, b in zip(qas, baselines)]
            for impl in impls + [f"humming_aot:span{span}" for span in span_packs if "humming_aot" in impls]:
                if impl not in calls:
                    continue
                try:
                    out = calls[impl][0]()[:m].float()
                    relerr = ((out - ref).abs().max() / ref.abs().max()).item()
                    timing = time_cuda_graph(with_front(calls[impl], args.front), repeats=args.repeats)
                except Exception as exc:  # noqa: BLE001
                    print(f"{n:>6} {k:>6} {m:>5} {impl:>18} failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                us = timing["median_us"]
                row = {"impl": impl, "m": m, "n": n, "k": k, "us": us, "p10_us": timing["p10_us"],
                       "p90_us": timing["p90_us"], "tflops": tflops(gemm_flops(m, n, k), us), "relerr": relerr, "front": args.front,
                       "quant_split": list(quant_split) if impl.endswith("+quant") else None,
                       "w4a8": True, "weights": args.weights,
                       "span": (int(impl.split(":span")[1]) if ":span" in impl
                                else packs[0].group_size // w4a8.K_TILE if args.weights == "mxfp4" else None),
                       "int8": args.int8,
                       "tile": (w4a8.select_tile(m, n=n, num_sms=sms, weight_element=packs[0].element).label
                                if impl.startswith("humming_aot") and not tile and not args.int8
                                else w4a8.select_sync_tile(m).label if impl.startswith("humming_aot") and not tile
                                else tile)}
                results.append(row)
                print(f"{n:>6} {k:>6} {m:>5} {impl:>18} {us:9.1f} {row['tflops']:8.1f} {relerr:8.1e}")
    if args.json_path:
        write_results_json(args.json_path, results, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
