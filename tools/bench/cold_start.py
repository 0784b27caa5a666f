#!/usr/bin/env python3
"""Cold start: from ``import humming_aot`` to the first GEMM's result, in a fresh process.

Each measurement runs in a new Python subprocess that first imports torch, initializes CUDA and
allocates its inputs (a serving process has all of that already), then times:

  import   ``import humming_aot`` and the quantization API (``humming_aot.quantize``)
  pack     ``humming_aot.pack(qw, dtype, device="cuda")`` of a weight quantized just before,
           outside the timed region (a checkpoint arrives quantized)
  first    the first ``humming_aot.ops.gemm`` + ``torch.cuda.synchronize()``: op registration,
           kernel selection, loading from the catalog (or a JIT compile), launch
  total    import + pack + first;  "second" (a warm eager call) is printed for contrast

It also reports which humming_aot modules the first GEMM loaded, any cache / catalog counters
the package exposes, and whether the same first GEMM succeeds with ``HUMMING_AOT_JIT=0`` (proof
that the kernel came from the catalog, not from a compile). A fresh ``XDG_CACHE_HOME`` is used so
that no JIT disk cache from an earlier run can hide a compile (``--keep-cache`` to disable;
HUMMING_AOT_CACHE_DIR is pointed there too).

    python3 tools/bench/cold_start.py --json cold_start.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]
_RESULT_TAG = "COLD_START_RESULT "
_PROBED_MODULES = ("humming_aot.ops", "humming_aot.kernels", "humming_aot.catalog", "humming_aot.jit")
_PROBED_ATTRS = ("cache_stats", "cache_info", "stats", "kernel_cache_stats", "catalog_hits", "hit_counts", "counters")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--format", dest="fmt", default="int4:g128")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes to time (median reported)")
    parser.add_argument("--keep-cache", action="store_true", help="do not isolate XDG_CACHE_HOME")
    parser.add_argument("--skip-jit-off", action="store_true", help="skip the HUMMING_AOT_JIT=0 catalog-only run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per subprocess")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- child (one fresh process)


def child(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    import torch

    torch.cuda.init()
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn((args.m, args.k), generator=gen).to(device="cuda", dtype=dtype)
    w = torch.randn((args.n, args.k), generator=gen).mul_(0.02).to("cuda")
    torch.cuda.synchronize()
    record: dict[str, Any] = {"torch_import_and_init_s": time.perf_counter() - t_start}
    modules_before = set(sys.modules)

    t0 = time.perf_counter()
    import humming_aot

    quantize = humming_aot.quantize  # loads the quantization modules: part of what a user imports
    t1 = time.perf_counter()
    try:
        qw = quantize(w, args.fmt)
    except Exception:  # noqa: BLE001 - a CPU-only quantize is just as good here: it is untimed
        qw = quantize(w.cpu(), args.fmt)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    pack = humming_aot.pack
    if isinstance(pack, types.ModuleType):  # the submodule humming_aot.pack rebinds the attribute
        pack = pack.pack
    packed = pack(qw, dtype, device="cuda")
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    modules_before_gemm = set(sys.modules)
    import humming_aot.ops as ops

    out = ops.gemm(a, packed)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    ops.gemm(a, packed)
    torch.cuda.synchronize()
    t5 = time.perf_counter()

    record.update(
        import_s=t1 - t0,
        quantize_untimed_s=t2 - t1,
        pack_s=t3 - t2,
        first_gemm_s=t4 - t3,
        total_s=(t1 - t0) + (t3 - t2) + (t4 - t3),
        second_gemm_s=t5 - t4,
        out_finite=bool(torch.isfinite(out).all().item()),
        humming_aot_version=getattr(humming_aot, "__version__", None),
        modules_loaded=sorted(m for m in set(sys.modules) - modules_before if m.startswith("humming_aot")),
        modules_loaded_by_first_gemm=sorted(m for m in set(sys.modules) - modules_before_gemm if m.startswith("humming_aot")),
        counters=_probe_counters(),
        kernels_loaded=_loaded_kernels(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=torch.cuda.get_device_name(),
    )
    return record


def _probe_counters() -> dict[str, str]:
    """Whatever cache / catalog statistics humming_aot exposes (none is required)."""
    found = {}
    for module_name in _PROBED_MODULES:
        module = sys.modules.get(module_name)
        for attr in _PROBED_ATTRS:
            value = getattr(module, attr, None) if module is not None else None
            if value is None:
                continue
            try:
                found[f"{module_name}.{attr}"] = repr(value() if callable(value) else value)[:500]
            except Exception as exc:  # noqa: BLE001
                found[f"{module_name}.{attr}"] = f"error: {type(exc).__name__}: {exc}"[:500]
    return found


def _loaded_kernels() -> dict[str, bool | None] | None:
    """Kernel name -> whether the installed catalog has it, for every kernel humming_aot loaded
    (read from its in-memory kernel cache; None where that is not inspectable)."""
    loaded = getattr(sys.modules.get("humming_aot.kernels"), "_loaded", None)
    if not isinstance(loaded, dict):
        return None
    names = sorted({key[0] if isinstance(key, tuple) else str(key) for key in loaded})
    try:
        from humming_aot.catalog import installed_catalog

        catalog = installed_catalog()
        return {name: catalog is not None and catalog.lookup(name) is not None for name in names}
    except Exception:  # noqa: BLE001
        return dict.fromkeys(names)


# --------------------------------------------------------------------------- parent


def run_child(args: argparse.Namespace, extra_env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--m", str(args.m), "--n", str(args.n), "--k", str(args.k),
           "--format", args.fmt, "--dtype", args.dtype]
    env = dict(os.environ)
    if importlib.util.find_spec("humming_aot") is None:  # a checkout, not an installed wheel
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra_env)
    with tempfile.TemporaryDirectory(prefix="humming_aot_cold_") as cache_dir:
        if not args.keep_cache:  # no JIT disk cache from an earlier run can hide a compile
            env["XDG_CACHE_HOME"] = cache_dir
            env["HUMMING_AOT_CACHE_DIR"] = os.path.join(cache_dir, "humming_aot")
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {args.timeout:.0f} s"}
        wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT_TAG):
            return {"ok": True, "process_wall_s": wall, **json.loads(line[len(_RESULT_TAG):])}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return {"ok": False, "returncode": proc.returncode, "error": "\n".join(tail)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(_RESULT_TAG + json.dumps(child(args)), flush=True)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("cold_start: no CUDA device; nothing to time")
        return 2
    problem = f"M={args.m} N={args.n} K={args.k} {args.fmt} {args.dtype}"
    print(f"cold start, {problem}, {args.runs} fresh process(es)", flush=True)
    runs = []
    for i in range(args.runs):
        record = run_child(args, {})
        runs.append(record)
        if record["ok"]:
            print(f"  run {i + 1}: import {_ms(record['import_s'])}  pack {_ms(record['pack_s'])}  "
                  f"first gemm {_ms(record['first_gemm_s'])}  total {_ms(record['total_s'])}  "
                  f"(second gemm {_ms(record['second_gemm_s'])})", flush=True)
        else:
            print(f"  run {i + 1}: FAILED\n" + _indent(record["error"]), flush=True)

    ok_runs = [r for r in runs if r["ok"]]
    summary: dict[str, Any] = {}
    if ok_runs:
        for key in ("import_s", "pack_s", "first_gemm_s", "total_s", "second_gemm_s"):
            summary[key] = statistics.median(r[key] for r in ok_runs)
        last = ok_runs[-1]
        print(f"  median:  import {_ms(summary['import_s'])}  pack {_ms(summary['pack_s'])}  "
              f"first gemm {_ms(summary['first_gemm_s'])}  total {_ms(summary['total_s'])}")
        print(f"  modules the first gemm loaded: {', '.join(last['modules_loaded_by_first_gemm']) or '-'}")
        print(f"  cache/catalog counters: {last['counters'] or 'none exposed'}")
        kernels = last.get("kernels_loaded")
        if kernels is not None:
            listed = ", ".join(f"{name} ({'in catalog' if hit else 'NOT in catalog' if hit is False else '?'})"
                               for name, hit in kernels.items())
            print(f"  kernels loaded: {listed or '-'}")

    catalog_only = None
    if not args.skip_jit_off:
        record = run_child(args, {"HUMMING_AOT_JIT": "0"})
        catalog_only = {"ok": record["ok"], **({"first_gemm_s": record["first_gemm_s"]} if record["ok"] else {"error": record["error"]})}
        verdict = ("yes: the first GEMM ran with HUMMING_AOT_JIT=0" if record["ok"]
                   else "NO: with HUMMING_AOT_JIT=0 it failed:\n" + _indent(record["error"]))
        print(f"  kernel from the catalog: {verdict}", flush=True)

    if args.json_path:
        payload = {"problem": {"m": args.m, "n": args.n, "k": args.k, "fmt": args.fmt, "dtype": args.dtype},
                   "python": sys.version.split()[0], "median": summary, "runs": runs, "catalog_only": catalog_only}
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(payload, indent=1, default=str) + "\n")
        print(f"wrote {args.json_path}")
    return 0 if ok_runs else 1


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
