#!/usr/bin/env python3
"""NVRTC compile time of the JIT fallback: N distinct kernels compiled into a cold, private cache.

For each key it prints the NVRTC compile alone (nvrtcCompileProgram + nvrtcGetCUBIN) and the whole
first request (source generation, header hashing, compile, cubin checks, publish), then the time
of a second request (a disk-cache hit). Needs no GPU; on a GPU machine the arch defaults to the
GPU's. W4A16 keys (bf16 activations, int4 weights) come first, in the order of the arch's tile table.

    python3 tools/bench/nvrtc_compile_time.py            # 3 kernels for this GPU's arch (else sm90a)
    python3 tools/bench/nvrtc_compile_time.py -n 8 --arch sm89 --json nvrtc.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_REPO_ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--keys", type=int, default=3, help="distinct kernels to compile (default 3)")
    parser.add_argument("--arch", default=None, help="target, e.g. sm90a (default: this GPU's, else sm90a)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON")
    return parser.parse_args(argv)


def _default_arch() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            from humming_aot.arch import archs_for_capability

            return archs_for_capability(*torch.cuda.get_device_capability())[0]
    except ImportError:
        pass
    return "sm90a"


def _keys(arch: str, count: int):
    from humming_aot.enumerate import enumerate_keys

    keys = enumerate_keys("default", [arch])
    w4a16 = [k for k in keys if k.spec.a_dtype == "bfloat16" and k.spec.w_dtype == "int4"]
    ordered = w4a16 + [k for k in keys if k not in w4a16]
    if count > len(ordered):
        raise SystemExit(f"the default catalog has only {len(ordered)} kernels for {arch}; ask for fewer")
    return ordered[:count]


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="humming_aot_nvrtc_bench_") as cache_dir:
        os.environ["HUMMING_AOT_CACHE_DIR"] = cache_dir  # a cold cache, removed afterwards
        from humming_aot import jit
        from humming_aot.jit import nvrtc

        start = time.perf_counter()
        lib = nvrtc.load_nvrtc()
        load_seconds = time.perf_counter() - start
        arch = args.arch or _default_arch()
        print(f"NVRTC {lib.version_string} at {lib.path} (loaded in {load_seconds:.3f} s); arch {arch}; "
              f"{os.cpu_count()} CPUs")
        results = []
        for key in _keys(arch, args.keys):
            start = time.perf_counter()
            first = jit.obtain_cubin(key)
            first_seconds = time.perf_counter() - start
            start = time.perf_counter()
            second = jit.obtain_cubin(key)
            hit_seconds = time.perf_counter() - start
            assert first.compiled and not second.compiled
            results.append({"key": key.name, "nvrtc_s": round(first.seconds, 4),
                            "first_request_s": round(first_seconds, 4), "cache_hit_s": round(hit_seconds, 4),
                            "cubin_bytes": len(first.data)})
            print(f"  {key.name}: NVRTC {first.seconds:.2f} s, first request {first_seconds:.2f} s, "
                  f"cache hit {hit_seconds * 1e3:.1f} ms, {len(first.data):,} bytes")
    compile_times = [r["nvrtc_s"] for r in results]
    print(f"per kernel: median {statistics.median(compile_times):.2f} s, "
          f"min {min(compile_times):.2f} s, max {max(compile_times):.2f} s")
    if args.json_path:
        device = None
        try:
            import torch

            device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        except ImportError:
            pass
        report = {"arch": arch, "device": device, "cpus": os.cpu_count(), "nvrtc": lib.version_string,
                  "nvrtc_path": str(lib.path), "nvrtc_load_s": round(load_seconds, 4), "git_sha": _git_sha(),
                  "results": results}
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
