"""`humming-aot build`: enumerate -> codegen -> nvcc (ninja) -> manifest -> one self-contained wheel.

The wheel holds the humming_aot package, the pybind11 launcher built for the running Python, the
CUDA headers (for the JIT fallback), the catalog data files and the compiled kernels with their
manifest under humming_aot/_catalog. It is written here with zipfile, deterministically: sorted
entries, fixed timestamps, RECORD last. Its version carries the CUDA release and the archs as a
local version: ``humming_aot-0.1.0+cu130.sm89.sm90a-cp311-cp311-linux_x86_64.whl``.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import shutil
import sys
import sysconfig
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import TextIO

from humming_aot._version import __version__
from humming_aot.aot.enumerate import enumerate_catalog
from humming_aot.aot.manifest import KERNELS_DIR, MANIFEST_NAME, build_manifest, write_manifest
from humming_aot.aot.ninja import CompileError, compile_keys, kernel_build_seconds, nvcc_info
from humming_aot.support import arch_sort_key

DIST_NAME = "humming_aot"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
WHEEL_SIZE_BUDGET = 100 * 1000 * 1000  # PyPI's default per-file limit
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
# Package paths the wheel rebuilds from their sources instead of copying.
_REBUILT_DIRS = ("_catalog", "include", "catalog_files")
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".tmp")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BuildSummary:
    catalog: str
    kernels_per_arch: dict[str, int]
    fatbin_bytes_per_arch: dict[str, int]  # what each arch adds to the wheel, before compression
    nvcc_seconds_per_arch: dict[str, float]  # summed over its kernels (ninja's log; CPU, not wall)
    skipped_tiles: int  # tiles left out for shared memory
    seconds: float
    cuda_version: str
    catalog_dir: Path  # where manifest.json and kernels/ are
    wheel: Path | None  # None for --inplace
    wheel_bytes: int | None

    @property
    def kernels(self) -> int:
        return sum(self.kernels_per_arch.values())


def local_version(cuda_version: str, archs: list[str]) -> str:
    """'0.1.0+cu130.sm89.sm90a' (archs in numeric order)."""
    cuda = "cu" + cuda_version.replace(".", "")
    return f"{__version__}+{cuda}.{'.'.join(sorted(set(archs), key=arch_sort_key))}"


def wheel_tag() -> str:
    """'cp311-cp311-linux_x86_64': the launcher is built for the running interpreter."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = python + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{python}-{abi}-{platform}"


def wheel_filename(version: str, tag: str) -> str:
    return f"{DIST_NAME}-{version}-{tag}.whl"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def package_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """The package's own files (sources and data), as wheel paths -> files; compiled artefacts
    and the directories the build regenerates are left out."""
    files = {}
    for path in sorted(package_dir.rglob("*")):
        rel = path.relative_to(package_dir)
        if not path.is_file() or "__pycache__" in rel.parts or rel.parts[0] in _REBUILT_DIRS:
            continue
        if path.suffix in _SKIPPED_SUFFIXES or any(p.startswith(".") for p in rel.parts):
            continue
        files[f"{DIST_NAME}/{rel.as_posix()}"] = path
    return files


def data_files() -> dict[str, Path]:
    """Headers -> humming_aot/include/humming_aot/**, catalog data -> humming_aot/catalog_files/
    (the mapping setup.py uses too)."""
    from humming_aot.aot.extension import package_data_files

    return package_data_files()


def catalog_files(catalog_dir: Path, manifest: dict) -> dict[str, Path]:
    """The manifest and the kernels it lists -> humming_aot/_catalog/."""
    files = {f"{DIST_NAME}/_catalog/{MANIFEST_NAME}": catalog_dir / MANIFEST_NAME}
    for entry in manifest["kernels"].values():
        files[f"{DIST_NAME}/_catalog/{entry['file']}"] = catalog_dir / entry["file"]
    return files


def _dist_info(version: str, tag: str) -> dict[str, bytes]:
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {version}",
        "Summary: Quantized-inference GEMM kernels shipped precompiled per CUDA and arch",
        "License: Apache-2.0",
        "Requires-Python: >=3.11",
        "Requires-Dist: torch>=2.4",
        "",
    ])
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        f"Generator: humming_aot.aot.wheel {__version__}",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ])
    entry_points = "[console_scripts]\nhumming-aot = humming_aot.cli:main\n"
    return {
        "METADATA": metadata.encode(),
        "WHEEL": wheel.encode(),
        "entry_points.txt": entry_points.encode(),
        "top_level.txt": f"{DIST_NAME}\n".encode(),
    }


def write_wheel(files: dict[str, Path | bytes], out_dir: Path, *, version: str, tag: str) -> Path:
    """Write a wheel of ``files`` (wheel path -> file or bytes) plus its .dist-info; returns its path.

    Deterministic: package entries in sorted order, then the dist-info files, RECORD last, all
    dated 1980-01-01, mode 0644 (0755 for shared libraries).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DIST_NAME}-{version}.dist-info"
    entries = [(name, files[name]) for name in sorted(files)]
    entries += [(f"{dist_info}/{name}", data) for name, data in sorted(_dist_info(version, tag).items())]
    path = out_dir / wheel_filename(version, tag)
    tmp = path.with_name(path.name + ".tmp")
    record = []
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, source in entries:
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if name.endswith(".so") else 0o100644) << 16
            zf.writestr(info, data)
            record.append(f"{name},{_record_hash(data)},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_ZIP_DATE)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o100644 << 16
        zf.writestr(info, ("\n".join(record) + "\n").encode())
    tmp.replace(path)
    return path


def _install_inplace(catalog_dir: Path, manifest: dict, target: Path) -> None:
    """Make ``target`` hold exactly this build's kernels and manifest (the manifest goes last)."""
    (target / KERNELS_DIR).mkdir(parents=True, exist_ok=True)
    wanted = {Path(e["file"]).name for e in manifest["kernels"].values()}
    for stale in (target / KERNELS_DIR).iterdir():
        if stale.name not in wanted:
            stale.unlink()
    for entry in manifest["kernels"].values():
        shutil.copyfile(catalog_dir / entry["file"], target / entry["file"])
    write_manifest(manifest, target / MANIFEST_NAME)


def _build_launcher(build_dir: Path) -> Path:
    from setuptools.errors import CompileError as SetuptoolsCompileError, LinkError

    from humming_aot.aot.extension import build_launcher_extension

    try:
        return Path(build_launcher_extension(build_dir))
    except (SetuptoolsCompileError, LinkError) as e:
        raise CompileError(f"building the launcher humming_aot._C failed: {e}") from None


def build(
    *,
    archs: list[str],
    catalog: str = "default",
    jobs: int | None = None,
    out_dir: Path = Path("dist"),
    build_dir: Path | None = None,
    inplace: bool = False,
    stream: TextIO | None = None,
) -> BuildSummary:
    """Compile a catalog for ``archs`` and package it: a wheel in ``out_dir``, or (``inplace``)
    the source checkout's humming_aot/_catalog. Intermediate files go to ``build_dir``
    (default ./build/humming_aot_kernels), which later builds reuse incrementally."""
    stream = stream or sys.stderr
    start = time.monotonic()
    if not (PACKAGE_DIR.parent / "csrc" / "launcher").is_dir():
        what = "writes into a checkout's humming_aot/_catalog" if inplace else "builds the launcher from csrc/launcher"
        raise ValueError(
            f"`humming-aot build` {what}, but humming_aot is installed at {PACKAGE_DIR}, not in a "
            "source checkout: run it from a clone of the humming_aot repository"
        )
    enumeration = enumerate_catalog(catalog, archs)
    info = nvcc_info()
    build_dir = Path(build_dir or Path("build") / "humming_aot_kernels").resolve()
    # The launcher first: it takes seconds, and a missing compiler should not wait for the kernels.
    launcher = None if inplace else _build_launcher(build_dir / "launcher")
    result = compile_keys(list(enumeration.keys), build_dir, jobs=jobs, nvcc=info.path, stream=stream)
    manifest = build_manifest(
        keys=list(enumeration.keys), fatbins=result.fatbins, cuda_version=info.cuda_version,
        toolkit=info.toolkit, catalog=enumeration.catalog, archs=list(enumeration.archs),
    )
    write_manifest(manifest, build_dir / MANIFEST_NAME)
    wheel = None
    if inplace:
        catalog_dir = PACKAGE_DIR / "_catalog"
        _install_inplace(build_dir, manifest, catalog_dir)
    else:
        catalog_dir = build_dir
        files: dict[str, Path | bytes] = {**package_files(), **data_files(), **catalog_files(build_dir, manifest)}
        files[f"{DIST_NAME}/{launcher.name}"] = launcher
        wheel = write_wheel(
            files, out_dir, version=local_version(info.cuda_version, list(enumeration.archs)), tag=wheel_tag()
        )
    per_arch = Counter(key.arch for key in enumeration.keys)
    nvcc_seconds = kernel_build_seconds(build_dir)
    fatbin_bytes: Counter = Counter()
    compile_seconds: Counter = Counter()
    for key in enumeration.keys:
        fatbin_bytes[key.arch] += result.fatbins[key.name].stat().st_size
        compile_seconds[key.arch] += nvcc_seconds.get(key.name, 0.0)
    return BuildSummary(
        catalog=enumeration.catalog,
        kernels_per_arch={arch: per_arch[arch] for arch in enumeration.archs},
        fatbin_bytes_per_arch={arch: fatbin_bytes[arch] for arch in enumeration.archs},
        nvcc_seconds_per_arch={arch: compile_seconds[arch] for arch in enumeration.archs},
        skipped_tiles=len(enumeration.skipped),
        seconds=time.monotonic() - start,
        cuda_version=info.cuda_version,
        catalog_dir=catalog_dir,
        wheel=wheel,
        wheel_bytes=wheel.stat().st_size if wheel else None,
    )
