"""One W8A8 GEMM launch for a profiler: builds the operands, runs the GEMM once untimed (kernel
load), then once inside the NVTX range "profile" that ncu selects
(``ncu --nvtx --nvtx-include "profile/" ...``).

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section WarpStateStats \\
        python3 tools/bench/profile_w8a8.py --shape 7168x18432 --m 4096 --blocks

``--cublas`` (channel x token scales) also runs torch._scaled_mm once in the range "cublas", for
``--nvtx-include "cublas/"`` beside ours; ``--humming`` runs Humming's W8A8 layer of the same
pairing once in the range "humming" (its quantization kernel and its GEMM). ``--int8``: int8
channel x token instead of float8; ``--w4a8``: W4A8 (int4:g128 x float8e4m3:token, humming_aot.w4a8).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from humming_aot import ops, quant, w4a8, w8a8  # noqa: E402


def _bench_w8a8():
    """tools/bench/bench_w8a8.py as a module (the pairings' formats, Humming's layers)."""
    from humming_aot.testing.bench import sibling_tool

    return sibling_tool("bench_w8a8", __file__)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="7168x18432", help="N x K")
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--blocks", action="store_true", help="128 x 128 weight blocks x 1 x 128 token groups")
    parser.add_argument("--tile", default=None)
    parser.add_argument("--int8", action="store_true", help="int8:channel weights x int8:token activations")
    parser.add_argument("--w4a8", action="store_true", help="int4:g128 weights x float8e4m3:token activations")
    parser.add_argument("--humming", action="store_true",
                        help="also run Humming's W8A8 layer once inside the NVTX range \"humming\"")
    parser.add_argument("--cublas", action="store_true",
                        help="also run torch._scaled_mm (rowwise scales) once inside the NVTX range \"cublas\"")
    args = parser.parse_args(argv)
    n, k = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator().manual_seed(0)
    bench = _bench_w8a8()
    weights, act = ("int4:g128", "float8e4m3:token") if args.w4a8 else bench._formats(args.blocks, args.int8)
    module = w4a8 if args.w4a8 else w8a8
    w = torch.randn(n, k, generator=gen)
    packed = module.pack(quant.quantize(w, weights)).to("cuda")
    x = torch.randn(args.m, k, generator=gen).to("cuda", torch.bfloat16)
    qa = ops.quantize_activation(x, act)
    module.gemm(qa, packed, tile=args.tile)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("profile"):
        module.gemm(qa, packed, tile=args.tile)
    torch.cuda.synchronize()
    if args.humming:
        if args.w4a8:
            from humming_aot.testing.bench import sibling_tool

            (layer,) = sibling_tool("bench_w4a8", __file__)._humming_layers(w, 1)
        else:
            (layer,) = bench._humming_layers(w, 1, args.blocks, args.int8)
        layer(x)
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("humming"):
            layer(x)
        torch.cuda.synchronize()
    if args.cublas and not args.blocks and not args.int8 and not args.w4a8:
        qw = quant.quantize(torch.randn(n, k, generator=gen), weights)
        codes = qw.codes.cuda().view(torch.float8_e4m3fn).t()  # (K, N) column-major, as cuBLAS takes it
        scale_b = qw.scales.cuda().reshape(1, n)

        def scaled_mm():
            return torch._scaled_mm(qa.codes.view(torch.float8_e4m3fn), codes, scale_a=qa.scales, scale_b=scale_b,
                                    out_dtype=torch.bfloat16)

        scaled_mm()
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("cublas"):
            scaled_mm()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
