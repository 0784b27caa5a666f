"""Time one QuantizedMoE layer end to end on the grouped kernels, and each of its steps, in one run.

    python3 tools/bench/bench_moe_layer.py --model deepseek-v3-tp8 --tokens 1,64 --json layer.json

The layer is a model's routed-expert MLP (bench_moe.py's table: GEMM1 gate_up (E, 2 I, H), GEMM2
down (E, H, I)) with random weights quantized to --format, forward(hidden, topk_ids, topk_weights)
with use_grouped_kernels (QuantizedMoE._forward_grouped_kernels). Steps, each timed on its own in
CUDA-graph replays (humming_aot.testing.bench) on the outputs of the steps before it:

  route       moe.group_rows: the grouped layout and its int32 offsets (the routing kernels of
              moe/cuda_steps.py; with HUMMING_AOT_HELPERS=0 torch's argsort, counts and cumsum)
  permute     the routed rows grouped expert after expert (moe.permute)
  gemm1       gate_up on the offsets (moe.gemm_grouped_kernel)
  activation  silu_and_mul, or swiglu_oai for gpt-oss (a helper kernel, or torch operations)
  gemm2       down on the offsets
  reduce      the weighted sum of each token's top-k rows (moe.combine: one helper kernel, or
              torch's unpermute and weighted_sum)

and the whole forward ("layer"), whose time the steps' sum should match (the difference is what
one graph of all of them saves in launch gaps). With --activations (e.g. float8e4m3:g128 with
--format float8e4m3:b128x128, DeepSeek-V3's fp8) the layer is the A8MoE of those activations
(QuantizedMoE.from_experts(..., activations=...)), whose steps are route, quantize (the hidden
states), gather (each routed row's codes and scales: moe.routing.gather_rows), gemm1
(moe.gemm_grouped_a8_kernel), activation, requantize (the intermediate), gemm2 and reduce. Each point rotates --routings routings drawn from
random scores, so that a call meets experts its predecessor did not read. --front torch puts a
torch kernel before every timed call (a model's router before the layer: nothing overlaps the
first kernel's launch); the default chains the calls. Benchmarks never assert.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot.testing.bench import add_front_argument, sibling_tool, time_cuda_graph, with_front, write_results_json  # noqa: E402

bench_moe = sibling_tool("bench_moe", __file__)

STEPS = ("route", "permute", "gemm1", "activation", "gemm2", "reduce")
A8_STEPS = ("route", "quantize", "gather", "gemm1", "activation", "requantize", "gemm2", "reduce")
ACTIVATIONS = {"gpt-oss-120b": "swiglu_oai"}  # else silu


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3-tp8", choices=sorted(bench_moe.MODELS))
    parser.add_argument("--tokens", default="1,64", help="comma list")
    parser.add_argument("--format", default="int4:g128")
    parser.add_argument("--activations", default=None,
                        help="8-bit activations (an A8MoE layer), e.g. float8e4m3:token, float8e4m3:g128")
    parser.add_argument("--routings", type=int, default=4, help="routings rotated per point")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    add_front_argument(parser, "a model's router before the layer")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens {args.tokens!r}: a comma list of token counts")
    if any(t < 1 for t in tokens):
        parser.error("--tokens: every count at least 1")
    return args


def make_layer(model: str, fmt: str, seed: int, device: torch.device, activations: str | None = None):
    """The model's routed-expert MLP with random weights (quantized on the device), opted in to
    the grouped kernels (with activations: the A8MoE of those 8-bit activations)."""
    from humming_aot.nn import QuantizedMoE

    experts, _, ((_, n1, k1), (_, n2, k2)) = bench_moe.MODELS[model]
    gen = torch.Generator(device=device).manual_seed(seed)
    gate_up = torch.randn(experts, n1, k1, generator=gen, device=device) * 0.02
    down = torch.randn(experts, n2, k2, generator=gen, device=device) * 0.02
    activation = ACTIVATIONS.get(model, "silu")
    biases = {}
    if activation == "swiglu_oai":
        biases = dict(gate_up_bias=(torch.randn(experts, n1, generator=gen, device=device) * 0.02).bfloat16(),
                      down_bias=(torch.randn(experts, n2, generator=gen, device=device) * 0.02).bfloat16())
    layer = QuantizedMoE.from_experts(gate_up, down, fmt=fmt, activation=activation, activations=activations,
                                      **biases)
    layer.use_grouped_kernels = True
    return layer


def _routing_step(layer, hidden: torch.Tensor, topk_ids: torch.Tensor):
    """(routed slots, expected rows per expert, the route step's closure: moe.group_rows and its
    int32 offsets), as both layers' forwards compute them."""
    from humming_aot import moe

    slots = hidden.shape[0] * topk_ids.shape[1]

    def route():
        routing = moe.group_rows(topk_ids, layer.num_experts, check_range=False)
        return routing, routing.offsets_int32

    return slots, max(1, -(-slots // layer.num_experts)), route


def a8_step_closures(layer, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> dict:
    """step_closures for an A8MoE: its forward (humming_aot.moe.layer_a8.A8MoE.forward) taken apart."""
    import dataclasses

    from humming_aot import moe
    from humming_aot.moe.layer_a8 import _per_row
    from humming_aot.moe.routing import gather_rows

    slots, expected, route = _routing_step(layer, hidden, topk_ids)
    routing, offsets = route()
    qx = _per_row(layer._quantize(hidden, 0), hidden.shape[0])

    def gather():
        return dataclasses.replace(qx, codes=gather_rows(qx.codes, routing.slot_of_row, routing.top_k),
                                   scales=gather_rows(qx.scales, routing.slot_of_row, routing.top_k))

    rows = gather()

    def gemm1():
        return moe.gemm_grouped_a8_kernel(rows, layer.gate_up, offsets, expected_m=expected, bias=layer.gate_up_bias,
                                          out_dtype=layer.out_dtype)

    h_out = gemm1()

    def activation():
        return moe.silu_and_mul(h_out) if layer.activation == "silu" else moe.swiglu_oai(h_out)

    h = activation()
    qh = _per_row(layer._quantize(h, 1), slots)

    def gemm2():
        return moe.gemm_grouped_a8_kernel(qh, layer.down, offsets, expected_m=expected, bias=layer.down_bias,
                                          out_dtype=layer.out_dtype)

    y_out = gemm2()
    return {
        "route": route,
        "quantize": lambda: layer._quantize(hidden, 0),
        "gather": gather,
        "gemm1": gemm1,
        "activation": activation,
        "requantize": lambda: layer._quantize(h, 1),
        "gemm2": gemm2,
        "reduce": lambda: moe.combine(y_out, routing, topk_weights),
        "layer": lambda: layer(hidden, topk_ids, topk_weights),
    }


def step_closures(layer, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> dict:
    """One closure per step (and "layer"), each on the outputs of the steps before it, computed
    once here: QuantizedMoE._forward_grouped_kernels taken apart."""
    from humming_aot import moe

    slots, expected, route = _routing_step(layer, hidden, topk_ids)
    routing, offsets = route()
    rows = moe.permute(hidden, routing)
    h_out = rows.new_empty(slots, layer.gate_up.out_features)
    y_out = rows.new_empty(slots, layer.down.out_features)

    def gemm1():
        return moe.gemm_grouped_kernel(rows, layer.gate_up, offsets=offsets, expected_m=expected,
                                       bias=layer.gate_up_bias, out=h_out)

    def activation():
        return moe.silu_and_mul(h_out) if layer.activation == "silu" else moe.swiglu_oai(h_out)

    h = activation()

    def gemm2():
        return moe.gemm_grouped_kernel(h, layer.down, offsets=offsets, expected_m=expected, bias=layer.down_bias,
                                       out=y_out)

    return {
        "route": route,
        "permute": lambda: moe.permute(hidden, routing),
        "gemm1": gemm1,
        "activation": activation,
        "gemm2": gemm2,
        "reduce": lambda: moe.combine(y_out, routing, topk_weights),
        "layer": lambda: layer(hidden, topk_ids, topk_weights),
    }


def bench(args: argparse.Namespace) -> list[dict]:
    device = torch.device("cuda")
    experts, top_k, ((_, _, hidden_size), _) = bench_moe.MODELS[args.model]
    layer = make_layer(args.model, args.format, args.seed, device, args.activations)
    steps, closures_of = (A8_STEPS, a8_step_closures) if args.activations else (STEPS, step_closures)
    results = []
    print(f"{args.model}: E {experts}, top-{top_k}, hidden {hidden_size}, {args.format}"
          f"{' x ' + args.activations if args.activations else ''}, {layer.activation}")
    for tokens in map(int, args.tokens.split(",")):
        per_routing = []
        for i in range(args.routings):
            r = bench_moe.route(tokens, experts, top_k, hidden_size, args.seed + i, device)
            weights = torch.softmax(torch.randn(tokens, top_k, device=device), dim=1)
            per_routing.append(closures_of(layer, r.hidden, r.topk_ids.to(torch.int32), weights))
        times = {}
        for step in (*steps, "layer"):
            timing = time_cuda_graph(with_front([closures[step] for closures in per_routing], args.front),
                                     repeats=args.repeats)
            times[step] = timing["median_us"]
            results.append(dict(model=args.model, tokens=tokens, format=args.format,
                                activations=args.activations, step=step, front=args.front,
                                us=timing["median_us"], p10_us=timing["p10_us"], p90_us=timing["p90_us"],
                                mode=timing["mode"]))
        total = sum(times[s] for s in steps)
        print(f"{tokens:>6} tokens: layer {times['layer']:.1f} us (steps sum {total:.1f}): " + ", ".join(
            f"{s} {times[s]:.1f} ({100 * times[s] / total:.0f} %)" for s in steps))
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_moe_layer.py needs a CUDA GPU")
    results = bench(args)
    if args.json_path:
        write_results_json(args.json_path, results, args=vars(args))


if __name__ == "__main__":
    main()
