"""manifest.json: what a built catalog holds, and the sha256 of every kernel file.

Each kernel's entry names the file that holds it: a build compiles a few kernels per nvcc run
(aot.ninja.plan_units), so several entries name one ``kernels/<unit>.fatbin``, and the loader finds
each kernel in it by its symbol and its metadata's (spec.kernel_symbol, spec.metadata_symbol).
Schema 1 (one file per kernel, one metadata symbol per file) is refused: rebuild.

Written by the build, read by ``humming_aot.catalog`` at run time. The bytes are a function of the
inputs only (sorted keys, no timestamps, no absolute paths), so the same kernels give the same
manifest byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from humming_aot import codegen
from humming_aot._version import __version__
from humming_aot.params_abi import PARAMS_VERSION
from humming_aot.spec import KernelKey

SCHEMA_VERSION = 2
MANIFEST_NAME = "manifest.json"
KERNELS_DIR = "kernels"
HELPERS_DIR = "helpers"
_TOP_FIELDS = ("schema_version", "package_version", "cuda_version", "toolkit", "catalog", "archs",
               "params_version", "kernels")
_ENTRY_FIELDS = ("file", "sha256", "arch", "toolkit", "smem_bytes", "threads", "params_version")
# "helpers" (optional; catalogs built before it have none): unit name -> its entry
_HELPER_FIELDS = ("file", "sha256", "arch", "unit", "toolkit", "helpers_version")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# A kernel entry's file: a plain name in kernels/ (no directories, nothing outside the catalog).
_KERNEL_FILE_RE = re.compile(rf"{KERNELS_DIR}/[A-Za-z0-9][A-Za-z0-9._+-]*\.fatbin")  # (fullmatch)


def kernel_file(path: Path) -> str:
    """The manifest's name of a compiled kernel file (a build unit's fatbin), relative to the catalog
    directory."""
    return f"{KERNELS_DIR}/{Path(path).name}"


def helper_file(name: str) -> str:
    """A helper kernel unit's file (humming_aot.helper_kernels), relative to the catalog directory."""
    return f"{HELPERS_DIR}/{name}.fatbin"


def build_manifest(
    *,
    keys: list[KernelKey],
    fatbins: dict[str, Path],
    cuda_version: str,
    toolkit: str,
    catalog: str,
    archs: list[str],
    helpers: dict[str, tuple[str, str, Path]] | None = None,
) -> dict:
    """The manifest for compiled ``keys`` (``fatbins``: key name -> compiled file) and helper
    kernel units (``helpers``: unit name -> (unit, arch, compiled file); those of ``archs`` only)."""
    from humming_aot.helper_kernels import HELPERS_VERSION

    kernels = {}
    digests: dict[Path, str] = {}  # (a unit's file, hashed once for its keys)
    for key in sorted(keys):
        path = Path(fatbins[key.name])
        if path not in digests:
            digests[path] = sha256_file(path)
        kernels[key.name] = {
            "file": kernel_file(path),
            "sha256": digests[path],
            "arch": key.arch,
            "toolkit": toolkit,
            "smem_bytes": codegen.kernel_smem_bytes(key),
            "threads": key.tile.threads,
            "params_version": PARAMS_VERSION,
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "package_version": __version__,
        "cuda_version": cuda_version,
        "toolkit": toolkit,
        "catalog": catalog,
        "archs": sorted(set(archs)),
        "params_version": PARAMS_VERSION,
        "kernels": kernels,
        "helpers": {
            name: {"file": helper_file(name), "sha256": sha256_file(path), "arch": arch, "unit": unit,
                   "toolkit": toolkit, "helpers_version": HELPERS_VERSION}
            for name, (unit, arch, path) in sorted((helpers or {}).items()) if arch in archs
        },
    }


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()


def write_manifest(manifest: dict, path: Path) -> Path:
    """Write atomically (a reader never sees half a manifest)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(manifest_bytes(manifest))
    os.replace(tmp, path)
    return path


def manifest_problems(manifest: object) -> list[str]:
    """What is structurally wrong with a parsed manifest (empty when it is well formed)."""
    if not isinstance(manifest, dict):
        return ["the top level is not a JSON object"]
    if manifest.get("schema_version") != SCHEMA_VERSION:
        return [f"schema_version is {manifest.get('schema_version')!r}, this humming_aot reads {SCHEMA_VERSION}"]
    problems = [f"missing field {f!r}" for f in _TOP_FIELDS if f not in manifest]
    kernels = manifest.get("kernels", {})
    if not isinstance(kernels, dict):
        return problems + ["'kernels' is not an object"]
    file_digests: dict[str, str] = {}
    for name, entry in sorted(kernels.items()):
        missing = [f for f in _ENTRY_FIELDS if not isinstance(entry, dict) or f not in entry]
        if missing:
            problems.append(f"kernel {name!r} lacks {', '.join(missing)}")
        elif not isinstance(entry["file"], str) or not _KERNEL_FILE_RE.fullmatch(entry["file"]):
            problems.append(f"kernel {name!r} points at {entry['file']!r}, expected a file kernels/<name>.fatbin")
        elif file_digests.setdefault(entry["file"], entry["sha256"]) != entry["sha256"]:
            problems.append(f"kernel {name!r} gives {entry['file']!r} a sha256 another kernel in it does not")
    helpers = manifest.get("helpers", {})
    if not isinstance(helpers, dict):
        return problems + ["'helpers' is not an object"]
    for name, entry in sorted(helpers.items()):
        missing = [f for f in _HELPER_FIELDS if not isinstance(entry, dict) or f not in entry]
        if missing:
            problems.append(f"helper unit {name!r} lacks {', '.join(missing)}")
        elif entry["file"] != helper_file(name):
            problems.append(f"helper unit {name!r} points at {entry['file']!r}, expected {helper_file(name)!r}")
    return problems
