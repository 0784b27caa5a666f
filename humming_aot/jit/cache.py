"""The JIT disk cache: content-hash keyed cubins, compiled once per key across processes.

Layout under ``env.cache_dir()`` (never inside the installed package)::

    kernels/<arch>/<name>-<hash16>.cubin   the cubin NVRTC wrote
    kernels/<arch>/<name>-<hash16>.json    sidecar: full cache key, the cubin's size and sha256, ...
    kernels/<arch>/<name>-<hash16>.lock    flock()ed while one process compiles this entry
    tmp/<name>-XXXX/                       a compile's private directory until it is published

The cache key is the sha256 of the key name, the generated source, the path (relative to the
include directory) and content of every humming_aot header it includes, the NVRTC options and the
NVRTC version; never mtimes or absolute paths. An entry exists once its sidecar exists: the cubin
is renamed into place first, the sidecar last, both with os.replace (atomic on one file system).

A request reads the entry without a lock; on a miss (or a bad entry) it takes the entry's file
lock, looks again (another process may have published it meanwhile), and only then compiles, so
N processes asking for one missing kernel compile it once. An entry that fails its checks (size,
sha256, ELF, metadata) is logged as a warning, removed and compiled again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from humming_aot import codegen, env
from humming_aot.jit import nvrtc
from humming_aot.jit.cubin import CubinError, check_cubin
from humming_aot.spec import KernelKey

logger = logging.getLogger("humming_aot.jit")


def _make_compiles_visible() -> None:
    """A run-time compile must never be silent (it reads as a hang): when the application has not
    configured logging, give this logger its own stderr handler at HUMMING_AOT_LOG_LEVEL or INFO,
    whichever is lower. An application that configures logging keeps full control."""
    if logger.handlers or logging.getLogger().handlers:
        return
    from humming_aot import env

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("humming_aot: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(min(env.log_level(), logging.INFO))
    logger.propagate = False

LAYOUT_VERSION = 1  # bump when the entry format or the key material changes
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


class CacheDirError(OSError):
    """The cache directory cannot be used (inside the package, not writable)."""


def include_closure(source: str, include_dir: Path) -> list[tuple[str, bytes]]:
    """(path relative to include_dir, content) of every humming_aot header ``source`` includes,
    directly or through other headers, sorted by path.

    Includes outside humming_aot/ (none today) are NVRTC's own and covered by its version.
    """
    found: dict[str, bytes] = {}
    pending = [source]
    while pending:
        text = pending.pop()
        for include in _INCLUDE_RE.findall(text):
            if not include.startswith("humming_aot/") or include in found:
                continue
            path = include_dir / include
            try:
                content = path.read_bytes()
            except OSError as e:
                raise FileNotFoundError(
                    f"header {include} is missing from {include_dir} ({e}); reinstall humming_aot"
                ) from None
            found[include] = content
            pending.append(content.decode("utf-8", errors="replace"))
    return sorted(found.items())


def cache_key(*, name: str, source: str, headers: list[tuple[str, bytes]], options: tuple[str, ...],
              nvrtc_version: str) -> str:
    """sha256 hex digest over every input of one compile (each part length-prefixed)."""
    digest = hashlib.sha256()

    def part(label: str, data: bytes) -> None:
        digest.update(f"{label}:{len(data)}:".encode())
        digest.update(data)

    part("layout", str(LAYOUT_VERSION).encode())
    part("name", name.encode())
    part("source", source.encode())
    for path, content in headers:
        part(f"header {path}", content)
    part("options", "\0".join(options).encode())
    part("nvrtc", nvrtc_version.encode())
    return digest.hexdigest()


def cache_root() -> Path:
    """env.cache_dir(), refused when it lies inside the installed package."""
    root = env.cache_dir().resolve()
    if root == _PACKAGE_DIR or _PACKAGE_DIR in root.parents:
        raise CacheDirError(
            f"HUMMING_AOT_CACHE_DIR={env.cache_dir()} is inside the installed humming_aot package "
            f"({_PACKAGE_DIR}); the JIT never writes there: point it at a writable directory of its own"
        )
    return root


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CacheEntry:
    """Where one (unit, cache key) lives on disk."""

    key: "CompileUnit"
    digest: str  # full cache key
    directory: Path  # <cache>/kernels/<arch>

    @property
    def stem(self) -> str:
        return f"{self.key.name}-{self.digest[:16]}"

    @property
    def cubin_path(self) -> Path:
        return self.directory / f"{self.stem}.cubin"

    @property
    def sidecar_path(self) -> Path:
        return self.directory / f"{self.stem}.json"

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.stem}.lock"

    def read(self) -> tuple[bytes | None, str | None]:
        """(cubin, None) for a good entry; (None, None) when there is none; (None, why) when it is bad."""
        try:
            sidecar = json.loads(self.sidecar_path.read_text())
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as e:
            return None, f"unreadable sidecar {self.sidecar_path.name} ({e})"
        try:
            data = self.cubin_path.read_bytes()
        except OSError as e:
            return None, f"the sidecar exists but the cubin cannot be read ({e})"
        if not isinstance(sidecar, dict):
            return None, "the sidecar is not a JSON object"
        if (sidecar.get("cache_key"), sidecar.get("name")) != (self.digest, self.key.name):
            return None, "the sidecar describes another entry"
        if len(data) != sidecar.get("size"):
            return None, f"the cubin is {len(data)} bytes, the sidecar says {sidecar.get('size')}"
        if hashlib.sha256(data).hexdigest() != sidecar.get("sha256"):
            return None, "the cubin's sha256 differs from the sidecar's"
        try:
            self.key.check(data)
        except CubinError as e:
            return None, str(e)
        return data, None

    def remove(self) -> None:
        for path in (self.sidecar_path, self.cubin_path):  # the sidecar first: the entry stops existing
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def _file_lock(path: Path, what: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (created if needed, never deleted: deleting would let two
    processes lock two different files of one name)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that is compiling %s", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CacheResult:
    data: bytes  # the cubin
    path: Path  # where it is cached
    compiled: bool  # False: a cache hit
    seconds: float  # compile time (0 for a hit)


def _ensure_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheDirError(
            f"cannot create the JIT cache directory {path} ({e}): set HUMMING_AOT_CACHE_DIR to a writable directory"
        ) from None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompileUnit:
    """One translation unit the JIT compiles: a GEMM kernel (``unit_of``) or a unit of helper
    kernels (humming_aot.helper_kernels). ``check`` raises CubinError for a cubin that is not
    what the unit promises (read from the cache or fresh from NVRTC)."""

    name: str
    arch: str
    source: str
    check: Callable[[bytes], None]


def unit_of(key: KernelKey) -> CompileUnit:
    """The compile unit of a GEMM kernel: its generated source, its cubin checked against the key."""
    return CompileUnit(name=key.name, arch=key.arch, source=codegen.kernel_source(key),
                       check=lambda data: check_cubin(data, key))


def entry_for(unit: CompileUnit | KernelKey, *, include_dir: Path,
              nvrtc_lib: nvrtc.Nvrtc) -> tuple[CacheEntry, str, tuple[str, ...]]:
    """The cache entry of a unit (or a GEMM key) for this NVRTC and these headers, with the source
    and options."""
    if isinstance(unit, KernelKey):
        unit = unit_of(unit)
    options = nvrtc.compile_options(unit.arch)
    digest = cache_key(
        name=unit.name, source=unit.source, headers=include_closure(unit.source, include_dir), options=options,
        nvrtc_version=nvrtc_lib.version_string,
    )
    return CacheEntry(key=unit, digest=digest, directory=cache_root() / "kernels" / unit.arch), unit.source, options


def obtain(unit: CompileUnit | KernelKey, *, include_dir: Path, nvrtc_lib: nvrtc.Nvrtc) -> CacheResult:
    """The cubin of a unit (or a GEMM key): from the cache, or compiled with NVRTC, checked and
    published."""
    entry, source, options = entry_for(unit, include_dir=include_dir, nvrtc_lib=nvrtc_lib)
    unit = entry.key
    data, problem = entry.read()
    if data is not None:
        logger.debug("JIT cache hit for %s: %s", unit.name, entry.cubin_path)
        return CacheResult(data=data, path=entry.cubin_path, compiled=False, seconds=0.0)
    _ensure_dir(entry.directory)
    with _file_lock(entry.lock_path, unit.name):
        data, problem = entry.read()  # another process may have published it while we waited
        if data is not None:
            return CacheResult(data=data, path=entry.cubin_path, compiled=False, seconds=0.0)
        if problem is not None:
            logger.warning("JIT cache entry %s is bad (%s): removing it and compiling %s again",
                           entry.cubin_path, problem, unit.name)
            entry.remove()
        data, seconds = _compile(unit, options, include_dir, nvrtc_lib)
        _publish(entry, data, options=options, nvrtc_version=nvrtc_lib.version_string, seconds=seconds)
        return CacheResult(data=data, path=entry.cubin_path, compiled=True, seconds=seconds)


def _compile(unit: CompileUnit, options: tuple[str, ...], include_dir: Path,
             nvrtc_lib: nvrtc.Nvrtc) -> tuple[bytes, float]:
    nvrtc.check_arch_supported(nvrtc_lib, unit.arch)
    _make_compiles_visible()
    logger.info("compiling %s with NVRTC %s (not in the kernel catalog; this takes a few seconds)",
                unit.name, nvrtc_lib.version_string)
    start = time.monotonic()
    data = nvrtc_lib.compile_cubin(unit.source, name=unit.name, options=(*options, f"-I{include_dir}"))
    seconds = time.monotonic() - start
    try:
        unit.check(data)
    except CubinError as e:
        raise CubinError(f"NVRTC {nvrtc_lib.version_string} produced a bad cubin: {e}") from None
    logger.info("compiled %s in %.2f s (%d bytes)", unit.name, seconds, len(data))
    return data, seconds


def _publish(entry: CacheEntry, data: bytes, *, options: tuple[str, ...], nvrtc_version: str, seconds: float) -> None:
    """Write cubin and sidecar in a private temp dir, then rename them into place (sidecar last)."""
    tmp_root = entry.directory.parent.parent / "tmp"
    _ensure_dir(tmp_root)
    private = Path(tempfile.mkdtemp(prefix=f"{entry.key.name}-", dir=tmp_root))
    try:
        sidecar = {
            "name": entry.key.name,
            "arch": entry.key.arch,
            "cache_key": entry.digest,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "nvrtc": nvrtc_version,
            "options": list(options),
            "compile_seconds": round(seconds, 3),
            "layout": LAYOUT_VERSION,
        }
        _write_synced(private / "cubin", data)
        _write_synced(private / "sidecar", (json.dumps(sidecar, indent=2, sort_keys=True) + "\n").encode())
        os.replace(private / "cubin", entry.cubin_path)
        os.replace(private / "sidecar", entry.sidecar_path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CacheUsage:
    root: Path
    exists: bool
    entries: int  # published cubins
    bytes: int  # every file under the root


def usage() -> CacheUsage:
    """How much the cache holds (for `humming-aot doctor`)."""
    root = env.cache_dir()
    if not root.is_dir():
        return CacheUsage(root=root, exists=False, entries=0, bytes=0)
    entries = total = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
                entries += path.suffix == ".cubin"
    return CacheUsage(root=root, exists=True, entries=entries, bytes=total)
