"""Print one line per kernel key: its name, the sha256 of its generated source, its shared memory
and threads, for every key of the given catalogs (default: the built-in ones and every catalog/*.toml).
Run at two revisions and diff the outputs to show that a host-side change keeps every kernel's
source byte for byte (docs/adding-a-body.md):

    python3 tools/codegen_digest.py > /tmp/after.txt
    git stash; python3 tools/codegen_digest.py > /tmp/before.txt; git stash pop
    diff /tmp/before.txt /tmp/after.txt && echo same
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from humming_aot.codegen import kernel_smem_bytes, kernel_source  # noqa: E402
from humming_aot.enumerate import BUILTIN_CATALOGS, enumerate_keys  # noqa: E402


def digests(catalogs: list[str]) -> dict[str, str]:
    """{key name: 'sha256 smem threads'} over the catalogs' keys."""
    out = {}
    for catalog in catalogs:
        for key in enumerate_keys(catalog):
            source = kernel_source(key).encode()
            out[key.name] = f"{hashlib.sha256(source).hexdigest()} {kernel_smem_bytes(key)} {key.tile.threads}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", action="append", help="built-in catalog name or .toml (repeatable)")
    args = parser.parse_args(argv)
    catalogs = args.catalog or [*BUILTIN_CATALOGS, *sorted(str(p) for p in (ROOT / "catalog").glob("*.toml")
                                                           if p.name not in ("tiles.toml", "support.toml"))]
    for name, digest in sorted(digests(catalogs).items()):
        print(name, digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
