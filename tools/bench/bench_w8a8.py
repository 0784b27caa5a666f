"""Time the W8A8 GEMM side by side, in one run, over real layer shapes and M: float8 channel x
token scales (default), DeepSeek-V3's 128 x 128 weight blocks x 1 x 128 token groups (--blocks),
or int8 channel x token (--int8). Implementations: humming_aot.w8a8.gemm on pre-quantized
activations, the same with ops.quantize_activation in front (what a layer pays),
torch._scaled_mm with rowwise scales (cuBLAS; float8 channel x token only), torch._int_mm with
the two scales applied after it (cuBLAS; int8; it takes more than 16 rows, so fewer are padded to
17 beforehand), and Humming's W8A8 layer of the same pairing (its forward quantizes the bf16
input itself), each in a CUDA graph over buffer sets that keep L2 cold, median of repeats.

    python3 tools/bench/bench_w8a8.py --shape-set large-m --m 1,16,64,128,512,2048,8192 --json out.json
    python3 tools/bench/bench_w8a8.py --blocks --shapes 7168x18432,24576x1536 --m 1,128,4096
    python3 tools/bench/bench_w8a8.py --int8 --impls humming_aot,int_mm,humming --m 1,128,4096
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

from humming_aot import ops, quant, w8a8  # noqa: E402
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

IMPLS = ("humming_aot", "humming_aot+quant", "scaled_mm", "int_mm", "humming")


def _formats(blocks: bool, int8: bool) -> tuple[str, str]:
    """(weight format, activation format) of the benchmarked pairing."""
    if int8:
        return "int8:channel", "int8:token"
    return ("float8e4m3:b128x128", "float8e4m3:g128") if blocks else ("float8e4m3:channel", "float8e4m3:token")


def _prepare(n: int, k: int, sets: int, gen: torch.Generator, blocks: bool, int8: bool = False):
    """`sets` copies of a float8e4m3 (per channel, or per 128 x 128 block) or int8 weight: ours
    packed, cuBLAS's (K, N) column-major codes and (1, N) scales, and the float weight for Humming."""
    w = torch.randn(n, k, generator=gen)
    qw = quant.quantize(w, _formats(blocks, int8)[0])
    packed = w8a8.pack(qw).to("cuda")
    codes = qw.codes.cuda().view(torch.int8 if int8 else torch.float8_e4m3fn)
    cublas = (codes.t(), qw.scales.cuda().reshape(1, n) if not blocks else qw.scales.cuda())
    return w, [packed] + [dataclasses.replace(packed, w=packed.w.clone(), w_scale=packed.w_scale.clone())
                          for _ in range(sets - 1)], [cublas] + [(cublas[0].clone(), cublas[1].clone())
                                                                for _ in range(sets - 1)]


def _humming_layers(w: torch.Tensor, sets: int, blocks: bool, int8: bool = False):
    from humming.layer import HummingLayer

    n, k = w.shape
    if int8:
        weight_config = {"dtype": "int8", "group_size": 0}
        input_config = {"dtype": "int8", "quant_mode": "dynamic_token"}
    elif blocks:
        weight_config = {"dtype": "float8e4m3", "group_size": 128, "group_size_n": 128}
        input_config = {"dtype": "float8e4m3", "group_size": 128, "quant_mode": "dynamic_group"}
    else:
        weight_config = {"dtype": "float8e4m3", "group_size": 0}
        input_config = {"dtype": "float8e4m3", "quant_mode": "dynamic_token"}
    layers = []
    for _ in range(sets):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(weight_config), input_config=dict(input_config),
                             torch_dtype=torch.bfloat16).cuda()
        layer.load_from_unquantized(w.to(torch.bfloat16).cuda())
        layer.transform()
        layers.append(layer)
    return layers


def main(argv=None) -> int:
    bench_gemm = sibling_tool("bench_gemm", __file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape-set", default="large-m", help=f"names from {', '.join(bench_gemm.SHAPE_SETS)}")
    parser.add_argument("--shapes", default=None, help="N x K list instead of the set, e.g. 8192x8192,4096x14336")
    parser.add_argument("--m", default="1,16,32,64,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tile", default=None, help="force this wgmma-ss (or mma-ss) tile on humming_aot")
    parser.add_argument("--stream-k", type=int, default=None,
                        help="humming_aot's stream-K CTAs (0: the tail split; default: the heuristic's choice)")
    parser.add_argument("--portable", action="store_true", help="humming_aot through the mma-ss body's table "
                        "(w8a8.select_sync_tile: what GPUs without wgmma run) instead of wgmma-ss's")
    parser.add_argument("--blocks", action="store_true", help="DeepSeek-V3 scaling: float8e4m3:b128x128 weights, "
                        "float8e4m3:g128 activations")
    parser.add_argument("--int8", action="store_true", help="int8:channel weights x int8:token activations")
    add_front_argument(parser)
    add_quant_split_argument(parser)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    try:
        quant_split = apply_quant_split(args.quant_split)
    except ValueError as exc:
        parser.error(str(exc))
    shapes_text = args.shapes or ",".join(bench_gemm.SHAPE_SETS[s] for s in args.shape_set.split(","))
    shapes = list(dict.fromkeys(tuple(int(v) for v in s.split("x")) for s in shapes_text.split(",")))
    impls = args.impls.split(",")
    ms = [int(v) for v in args.m.split(",")]
    gen = torch.Generator().manual_seed(0)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    results = []
    print(f"{'N':>6} {'K':>6} {'M':>5} {'impl':>18} {'us':>9} {'TFLOP/s':>8} {'relerr':>8}")
    for n, k in shapes:
        # enough sets that the smallest M's calls (the weight, mostly) meet a cold L2; larger M only
        # have more to evict
        sets = min(8, buffer_sets_for_cold_l2(n * k + min(ms) * k * 3))
        w, packs, cublas = _prepare(n, k, sets, gen, args.blocks, args.int8)
        humming = None
        if "humming" in impls:
            try:
                start = time.perf_counter()
                humming = _humming_layers(w, sets, args.blocks, args.int8)
                print(f"humming layers for {n}x{k}: {time.perf_counter() - start:.1f} s")
            except Exception as exc:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                print(f"humming unavailable for {n}x{k}: {type(exc).__name__}: {exc}"[:300])
        for m in ms:
            tile = w8a8.select_sync_tile(m).label if args.portable else args.tile
            xs = [torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16) for _ in range(sets)]
            act = _formats(args.blocks, args.int8)[1]
            qas = [ops.quantize_activation(x, act) for x in xs]
            # torch._int_mm takes more than 16 rows: fewer are padded to 17 (zero codes) beforehand
            int_rows = [torch.nn.functional.pad(qa.codes, (0, 0, 0, max(0, 17 - m))).view(torch.int8) for qa in qas]
            int_scales = [torch.nn.functional.pad(qa.scales.reshape(-1, 1), (0, 0, 0, max(0, 17 - m))) for qa in qas]
            ref = w8a8.reference(qas[0], packs[0]).float()
            calls = {
                "humming_aot": [lambda qa=qa, p=p: w8a8.gemm(qa, p, tile=tile, stream_k=args.stream_k) for qa, p in zip(qas, packs)],
                "humming_aot+quant": [lambda x=x, p=p: w8a8.gemm(ops.quantize_activation(x, act), p, tile=tile,
                                                                        stream_k=args.stream_k)
                                      for x, p in zip(xs, packs)],
                "scaled_mm": [lambda qa=qa, c=c: torch._scaled_mm(qa.codes.view(torch.float8_e4m3fn), c[0],
                                                                  scale_a=qa.scales, scale_b=c[1],
                                                                  out_dtype=torch.bfloat16)
                              for qa, c in zip(qas, cublas)],
                "int_mm": [lambda a=a, sa=sa, c=c: (torch._int_mm(a, c[0]).float() * sa * c[1]).to(torch.bfloat16)
                           for a, sa, c in zip(int_rows, int_scales, cublas)],
            }
            if args.blocks or args.int8:
                del calls["scaled_mm"]
            if not args.int8:
                del calls["int_mm"]
            if humming is not None:
                calls["humming"] = [lambda x=x, layer=layer: layer(x) for x, layer in zip(xs, humming)]
            for impl in impls:
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
                       "blocks": args.blocks, "int8": args.int8, "stream_k": args.stream_k,
                       "tile": (w8a8.select_tile(m, args.blocks, n=n, num_sms=sms,
                                                 element="int8" if args.int8 else "float8e4m3", k=k).label
                                if impl.startswith("humming_aot") and not tile else tile)}
                results.append(row)
                print(f"{n:>6} {k:>6} {m:>5} {impl:>18} {us:9.1f} {row['tflops']:8.1f} {relerr:8.1e}")
    if args.json_path:
        write_results_json(args.json_path, results, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
