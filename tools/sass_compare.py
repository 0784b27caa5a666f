#!/usr/bin/env python3
"""Compare the SASS of kernels built from two trees of the CUDA headers, key by key.

A refactor of the device code that must not change the machine code (a component moved, a
template parameter with a default added) is checked by compiling each key's generated source
against the headers of a base tree and of this tree, and comparing `cuobjdump -sass` of the two
cubins (addresses and the file header stripped). Exit status 1 when any key differs.

    python3 tools/sass_compare.py --base /tmp/base/csrc/include --catalog default --arch sm90a \
        --filter wgmma -j 2
    python3 tools/sass_compare.py --base ../old/csrc/include --keys NAME[,NAME...]

`--base` may also be a git revision (`--base-rev HEAD~1`): its csrc/include is exported to a
temporary directory. cuobjdump comes from CUOBJDUMP, PATH or the nvidia-cuda-cuobjdump wheel.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("humming_aot") is None:
    sys.path.insert(0, str(_REPO))

from humming_aot import codegen  # noqa: E402
from humming_aot.arch import nvcc_gencode  # noqa: E402
from humming_aot.spec import KernelKey  # noqa: E402

_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
_ENCODING = re.compile(r"/\* 0x[0-9a-f]+ \*/")


def find_cuobjdump() -> str:
    import os

    for candidate in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")):
        if candidate:
            return candidate
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel installs nvidia/cu13/bin/cuobjdump

        for root in nvidia.__path__:
            for path in Path(root).glob("cu*/bin/cuobjdump"):
                return str(path)
    except ImportError:
        pass
    raise SystemExit("cuobjdump not found: set CUOBJDUMP, put it on PATH or pip install nvidia-cuda-cuobjdump")


def sass_of(key: KernelKey, include: Path, work: Path, nvcc: str, cuobjdump: str) -> str:
    src = work / f"{key.name}.cu"
    src.write_text(codegen.kernel_source(key))
    cubin = work / f"{key.name}.cubin"
    arch_flags = nvcc_gencode(key.arch)
    subprocess.run([nvcc, "-cubin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", *arch_flags, "-I", str(include),
                    "-o", str(cubin), str(src)], check=True, capture_output=True, text=True)
    out = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("/*", "Function", ".", "@", "{", "}"))
             or re.match(r"\s+[A-Z@]", ln)]
    return "\n".join(_ENCODING.sub("", _ADDRESS.sub("", ln)).rstrip() for ln in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", type=Path, help="csrc/include of the base tree")
    base.add_argument("--base-rev", help="a git revision whose csrc/include is the base")
    parser.add_argument("--keys", default="", help="comma list of kernel names")
    parser.add_argument("--catalog", default=None, help="compare every key of this catalog (with --arch)")
    parser.add_argument("--arch", action="append", default=None)
    parser.add_argument("--filter", default="", help="only keys whose name contains this")
    parser.add_argument("--limit", type=int, default=0, help="at most this many keys (0: all)")
    parser.add_argument("-j", type=int, default=2)
    args = parser.parse_args()

    keys = [KernelKey.from_name(name) for name in args.keys.split(",") if name]
    if args.catalog:
        from humming_aot.enumerate import enumerate_keys

        keys += enumerate_keys(args.catalog, args.arch)
    keys = [key for key in keys if args.filter in key.name]
    if args.limit:
        keys = keys[: args.limit]
    if not keys:
        raise SystemExit("no keys to compare: give --keys or --catalog (and --filter)")
    nvcc, cuobjdump = shutil.which("nvcc") or "nvcc", find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.base_rev:
            archive = subprocess.run(["git", "-C", str(_REPO), "archive", args.base_rev, "csrc/include"],
                                     check=True, capture_output=True).stdout
            (tmp / "base.tar").write_bytes(archive)
            with tarfile.open(tmp / "base.tar") as tar:
                tar.extractall(tmp / "base", filter="data")
            base_include = tmp / "base" / "csrc" / "include"
        else:
            base_include = args.base
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()

        def compare(key: KernelKey) -> tuple[str, bool]:
            old = sass_of(key, base_include, tmp / "a", nvcc, cuobjdump)
            new = sass_of(key, _REPO / "csrc" / "include", tmp / "b", nvcc, cuobjdump)
            return key.name, old == new and bool(old)

        differ = 0
        with concurrent.futures.ThreadPoolExecutor(args.j) as pool:
            for name, same in pool.map(compare, keys):
                differ += not same
                print(f"{'same' if same else 'DIFFERS'}  {name}", flush=True)
    print(f"{len(keys) - differ} of {len(keys)} keys have the same SASS")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
