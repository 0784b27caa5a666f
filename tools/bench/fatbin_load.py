"""What fatbin compression costs at load time: sampled keys of a catalog built twice (nvcc's default
and --compress-mode=size, humming-aot build --fatbin-compression), each image loaded on the GPU
the way the catalog loads a kernel (humming_aot.kernels.load_kernel_image: the driver's library
load, the kernel's handle, its metadata read back and checked, the shared-memory attribute), timed
per load, and the sizes (raw and deflated as a wheel stores them).

    python3 tools/bench/fatbin_load.py --count 12 --repeats 20 --json fatbin_load.json

Each load is timed from a fresh library (unloaded after each), so every one pays the driver's
decompression; the first load of each image is reported apart (it may also pay first-use costs).
Benchmarks never assert.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

if importlib.util.find_spec("humming_aot") is None:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODES = ("none", "size")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", default="default", help="catalog to sample keys from (default: default)")
    parser.add_argument("--arch", default="sm90a", help="the keys' arch (default: sm90a)")
    parser.add_argument("--count", type=int, default=12, help="keys sampled per GEMM type (default: 12)")
    parser.add_argument("--repeats", type=int, default=20, help="timed loads per image (default: 20)")
    parser.add_argument("--seed", type=int, default=58)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    return parser.parse_args(argv)


def sample_keys(catalog: str, arch: str, count: int, seed: int) -> list:
    """`count` keys of each GEMM type of the catalog's keys for `arch`, drawn with `seed`."""
    from humming_aot.enumerate import enumerate_keys

    by_type = collections.defaultdict(list)
    for key in enumerate_keys(catalog, [arch]):
        by_type[key.spec.gemm_type.value].append(key)
    rng = random.Random(seed)
    return [key for keys in by_type.values() for key in rng.sample(keys, min(count, len(keys)))]


def compile_both(keys: list, directory: Path, jobs: int) -> dict[tuple[str, str], bytes]:
    """{(key name, mode): fatbin bytes}, compiled as the catalog build compiles them."""
    from humming_aot import codegen
    from humming_aot.aot import ninja

    nvcc, include = ninja.find_nvcc(), ninja.find_include_dir()
    cuda = ninja.nvcc_info(nvcc).cuda_version

    def one(key, mode: str) -> tuple[tuple[str, str], bytes]:
        out = directory / f"{key.symbol}.{mode}.fatbin"
        subprocess.run([str(nvcc), *ninja.NVCC_FLAGS, *ninja.compression_flags(mode, cuda), "-I", str(include),
                        *ninja.nvcc_gencode(key.arch), "-o", str(out), str(directory / f"{key.symbol}.cu")],
                       check=True, capture_output=True)
        return (key.name, mode), out.read_bytes()

    for key in keys:  # (the sources first, so that the two modes never write one file at once)
        (directory / f"{key.symbol}.cu").write_text(codegen.kernel_source(key))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(lambda job: one(*job), [(key, mode) for key in keys for mode in MODES]))


def time_loads(image: bytes, key, repeats: int, device: int) -> tuple[float, list[float]]:
    """(first load's us, the next `repeats` loads' us): load_kernel_image, then unload."""
    from humming_aot import _launcher, codegen, kernels

    # (the manifest entry's fields: the image's metadata must match them)
    expected = {"threads": key.tile.threads, "smem_bytes": codegen.kernel_smem_bytes(key),
                "block_m": key.tile.block_m, "block_n": key.tile.block_n, "block_k": key.tile.block_k}
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loaded = kernels.load_kernel_image(image, name=key.name, expected=expected, device=device)
        times.append((time.perf_counter() - start) * 1e6)
        _launcher.unload_library(loaded.library)
        kernels.clear_loaded_kernels()  # (forget the unloaded library: the next load is a fresh one)
    return times[0], times[1:]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    keys = sample_keys(args.catalog, args.arch, args.count, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        images = compile_both(keys, Path(tmp), args.jobs)
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    rows = []
    for key in keys:
        row = {"key": key.name, "gemm_type": key.spec.gemm_type.value}
        for mode in MODES:
            image = images[key.name, mode]
            row[f"{mode}_bytes"] = len(image)
            row[f"{mode}_deflated"] = len(zlib.compress(image, 6))
            if device is not None:
                first, rest = time_loads(image, key, args.repeats, device)
                row[f"{mode}_first_us"], row[f"{mode}_us"] = first, statistics.median(rest)
        rows.append(row)
    print(f"{'gemm type':10} {'keys':>4} {'none KB':>8} {'size KB':>8} {'none zip':>8} {'size zip':>8} "
          f"{'none us':>8} {'size us':>8} {'first none/size us':>20}")
    for gemm_type in sorted({r["gemm_type"] for r in rows}):
        group = [r for r in rows if r["gemm_type"] == gemm_type]

        def mean(field: str) -> float:
            return statistics.mean(r[field] for r in group) if field in group[0] else float("nan")

        print(f"{gemm_type:10} {len(group):4d} {mean('none_bytes') / 1024:8.1f} {mean('size_bytes') / 1024:8.1f} "
              f"{mean('none_deflated') / 1024:8.1f} {mean('size_deflated') / 1024:8.1f} {mean('none_us'):8.1f} "
              f"{mean('size_us'):8.1f} {mean('none_first_us'):9.1f} / {mean('size_first_us'):8.1f}")
    if device is None:
        print("no CUDA GPU: sizes only")
    if args.json is not None:
        args.json.write_text(json.dumps({"arch": args.arch, "catalog": args.catalog, "repeats": args.repeats,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
