#!/usr/bin/env python3
"""Time humming_aot's weight-only GEMM against torch and Humming on the same GPU, in one run.

Every timing is a CUDA graph replayed over inputs rotated past 2x L2 (cold L2 each call), timed
with CUDA events, median of --repeats (humming_aot.testing.bench.time_cuda_graph). Side by side:

  humming_aot      humming_aot.ops.gemm on humming_aot.pack(humming_aot.quantize(w, fmt)), integer
                   codes redrawn over every code of the element (same bytes read; see
                   prepare_humming_aot)
  torch_bf16       a @ w.T with the unquantized bf16/fp16 weight (cuBLAS)
  torch_int4pack   torch._weight_int4pack_mm (tinygemm; int4 formats with a group size only)
  torch_int8pack   torch._weight_int8pack_mm (int8:channel only, where torch has a CUDA kernel)
  humming          humming.layer.HummingLayer from humming-kernels, when importable

GB/s counts the bytes a call must move: packed weight + scales (+ zero points) + activation read
+ output written. Correctness is the tests' job; the "relerr" column is only a guard that a
timed kernel computes the right thing (max |out - torch(a @ w_eff.T)| / max |torch(...)|).
Benchmarks never assert: anything unavailable is reported as "n/a: reason".

    python3 tools/bench/bench_gemm.py --json bench.json
    python3 tools/bench/bench_gemm.py --shapes 8192x8192 --m 1,16 --formats int4:g128,int8:channel
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_REPO_ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(_REPO_ROOT))

from humming_aot.testing.bench import (  # noqa: E402 - after the path fix above
    buffer_sets_for_cold_l2,
    finite,
    gbps,
    gemm_flops,
    l2_cache_bytes,
    resume_run,
    tflops,
    time_cuda_graph,
    write_json,
)

DEFAULT_SHAPES = "8192x8192,4096x14336,14336x4096"  # N x K: the anchor, then a 7-8B MLP's down / up
# Named sets of real layers (N x K of the nn.Linear weights), --shape-set NAME[,NAME...]. These are
# examples of real models, not a list to tune to.
SHAPE_SETS = {
    "llama3-8b": "6144x4096,4096x4096,28672x4096,4096x14336",  # qkv, o, gate_up, down
    "llama3-70b": "10240x8192,8192x8192,57344x8192,8192x28672",
    "qwen2.5-72b": "10240x8192,59136x8192,8192x29568",
    "deepseek-v3-dense": "36864x7168,7168x18432",  # the dense layers' gate_up and down
    "anchor": "8192x8192",
}
SHAPE_SETS["large-m"] = ",".join(dict.fromkeys(",".join(SHAPE_SETS.values()).split(",")))  # all, each once
# Other real layers, outside large-m: Qwen2-7B down, Llama-2-13B gate/up and o (checks that tile
# choices made on large-m hold elsewhere).
SHAPE_SETS["more-layers"] = "3584x18944,13824x5120,5120x5120"
DEFAULT_MS = "1,16,64,256,1024,4096,8192"
ALL_IMPLS = ("humming_aot", "torch_bf16", "torch_int4pack", "torch_int8pack", "humming")
# humming-kernels weight_config per humming_aot format (Humming stores symmetric int-b weights as
# uint-b codes with the implicit zero point 2^(b-1); group scales default to the activation dtype).
HUMMING_WEIGHT_CONFIG = {
    **{f"int{b}:g128": {"dtype": f"uint{b}", "group_size": 128} for b in range(1, 9)},
    **{f"uint{b}:g128:zp": {"dtype": f"uint{b}", "group_size": 128, "has_zero_point": True} for b in range(1, 9)},
    "int8:channel": {"dtype": "uint8", "group_size": 0},
    "float4e2m1:g128": {"dtype": "float4e2m1", "group_size": 128},
    "float4e2m1:g32": {"dtype": "float4e2m1", "group_size": 32},
    "mxfp4": {"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"},
    "nvfp4": {"dtype": "float4e2m1", "group_size": 16, "scale_dtype": "float8e4m3", "scale_2_type": "tensor"},
    "mxfp8": {"dtype": "float8e4m3", "group_size": 32, "scale_dtype": "float8e8m0"},
    "float8e4m3:channel": {"dtype": "float8e4m3", "group_size": 0},
    "float8e4m3:g128": {"dtype": "float8e4m3", "group_size": 128},
    # not timed side by side yet (no device time left when it was added)
    **{f"uint{b}:g128:zpf": {"dtype": f"uint{b}", "group_size": 128, "has_zero_point": True,
                             "is_fp_zero_point": True} for b in range(1, 9)},
}
_POINT_BUDGET_S = 5.0  # seconds of GPU time one (impl, M) point may take before repeats shrink
_RELERR_WARN = 2e-2  # a guard, not a tolerance: far above bf16 rounding, far below a wrong result


@dataclasses.dataclass
class Impl:
    """One implementation prepared for one (N, K, format): per-copy weights and a call."""

    name: str
    fmt: str
    weight_bytes: int  # bytes of one copy the kernel reads: packed weight + scales (+ zero points)
    weights: list[Any]  # one prepared weight per copy; copies rotate with the activations
    call: Callable[[torch.Tensor, Any], torch.Tensor]
    reference_weight: torch.Tensor | None = None  # (N, K) exact operand for the relerr guard
    tile: str | None = None
    note: str = ""
    n: int = 0  # set by the caller that prepared it
    k: int = 0


class Unavailable(Exception):
    """An implementation cannot be timed here; the message says why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma list of NxK (default {DEFAULT_SHAPES})")
    parser.add_argument("--shape-set", default=None,
                        help=f"named shape sets instead of --shapes, comma list from {', '.join(SHAPE_SETS)}")
    parser.add_argument("--m", default=DEFAULT_MS, help=f"comma list of M (default {DEFAULT_MS})")
    parser.add_argument("--formats", default="int4:g128", help="comma list of weight formats: int4:g128, uint4:g128:zp, int8:channel")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"], help="activation and output dtype")
    parser.add_argument("--impls", default=",".join(ALL_IMPLS), help=f"comma list from {', '.join(ALL_IMPLS)}")
    parser.add_argument("--repeats", type=int, default=30, help="timed graph replays per point (median reported)")
    parser.add_argument("--tile", default=None, help="force a humming_aot tile (via humming_aot.ops._gemm_with_tile) for tuning")
    parser.add_argument("--codes", default="every", choices=["every", "shared", "quantized"],
                        help="humming_aot's integer codes: every (drawn uniformly over every code; Humming and cuBLAS "
                             "get the float weight), shared (the same, and Humming quantizes humming_aot's "
                             "dequantized weight, so both read the same codes), quantized (humming_aot.quantize's "
                             "codes of the float weight, as Humming and cuBLAS get it). The three moved ours and "
                             "Humming by 0-4 %% at 128-4096 tokens, within the spread (log section 70)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", default=None, help="write results as JSON here")
    parser.add_argument("--resume", action="store_true", help="go on with the run in --json: skip the shapes it "
                        "finished (same device and arguments; humming_aot.testing.bench.resume_run)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no shape after this many seconds (with --json, a later --resume goes on)")
    parser.add_argument("--plot", dest="plot_path", default=None,
                        help="also write a PNG of time against M per shape here (tools/bench/plot_bench.py; needs matplotlib)")
    args = parser.parse_args(argv)
    if args.resume and not args.json_path:
        parser.error("--resume goes on with the run in --json FILE: give --json")
    if args.shape_set:
        unknown = [name for name in args.shape_set.split(",") if name not in SHAPE_SETS]
        if unknown:
            parser.error(f"--shape-set {','.join(unknown)}: not a shape set; choose from {', '.join(SHAPE_SETS)}")
        args.shapes = ",".join(dict.fromkeys(",".join(SHAPE_SETS[name] for name in args.shape_set.split(",")).split(",")))
    return args


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        n, k = item.lower().strip().split("x")
        shapes.append((int(n), int(k)))
    return shapes


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _weight_bits(fmt: str) -> int:
    """Bits per weight code of a format string (8 when it does not parse: sizes stay safe)."""
    try:
        from humming_aot import formats
        from humming_aot.quant import WeightFormat

        return formats.get(WeightFormat.parse(fmt).element).bits
    except Exception:  # noqa: BLE001 - only sizes the rotation
        return 8


def _group_size(fmt: str) -> int | None:
    """128 for 'int4:g128', None for channel scales."""
    for part in fmt.split(":")[1:]:
        if part.startswith("g") and part[1:].isdigit():
            return int(part[1:])
    return None


# --------------------------------------------------------------------------- implementations


def prepare_humming_aot(w: torch.Tensor, fmt: str, dtype: torch.dtype, copies: int, tile: str | None,
                        every_code: bool = True) -> Impl:
    try:
        import humming_aot
        import humming_aot.ops as ops
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"import humming_aot failed: {_reason(exc)}") from exc
    w32 = w.float()
    try:
        qw = humming_aot.quantize(w32, fmt)
    except Exception:  # noqa: BLE001 - quantize may be CPU-only; the result is the same
        qw = humming_aot.quantize(w32.cpu(), fmt)
    # Integer codes drawn over every code of the element: the kernel reads the same bytes, and the
    # relerr guard can fail (the symmetric int1 recipe quantizes any weight to all zeros, which a
    # kernel that writes zeros would match).
    from humming_aot.testing.numerics import with_every_code

    if every_code:
        qw = with_every_code(qw, torch.Generator(device=qw.codes.device).manual_seed(0))
    packed = [public_pack(humming_aot)(qw, dtype, device=w.device) for _ in range(copies)]
    call: Callable[[torch.Tensor, Any], torch.Tensor] = ops.gemm
    note = ""
    if tile is not None:
        gemm_with_tile = getattr(ops, "_gemm_with_tile", None) or getattr(ops, "gemm_with_tile", None)
        if gemm_with_tile is None:
            note = "--tile ignored: humming_aot.ops has no _gemm_with_tile / gemm_with_tile"
            tile = None
        else:
            call = lambda a, p, _tile=tile: gemm_with_tile(a, p, _tile)  # noqa: E731
    return Impl(
        name="humming_aot",
        fmt=fmt,
        weight_bytes=int(packed[0].nbytes),
        weights=packed,
        call=call,
        reference_weight=packed[0].effective_weight().to(device=w.device, dtype=dtype),
        tile=tile,
        note=note,
    )


def public_pack(package: types.ModuleType) -> Callable[..., Any]:
    """``humming_aot.pack`` the function, even where the package attribute has been rebound to the
    submodule of the same name (which importing ``humming_aot.pack`` does)."""
    pack = package.pack
    return pack.pack if isinstance(pack, types.ModuleType) else pack


def prepare_torch_dense(w: torch.Tensor, dtype: torch.dtype) -> Impl:
    w16 = w.to(dtype)
    return Impl(name="torch_bf16" if dtype == torch.bfloat16 else "torch_f16", fmt=str(dtype).removeprefix("torch."),
                weight_bytes=w16.nbytes, weights=[w16], call=lambda a, wt: a @ wt.T, reference_weight=w16)


def prepare_torch_int4pack(w: torch.Tensor, fmt: str, dtype: torch.dtype, copies: int, generator: torch.Generator) -> Impl:
    """tinygemm: uint4 codes q with a bf16 scale s and an additive bf16 zero z per (group, column):
    w = (q - 8) * s + z. Its weight input is uint8 (N, K/2), two codes per byte, the even k in the
    high nibble, converted to the tensor-core tiled layout by _convert_weight_to_int4pack; scales
    and zeros are one (K/g, N, 2) tensor. Random codes: the timing does not depend on them."""
    group = _group_size(fmt)
    if not fmt.split(":")[0].endswith("int4") or group is None:
        raise Unavailable(f"torch int4pack is for int4 group formats, not {fmt}")
    if dtype != torch.bfloat16:
        raise Unavailable("torch._weight_int4pack_mm takes bfloat16 activations")
    n, k = w.shape
    weights = []
    reference = None
    for _ in range(copies):
        codes = torch.randint(0, 16, (n, k), generator=generator, device="cpu", dtype=torch.int32).to(w.device)
        packed_u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
        w_pack = _convert_int4pack(packed_u8)
        scale = (torch.rand((k // group, n), generator=generator) * 0.01 + 0.001).to(device=w.device, dtype=dtype)
        zero = (torch.randn((k // group, n), generator=generator) * 0.01).to(device=w.device, dtype=dtype)
        scales_and_zeros = torch.stack([scale, zero], dim=2).contiguous()
        weights.append((w_pack, scales_and_zeros))
        if reference is None:
            s = scale.float().repeat_interleave(group, dim=0).T
            z = zero.float().repeat_interleave(group, dim=0).T
            reference = ((codes.float() - 8) * s + z).to(dtype)
    return Impl(
        name="torch_int4pack",
        fmt=fmt,
        weight_bytes=weights[0][0].nbytes + weights[0][1].nbytes,
        weights=weights,
        call=lambda a, wt, _g=group: torch._weight_int4pack_mm(a, wt[0], _g, wt[1]),
        reference_weight=reference,
    )


def _convert_int4pack(packed_u8: torch.Tensor) -> torch.Tensor:
    errors = []
    for inner_k_tiles in (8, 4, 2):  # 8 is torchao's default; smaller K needs fewer tiles
        try:
            return torch._convert_weight_to_int4pack(packed_u8, inner_k_tiles)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"innerKTiles={inner_k_tiles}: {_reason(exc)}")
    raise Unavailable("torch._convert_weight_to_int4pack failed: " + "; ".join(errors))


def prepare_torch_int8pack(w: torch.Tensor, fmt: str, dtype: torch.dtype, copies: int, generator: torch.Generator) -> Impl:
    if fmt != "int8:channel":
        raise Unavailable(f"torch int8pack is for int8:channel, not {fmt}")
    n, k = w.shape
    weights = []
    for _ in range(copies):
        codes = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int32).to(device=w.device, dtype=torch.int8)
        scale = (torch.rand(n, generator=generator) * 0.01 + 0.001).to(device=w.device, dtype=dtype)
        weights.append((codes, scale))
    probe = torch.zeros((1, k), device=w.device, dtype=dtype)
    try:
        torch._weight_int8pack_mm(probe, weights[0][0], weights[0][1])
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"torch._weight_int8pack_mm: {_reason(exc)}") from exc
    return Impl(
        name="torch_int8pack",
        fmt=fmt,
        weight_bytes=weights[0][0].nbytes + weights[0][1].nbytes,
        weights=weights,
        call=lambda a, wt: torch._weight_int8pack_mm(a, wt[0], wt[1]),
        reference_weight=(weights[0][0].float() * weights[0][1].float()[:, None]).to(dtype),
    )


def prepare_humming(w: torch.Tensor, fmt: str, dtype: torch.dtype, copies: int) -> Impl:
    if fmt not in HUMMING_WEIGHT_CONFIG:
        raise Unavailable(f"no humming weight_config mapped for {fmt}")
    try:
        from humming.layer import HummingLayer
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"import humming failed: {_reason(exc)}") from exc
    n, k = w.shape
    layers = []
    for _ in range(copies):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(HUMMING_WEIGHT_CONFIG[fmt]), torch_dtype=dtype).cuda()
        layer.load_from_unquantized(w.to(dtype))
        layer.transform()
        layers.append(layer)
    weight_bytes = sum(t.nbytes for t in layers[0].parameters())
    weight_bytes += sum(t.nbytes for name, t in layers[0].named_buffers() if "lock" not in name)
    # The first call JIT-compiles every M-interval kernel of this layer: do it here, untimed.
    start = time.perf_counter()
    for m in (1, 4096):
        layers[0](torch.zeros((m, k), device=w.device, dtype=dtype))
    torch.cuda.synchronize()
    note = f"first call (JIT) {time.perf_counter() - start:.1f} s"
    return Impl(name="humming", fmt=fmt, weight_bytes=weight_bytes, weights=layers, call=lambda a, layer: layer(a), note=note)


# --------------------------------------------------------------------------- timing


def output_error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float | None, float | None]:
    """(max |out - ref| / max |ref|, None), or (None, max |out - ref|) when ref is all zeros: a
    weight that quantizes to zeros (humming_aot.quantize's int1 recipe does, for any input) has
    nothing to be relative to."""
    err, ref_max = (out.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()
    return (err / ref_max, None) if ref_max > 0 else (None, err)


def time_impl(impl: Impl, m: int, dtype: torch.dtype, repeats: int, generator: torch.Generator) -> dict[str, Any]:
    n, k = impl.n, impl.k
    bytes_per_call = impl.weight_bytes + m * k * dtype.itemsize + m * n * dtype.itemsize
    sets = min(buffer_sets_for_cold_l2(bytes_per_call), len(impl.weights))
    activations = [torch.randn((m, k), generator=generator, dtype=torch.float32).to(device="cuda", dtype=dtype) for _ in range(sets)]

    relerr = zero_ref_abs_err = None
    if impl.reference_weight is not None:
        out = impl.call(activations[0], impl.weights[0])
        relerr, zero_ref_abs_err = output_error(out, activations[0] @ impl.reference_weight.T)

    fns = [lambda a=a, wt=wt: impl.call(a, wt) for a, wt in zip(activations, impl.weights)]
    # A hopeless baseline (seconds per call) gets fewer repeats instead of stalling the sweep.
    call_us = _eager_call_us(fns[0])
    slow = call_us * sets * (repeats + 6) > _POINT_BUDGET_S * 1e6
    if slow:
        repeats = max(3, int(_POINT_BUDGET_S * 1e6 / (call_us * sets)) - 3)
    timing = time_cuda_graph(fns, repeats=repeats, inner=1 if slow else None,
                             warmup_replays=1 if slow else 3, warmup_passes=1 if slow else 2)
    us = timing["median_us"]
    return {
        "impl": impl.name,
        "fmt": impl.fmt,
        "m": m,
        "n": n,
        "k": k,
        "us": us,
        "p10_us": timing["p10_us"],
        "p90_us": timing["p90_us"],
        "tflops": tflops(gemm_flops(m, n, k), us),
        "gbps": gbps(bytes_per_call, us),
        "bytes": bytes_per_call,
        "buffer_sets": sets,
        "calls_per_replay": timing["calls_per_replay"],
        "mode": timing["mode"],
        "relerr": relerr,
        **({"zero_reference_abs_err": zero_ref_abs_err} if zero_ref_abs_err is not None else {}),
        **({"tile": impl.tile} if impl.tile else {}),
    }


def _eager_call_us(fn: Callable[[], Any]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def measure_read_bandwidth() -> float | None:
    """Measured HBM read GB/s (a sum over 1 GiB of float32, cold L2): the roofline for %BW, since
    a weight-only GEMM mostly streams weights in."""
    try:
        nbytes = 1 << 30
        x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        timing = time_cuda_graph([lambda: x.sum()], repeats=10)
        return gbps(nbytes, timing["median_us"])
    except Exception as exc:  # noqa: BLE001
        print(f"read bandwidth: n/a: {_reason(exc)}")
        return None


# --------------------------------------------------------------------------- environment and output


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "capability": "sm%d%d" % torch.cuda.get_device_capability(),
        "l2_bytes": l2_cache_bytes(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "driver": _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "git_sha": _git_sha(),
    }
    for package, key in (("humming_aot", "humming_aot"), ("humming", "humming")):
        try:
            module = __import__(package)
            info[key] = getattr(module, "__version__", "unknown")
        except Exception as exc:  # noqa: BLE001
            info[key] = f"n/a: {_reason(exc)}"
    if info["humming"] == "unknown":
        try:
            from importlib.metadata import version

            info["humming"] = version("humming-kernels")
        except Exception:  # noqa: BLE001
            pass
    return info


def _command_output(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
        return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None
    except Exception:  # noqa: BLE001
        return None


def _git_sha() -> str | None:
    sha = _command_output(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT)
    if sha and _command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO_ROOT):
        sha += "-dirty"
    return sha


_COLUMNS = ("M", "N", "K", "format", "impl", "us", "TFLOP/s", "GB/s", "%BW", "relerr", "note")
_ROW = "{:>5} {:>6} {:>6} {:<14} {:<15} {:>9} {:>8} {:>7} {:>5} {:>8}  {}"


def print_row(result: dict[str, Any], read_gbps: float | None) -> None:
    relerr = result.get("relerr")
    note = [] if result["mode"] == "graph" else [result["mode"]]
    if relerr is not None and not relerr <= _RELERR_WARN:
        note.append(f"!! relerr above {_RELERR_WARN:g}: check correctness")
    if result.get("zero_reference_abs_err") is not None:
        note.append(f"all-zero weight (no relerr): max |out| {result['zero_reference_abs_err']:.1e}")
    if result.get("tile"):
        note.append(f"tile={result['tile']}")
    pct = f"{100 * result['gbps'] / read_gbps:.0f}" if read_gbps else "-"
    print(_ROW.format(result["m"], result["n"], result["k"], result["fmt"], result["impl"], f"{result['us']:.1f}",
                      f"{result['tflops']:.1f}", f"{result['gbps']:.0f}", pct,
                      "-" if relerr is None else f"{relerr:.1e}", " ".join(note)), flush=True)


def humming_input(w: torch.Tensor, ours: Impl | None, codes: str) -> torch.Tensor:
    """The float weight Humming quantizes: with --codes shared humming_aot's exact operand (its
    dequantized weight, so that both read the same codes), else the float weight itself."""
    if codes == "shared" and ours is not None and ours.reference_weight is not None:
        return ours.reference_weight.float()
    return w


def prepare_shape(n: int, k: int, args: argparse.Namespace, dtype: torch.dtype, m_min: int,
                  unavailable: list[dict[str, Any]], generator: torch.Generator) -> list[Impl]:
    """Every requested implementation for one (N, K), from one random weight; the ones that cannot
    run here are printed and recorded in ``unavailable``."""
    w = torch.randn((n, k), generator=generator, dtype=torch.float32).to("cuda").mul_(0.02)
    impls = {i.strip() for i in args.impls.split(",")}
    prepared: list[Impl] = []

    def prepare(name: str, fmt: str, build: Callable[[], Impl]) -> None:
        try:
            impl = build()
        except Exception as exc:  # noqa: BLE001 - report and go on
            reason = _reason(exc) if isinstance(exc, Unavailable) else f"{_reason(exc)}\n{traceback.format_exc(limit=3)}"
            print(f"{name} {fmt} N={n} K={k}: n/a: {reason}", flush=True)
            unavailable.append({"impl": name, "fmt": fmt, "n": n, "k": k, "reason": _reason(exc)})
            return
        if impl.note:
            print(f"{name} {fmt} N={n} K={k}: {impl.note}", flush=True)
        impl.n, impl.k = n, k
        prepared.append(impl)

    if "torch_bf16" in impls:
        prepare("torch_bf16", args.dtype, lambda: prepare_torch_dense(w, dtype))
    for fmt in (f.strip() for f in args.formats.split(",") if f.strip()):
        # Weight copies for the rotation, sized at the smallest M from an estimate of the packed
        # bytes (bits per weight + 16-bit scales and zero points).
        bits = _weight_bits(fmt)
        scale_bytes = n * max(1, k // (_group_size(fmt) or k)) * dtype.itemsize * (2 if "zp" in fmt else 1)
        copies = buffer_sets_for_cold_l2(n * k * bits // 8 + scale_bytes + m_min * (n + k) * dtype.itemsize)
        ours = None
        if "humming_aot" in impls:
            prepare("humming_aot", fmt, lambda: prepare_humming_aot(w, fmt, dtype, copies, args.tile,
                                                                     every_code=args.codes != "quantized"))
            ours = prepared[-1] if prepared and (prepared[-1].name, prepared[-1].fmt) == ("humming_aot", fmt) else None
        if "torch_int4pack" in impls and fmt.split(":")[0].endswith("int4"):
            prepare("torch_int4pack", fmt, lambda: prepare_torch_int4pack(w, fmt, dtype, copies, generator))
        if "torch_int8pack" in impls and fmt == "int8:channel":
            prepare("torch_int8pack", fmt, lambda: prepare_torch_int8pack(w, fmt, dtype, copies, generator))
        if "humming" in impls:
            prepare("humming", fmt, lambda: prepare_humming(humming_input(w, ours, args.codes), fmt, dtype, copies))
    return prepared


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemm: no CUDA device; nothing to time")
        return 2
    dtype = getattr(torch, args.dtype)
    shapes = _parse_shapes(args.shapes)
    ms = [int(m) for m in args.m.split(",")]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = sorted(set(impls) - set(ALL_IMPLS))
    if unknown:
        print(f"bench_gemm: unknown --impls {unknown}; expected some of {ALL_IMPLS}")
        return 2

    env = environment()
    print(" ".join(f"{key}={value}" for key, value in env.items()), flush=True)
    read_gbps = measure_read_bandwidth()
    print(f"measured read bandwidth (the %BW roofline): {read_gbps:.0f} GB/s" if read_gbps else "%BW: n/a", flush=True)
    print(_ROW.format(*_COLUMNS), flush=True)

    try:
        results, unavailable, done = resume_run(args.json_path, vars(args), env["device"]) if args.resume else ([], [], [])
    except ValueError as exc:
        print(f"bench_gemm: {exc}")
        return 2
    generator = torch.Generator().manual_seed(args.seed)
    start = time.monotonic()
    for n, k in shapes:
        if [n, k] in done:
            continue
        if args.deadline_s is not None and time.monotonic() - start > args.deadline_s:
            print(f"deadline: {args.deadline_s:.0f} s passed; --resume goes on from {n}x{k}", flush=True)
            break
        prepared = prepare_shape(n, k, args, dtype, min(ms), unavailable, generator)
        for m in ms:
            for impl in prepared:
                try:
                    result = time_impl(impl, m, dtype, args.repeats, generator)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{impl.name} {impl.fmt} M={m} N={n} K={k}: n/a: {_reason(exc)}", flush=True)
                    unavailable.append({"impl": impl.name, "fmt": impl.fmt, "m": m, "n": n, "k": k, "reason": _reason(exc)})
                    torch.cuda.synchronize()
                    continue
                results.append(result)
                print_row(result, read_gbps)
        prepared.clear()
        torch.cuda.empty_cache()
        done.append([n, k])
        if args.json_path:  # after every shape, so that a run cut short by a time limit keeps its points
            _write_json(args.json_path, env, read_gbps, vars(args), results, unavailable, done)

    if args.json_path:
        _write_json(args.json_path, env, read_gbps, vars(args), results, unavailable, done)
        print(f"wrote {args.json_path}")
    if args.plot_path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from plot_bench import merge_results, plot

        print(f"wrote {plot(merge_results([{'results': results}]), args.plot_path, env.get('device', ''))}")
    return 0


def _write_json(path: str, env: dict, read_gbps: float | None, args: dict, results: list[dict[str, Any]],
                unavailable: list[dict[str, Any]], done: list[list[int]]) -> None:
    """The run's JSON; complete: False while shapes remain (a run cut short leaves that), and the
    shapes done ([N, K], what --resume skips)."""
    for result in results:
        result["pct_read_bw"] = 100 * result["gbps"] / read_gbps if read_gbps else None
    complete = all([n, k] in done for n, k in _parse_shapes(args["shapes"]))
    payload = {**env, "read_gbps": read_gbps, "args": args, "complete": complete, "shapes_done": done,
               "results": results, "unavailable": unavailable}
    write_json(path, finite(payload))


if __name__ == "__main__":
    sys.exit(main())
