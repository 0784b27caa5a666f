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
temporary directory. `--base-tree DIR` (a checkout, e.g. `git worktree add DIR REV`) takes both
the headers and each key's generated source from that tree's own codegen, for a base whose
generated source differs (another params version, a static_assert added since): the SASS of the
kernel function is compared, not the metadata. A key the base cannot name or generate is
reported as "no base". cuobjdump comes from CUOBJDUMP, PATH or the nvidia-cuda-cuobjdump wheel.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
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


_BASE_SOURCES = r"""
import json, sys
try:
    from humming_aot import codegen
except ImportError:
    from humming_aot.aot import codegen
from humming_aot.spec import KernelKey
sources = {}
for name in json.loads(sys.stdin.read()):
    try:
        sources[name] = codegen.kernel_source(KernelKey.from_name(name))
    except Exception:  # noqa: BLE001  (the base cannot name or generate it: reported as "no base")
        pass
print(json.dumps(sources))
"""


def base_sources(tree: Path, names: list[str]) -> dict[str, str]:
    """The generated source of each key by `tree`'s own codegen (run in a child with `tree` first on
    sys.path); keys it cannot name or generate are missing."""
    out = subprocess.run([sys.executable, "-c", _BASE_SOURCES], input=json.dumps(names), cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def sass_of(key: KernelKey, include: Path, work: Path, nvcc: str, cuobjdump: str, source: str | None = None) -> str:
    src = work / f"{key.name}.cu"
    src.write_text(codegen.kernel_source(key) if source is None else source)
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
    base.add_argument("--base-tree", type=Path, help="a checkout whose headers and codegen are the base")
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
        elif args.base_tree:
            base_include = args.base_tree / "csrc" / "include"
        else:
            base_include = args.base
        sources = base_sources(args.base_tree, [key.name for key in keys]) if args.base_tree else None
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()

        def compare(key: KernelKey) -> tuple[str, str]:
            if sources is not None and key.name not in sources:
                return key.name, "no base"
            old = sass_of(key, base_include, tmp / "a", nvcc, cuobjdump, None if sources is None else sources[key.name])
            new = sass_of(key, _REPO / "csrc" / "include", tmp / "b", nvcc, cuobjdump)
            return key.name, "same" if old == new and old else "DIFFERS"

        verdicts = []
        with concurrent.futures.ThreadPoolExecutor(args.j) as pool:
            for name, verdict in pool.map(compare, keys):
                verdicts.append(verdict)
                print(f"{verdict}  {name}", flush=True)
    same, missing = verdicts.count("same"), verdicts.count("no base")
    print(f"{same} of {len(keys)} keys have the same SASS" + (f"; {missing} have no base" if missing else ""))
    return 1 if same + missing < len(keys) else 0


if __name__ == "__main__":
    sys.exit(main())
