"""`humming-aot build`: enumerate -> codegen -> nvcc (ninja) -> manifest -> one catalog wheel per arch.

Each arch becomes its own distribution (``humming_aot.distribution``):
``humming_aot_kernels_sm90a_cu13-0.1.0-py3-none-any.whl`` holds the manifest and fatbins under
``humming_aot_kernels/sm90a_cu13/``; the core (Python, launcher, JIT, headers, catalog data) is a
separate wheel that ``--index`` adds next to them, with a PEP 503 simple index
(``humming_aot.aot.index``). Wheels are written here with zipfile, deterministically: sorted
entries, fixed timestamps, RECORD last, so two builds of the same catalog are byte-identical.
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

from humming_aot import distribution, helper_kernels
from humming_aot._version import __version__
from humming_aot.aot.ninja import CompileError, compile_keys, compression_flags, kernel_build_seconds, nvcc_info
from humming_aot.enumerate import enumerate_catalog
from humming_aot.manifest import (
    HELPERS_DIR,
    KERNELS_DIR,
    MANIFEST_NAME,
    build_manifest,
    manifest_bytes,
    write_manifest,
)

DIST_NAME = distribution.CORE_NAME
PACKAGE_DIR = Path(__file__).resolve().parent.parent
WHEEL_SIZE_BUDGET = 100 * 1000 * 1000  # PyPI's default per-file limit
KERNEL_WHEEL_TAG = "py3-none-any"  # fatbins depend on neither the Python version nor the host CPU
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_SUMMARY = "Quantized-inference GEMM kernels shipped precompiled per CUDA and arch"
# Package paths the wheel rebuilds from their sources instead of copying.
_REBUILT_DIRS = ("_catalog", "include", "catalog_files")
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".tmp")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BuildSummary:
    catalog: str
    kernels_per_arch: dict[str, int]
    fatbin_bytes_per_arch: dict[str, int]  # what each arch adds to its wheel, before compression
    nvcc_seconds_per_arch: dict[str, float]  # summed over its kernels (ninja's log; CPU, not wall)
    skipped_tiles: int  # tiles left out for shared memory
    seconds: float
    cuda_version: str
    catalog_dir: Path  # where manifest.json and kernels/ are
    wheels: dict[str, Path]  # arch -> its catalog wheel; empty for --inplace
    core_wheel: Path | None  # with --index
    index_dir: Path | None

    @property
    def kernels(self) -> int:
        return sum(self.kernels_per_arch.values())


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WheelMetadata:
    """What a wheel's .dist-info says about its distribution."""

    name: str  # as the user types it, e.g. 'humming-aot-kernels-sm90a-cu13'
    version: str
    tag: str  # 'py3-none-any', 'cp311-cp311-linux_x86_64'
    purelib: bool
    requires: tuple[str, ...] = ()  # Requires-Dist lines (with '; extra == ...' markers)
    extras: tuple[str, ...] = ()  # Provides-Extra
    requires_python: str | None = None
    console_scripts: tuple[str, ...] = ()  # 'humming-aot = humming_aot.cli:main'
    top_level: str = DIST_NAME

    @property
    def filename(self) -> str:
        return wheel_filename(self.version, self.tag, name=self.name)

    @property
    def dist_info(self) -> str:
        return f"{distribution.wheel_name_part(self.name)}-{self.version}.dist-info"


def wheel_tag() -> str:
    """'cp311-cp311-linux_x86_64': the core's launcher is built for the running interpreter."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = python + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{python}-{abi}-{platform}"


def wheel_filename(version: str, tag: str, *, name: str = DIST_NAME) -> str:
    return f"{distribution.wheel_name_part(name)}-{version}-{tag}.whl"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def is_source_checkout(package_dir: Path = PACKAGE_DIR) -> bool:
    """Whether humming_aot runs from a clone (csrc/ next to the package), not an installed copy."""
    return (package_dir.parent / "csrc" / "launcher").is_dir()


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


def data_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Headers -> humming_aot/include/humming_aot/**, catalog data -> humming_aot/catalog_files/:
    from the checkout's csrc/ and catalog/ (the mapping setup.py uses too), or, in an installed
    package, the copies it carries."""
    if is_source_checkout(package_dir):
        from humming_aot.aot.extension import package_data_files

        return package_data_files(package_dir.parent)
    files = {}
    for sub in ("include", "catalog_files"):
        for path in sorted((package_dir / sub).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{DIST_NAME}/{path.relative_to(package_dir).as_posix()}"] = path
    return files


def catalog_wheel_files(catalog_dir: Path, manifest: dict, directory: str) -> dict[str, Path | bytes]:
    """One arch's manifest and the kernels it lists -> humming_aot_kernels/<directory>/."""
    root = f"{distribution.KERNELS_NAMESPACE}/{directory}"
    files: dict[str, Path | bytes] = {f"{root}/{MANIFEST_NAME}": manifest_bytes(manifest)}
    for entry in (*manifest["kernels"].values(), *manifest.get("helpers", {}).values()):
        files[f"{root}/{entry['file']}"] = catalog_dir / entry["file"]
    return files


def kernel_wheel_metadata(arch: str, cuda_version: str) -> WheelMetadata:
    return WheelMetadata(
        name=distribution.kernel_dist_name(arch, distribution.cuda_major(cuda_version)),
        version=__version__, tag=KERNEL_WHEEL_TAG, purelib=True, top_level=distribution.KERNELS_NAMESPACE,
    )


def core_wheel_metadata() -> WheelMetadata:
    extras = distribution.core_extras(__version__, distribution.default_catalog_archs(PACKAGE_DIR.parent))
    requires = list(distribution.INSTALL_REQUIRES)
    for extra, reqs in extras.items():
        requires += [f'{req}; extra == "{extra}"' for req in reqs]
    return WheelMetadata(
        name=DIST_NAME, version=__version__, tag=wheel_tag(), purelib=False, requires=tuple(requires),
        extras=tuple(extras), requires_python=distribution.REQUIRES_PYTHON,
        console_scripts=("humming-aot = humming_aot.cli:main",),
    )


def _dist_info(meta: WheelMetadata) -> dict[str, bytes]:
    lines = ["Metadata-Version: 2.1", f"Name: {meta.name}", f"Version: {meta.version}", f"Summary: {_SUMMARY}",
             "License: Apache-2.0"]
    if meta.requires_python:
        lines.append(f"Requires-Python: {meta.requires_python}")
    lines += [f"Provides-Extra: {extra}" for extra in meta.extras]
    lines += [f"Requires-Dist: {req}" for req in meta.requires]
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        f"Generator: humming_aot.aot.wheel {__version__}",
        f"Root-Is-Purelib: {'true' if meta.purelib else 'false'}",
        f"Tag: {meta.tag}",
        "",
    ])
    files = {
        "METADATA": ("\n".join(lines) + "\n").encode(),
        "WHEEL": wheel.encode(),
        "top_level.txt": f"{meta.top_level}\n".encode(),
    }
    if meta.console_scripts:
        files["entry_points.txt"] = ("[console_scripts]\n" + "".join(f"{s}\n" for s in meta.console_scripts)).encode()
    return files


def write_wheel(files: dict[str, Path | bytes], out_dir: Path, meta: WheelMetadata) -> Path:
    """Write a wheel of ``files`` (wheel path -> file or bytes) plus its .dist-info; returns its path.

    Deterministic: package entries in sorted order, then the dist-info files, RECORD last, all
    dated 1980-01-01, mode 0644 (0755 for shared libraries).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = meta.dist_info
    entries = [(name, files[name]) for name in sorted(files)]
    entries += [(f"{dist_info}/{name}", data) for name, data in sorted(_dist_info(meta).items())]
    path = out_dir / meta.filename
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
    """Make ``target`` hold exactly this build's kernels, helper units and manifest (the manifest
    goes last)."""
    for folder, entries in ((KERNELS_DIR, manifest["kernels"]), (HELPERS_DIR, manifest.get("helpers", {}))):
        (target / folder).mkdir(parents=True, exist_ok=True)
        wanted = {Path(e["file"]).name for e in entries.values()}
        for stale in (target / folder).iterdir():
            if stale.name not in wanted:
                stale.unlink()
        for entry in entries.values():
            shutil.copyfile(catalog_dir / entry["file"], target / entry["file"])
    write_manifest(manifest, target / MANIFEST_NAME)


def _launcher(build_dir: Path) -> Path:
    """The launcher extension for the core wheel: built from csrc/launcher in a checkout (reused when
    up to date), else the installed package's own."""
    if not is_source_checkout():
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        installed = PACKAGE_DIR / f"_C{suffix}"
        if installed.is_file():
            return installed
        raise FileNotFoundError(
            f"the core wheel needs the launcher {installed.name}, but the humming_aot installed at {PACKAGE_DIR} "
            "has none for this Python: reinstall humming_aot (pip builds it) or run from a source checkout"
        )
    from setuptools.errors import CompileError as SetuptoolsCompileError
    from setuptools.errors import LinkError

    from humming_aot.aot.extension import build_launcher_extension

    try:
        return Path(build_launcher_extension(build_dir))
    except (SetuptoolsCompileError, LinkError) as e:
        raise CompileError(f"building the launcher humming_aot._C failed: {e}") from None


def write_core_wheel(out_dir: Path, build_dir: Path) -> Path:
    """The core distribution (Python, launcher for this Python, headers, catalog data; no kernels)."""
    launcher = _launcher(build_dir)
    files: dict[str, Path | bytes] = {**package_files(), **data_files()}
    files[f"{DIST_NAME}/{launcher.name}"] = launcher
    return write_wheel(files, out_dir, core_wheel_metadata())


def build(
    *,
    archs: list[str],
    catalog: str = "default",
    jobs: int | None = None,
    out_dir: Path = Path("dist"),
    build_dir: Path | None = None,
    inplace: bool = False,
    index_dir: Path | None = None,
    stream: TextIO | None = None,
    compression: str = "auto",
) -> BuildSummary:
    """Compile a catalog for ``archs`` and package it: one catalog wheel per arch in ``out_dir``
    (``index_dir``: plus the core wheel, all served as a PEP 503 simple index there), or
    (``inplace``) the source checkout's humming_aot/_catalog. Intermediate files go to
    ``build_dir`` (default ./build/humming_aot_kernels), which later builds reuse incrementally.
    ``compression``: how the fatbins store their cubins (aot.ninja.FATBIN_COMPRESSION)."""
    stream = stream or sys.stderr
    start = time.monotonic()
    if inplace and not is_source_checkout():
        raise ValueError(
            f"`humming-aot build --inplace` writes into a checkout's humming_aot/_catalog, but humming_aot is "
            f"installed at {PACKAGE_DIR}, not in a source checkout: leave out --inplace to build catalog wheels"
        )
    if inplace and index_dir is not None:
        raise ValueError("--inplace writes no wheels, so there is nothing for --index to serve: use one of them")
    enumeration = enumerate_catalog(catalog, archs)
    info = nvcc_info()
    compression_flags(compression, info.cuda_version)  # (refused before the launcher and the kernels)
    build_dir = Path(build_dir or Path("build") / "humming_aot_kernels").resolve()
    # The launcher first: it takes seconds, and a missing compiler should not wait for the kernels.
    core = write_core_wheel(out_dir, build_dir / "launcher") if index_dir is not None else None
    # every catalog carries the helper kernels of its archs (the MoE steps; small, arch-generic)
    helper_units = [(unit, arch) for arch in enumeration.archs for unit in helper_kernels.unit_names()]
    result = compile_keys(list(enumeration.keys), build_dir, jobs=jobs, nvcc=info.path, stream=stream,
                          helper_units=helper_units, compression=compression)
    manifest_args = dict(fatbins=result.fatbins, cuda_version=info.cuda_version, toolkit=info.toolkit,
                         catalog=enumeration.catalog, helpers=result.helpers)
    manifest = build_manifest(keys=list(enumeration.keys), archs=list(enumeration.archs), **manifest_args)
    write_manifest(manifest, build_dir / MANIFEST_NAME)
    wheels: dict[str, Path] = {}
    if inplace:
        catalog_dir = PACKAGE_DIR / "_catalog"
        _install_inplace(build_dir, manifest, catalog_dir)
    else:
        catalog_dir = build_dir
        major = distribution.cuda_major(info.cuda_version)
        for arch in enumeration.archs:
            arch_manifest = build_manifest(
                keys=[k for k in enumeration.keys if k.arch == arch], archs=[arch], **manifest_args)
            files = catalog_wheel_files(build_dir, arch_manifest, distribution.kernel_dir_name(arch, major))
            wheels[arch] = write_wheel(files, out_dir, kernel_wheel_metadata(arch, info.cuda_version))
    if index_dir is not None:
        from humming_aot.aot.index import add_to_index

        add_to_index(index_dir, [core, *wheels.values()])
    per_arch = Counter(key.arch for key in enumeration.keys)
    nvcc_seconds = kernel_build_seconds(build_dir)
    fatbin_bytes: Counter = Counter()
    compile_seconds: Counter = Counter()
    for path, arch in {result.fatbins[key.name]: key.arch for key in enumeration.keys}.items():  # (units once)
        fatbin_bytes[arch] += path.stat().st_size
        compile_seconds[arch] += nvcc_seconds.get(path.stem, 0.0)
    return BuildSummary(
        catalog=enumeration.catalog,
        kernels_per_arch={arch: per_arch[arch] for arch in enumeration.archs},
        fatbin_bytes_per_arch={arch: fatbin_bytes[arch] for arch in enumeration.archs},
        nvcc_seconds_per_arch={arch: compile_seconds[arch] for arch in enumeration.archs},
        skipped_tiles=len(enumeration.skipped),
        seconds=time.monotonic() - start,
        cuda_version=info.cuda_version,
        catalog_dir=catalog_dir,
        wheels=wheels,
        core_wheel=core,
        index_dir=Path(index_dir).resolve() if index_dir is not None else None,
    )
