"""A ctypes binding of NVRTC that compiles one generated kernel source straight to a cubin.

Where libnvrtc comes from, in order (the first hit wins; ``nvrtc_candidates()`` lists them):

1. ``HUMMING_AOT_NVRTC`` (a libnvrtc.so file or the directory holding it), when set;
2. the pip package ``nvidia-cuda-nvrtc`` (``site-packages/nvidia/cu13/lib``, or
   ``nvidia/cuda_nvrtc/lib`` for the CUDA 12 packages), which torch's CUDA wheels already install;
3. a system toolkit: ``$CUDA_HOME/lib64``, then ``/usr/local/cuda/lib64``.

No nvcc, no host compiler and no network are involved: NVRTC parses the source, runs its own
ptxas, and hands back SASS for exactly the target asked for (``sm_90a``, never PTX). The kernel
sources include only humming_aot's headers, which need no CUDA toolkit header: NVRTC declares the
builtins they use (``__byte_perm``, ``__ldcg``, ``float2``, ``atomicAdd``, ...) itself.

The options mirror the nvcc build (``build/ninja.py``): C++17 and the default device optimisation
(NVRTC always optimises device code as nvcc's -O3 build does). With NVRTC 13.0 and nvcc 13.0 the
kernel's SASS (.text section) is byte-identical to the nvcc build's; NVRTC's cubin additionally
carries the kernels' ``static constexpr`` members as unused local device constants.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import logging
import re
import threading
from pathlib import Path

from humming_aot import env
from humming_aot.spec import parse_arch

logger = logging.getLogger(__name__)

# Where the pip packages put the library, relative to a site-packages/nvidia/ directory.
PIP_LIB_DIRS = ("cu13/lib", "cuda_nvrtc/lib")
SYSTEM_CUDA_ROOTS = (Path("/usr/local/cuda"),)  # searched after $CUDA_HOME
PIP_DISTRIBUTIONS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12")
# Options every compile passes besides the target and the include directory (see the module doc).
BASE_OPTIONS = ("-std=c++17",)

_LIB_RE = re.compile(r"^libnvrtc\.so(?:\.(\d+))?$")
_BUILTINS_RE = re.compile(r"^libnvrtc-builtins\.so\.\d+\.\d+$")
_INSTALL_HINT = (
    "install it with `pip install nvidia-cuda-nvrtc` (the CUDA 13 build, matching this humming_aot), "
    "or set CUDA_HOME to a CUDA toolkit that has lib64/libnvrtc.so, or HUMMING_AOT_NVRTC to the library"
)


class NvrtcNotFoundError(FileNotFoundError):
    """No usable libnvrtc (a setup problem the user can fix)."""


class NvrtcError(RuntimeError):
    """An NVRTC call failed for a reason other than the source (out of memory, a bad option, ...)."""


class NvrtcCompileError(RuntimeError):
    """NVRTC rejected a kernel source; ``name`` is the kernel, ``log`` NVRTC's log."""

    def __init__(self, message: str, *, name: str, log: str):
        super().__init__(message)
        self.name = name
        self.log = log


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NvrtcCandidate:
    """One place libnvrtc may be: where it comes from ('HUMMING_AOT_NVRTC', 'pip', 'CUDA_HOME',
    'system') and the file (None: that place has no libnvrtc)."""

    source: str
    where: Path
    library: Path | None


def _library_in(directory: Path) -> Path | None:
    """The newest libnvrtc.so.N in a directory (the unversioned symlink last), or None."""
    if not directory.is_dir():
        return None
    found = []
    for path in directory.iterdir():
        m = _LIB_RE.match(path.name)
        if m:
            found.append((int(m.group(1)) if m.group(1) else -1, path))
    return max(found)[1] if found else None


def _pip_nvidia_dirs() -> list[Path]:
    """Every site-packages/nvidia/ directory on sys.path (a namespace package), without importing it."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def nvrtc_candidates() -> list[NvrtcCandidate]:
    """Every place searched for libnvrtc, in search order (for ``find_nvrtc`` and `humming-aot doctor`)."""
    override = env.nvrtc_override()
    if override is not None:
        library = override if override.is_file() else _library_in(override)
        return [NvrtcCandidate(source="HUMMING_AOT_NVRTC", where=override, library=library)]
    candidates = []
    for nvidia_dir in _pip_nvidia_dirs():
        for sub in PIP_LIB_DIRS:
            where = nvidia_dir / sub
            candidates.append(NvrtcCandidate(source="pip", where=where, library=_library_in(where)))
    cuda_home = env.cuda_home()
    if cuda_home is not None:
        where = cuda_home / "lib64"
        candidates.append(NvrtcCandidate(source="CUDA_HOME", where=where, library=_library_in(where)))
    for root in SYSTEM_CUDA_ROOTS:
        where = root / "lib64"
        candidates.append(NvrtcCandidate(source="system", where=where, library=_library_in(where)))
    return candidates


def find_nvrtc() -> NvrtcCandidate:
    """The first candidate that has a libnvrtc; NvrtcNotFoundError saying where it looked and what to do."""
    candidates = nvrtc_candidates()
    for candidate in candidates:
        if candidate.library is not None:
            return candidate
    if env.nvrtc_override() is not None:
        raise NvrtcNotFoundError(
            f"HUMMING_AOT_NVRTC={env.nvrtc_override()} is neither a libnvrtc.so file nor a directory holding "
            "one: point it at libnvrtc.so.13 (or unset it to search the pip package and CUDA_HOME)"
        )
    searched = ", ".join(str(c.where) for c in candidates) or "no pip nvidia/ directory, no CUDA_HOME"
    raise NvrtcNotFoundError(f"NVRTC (libnvrtc.so) not found (searched {searched}): {_INSTALL_HINT}")


def _release(library: Path, source: str) -> str | None:
    """The full release of a library ('13.0.88'), from its pip distribution or the toolkit's version.json."""
    resolved = library.resolve()
    if source in ("pip", "HUMMING_AOT_NVRTC"):
        for name in PIP_DISTRIBUTIONS:
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            for file in dist.files or ():
                if file.name.startswith("libnvrtc.so") and Path(dist.locate_file(file)).resolve() == resolved:
                    return dist.version
    version_json = library.parent.parent / "version.json"  # <toolkit>/lib64/libnvrtc.so -> <toolkit>/version.json
    try:
        return json.loads(version_json.read_text())["cuda_nvrtc"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Nvrtc:
    """A loaded libnvrtc. ``version`` is (major, minor) from nvrtcVersion; ``release`` the full
    release ('13.0.88') where the package or toolkit says it, else None."""

    def __init__(self, path: Path, source: str):
        self.path = path
        self.source = source
        # NVRTC dlopen()s libnvrtc-builtins.so.X.Y by its bare name at the first compile, which
        # fails when the pip package's directory is not on the loader path; loading the copy next
        # to libnvrtc first makes that dlopen find it already loaded.
        for builtins in sorted(p for p in path.parent.glob("libnvrtc-builtins.so.*") if _BUILTINS_RE.match(p.name)):
            try:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                logger.debug("could not preload %s: %s", builtins, e)
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise NvrtcNotFoundError(f"{path} cannot be loaded ({e}): {_INSTALL_HINT}") from None
        self._declare()
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        self.release = _release(path, source)

    def _declare(self) -> None:
        lib, p, c_int, c_size_p = self._lib, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)
        char_pp = ctypes.POINTER(ctypes.c_char_p)
        signatures = {
            "nvrtcVersion": [ctypes.POINTER(c_int), ctypes.POINTER(c_int)],
            "nvrtcGetNumSupportedArchs": [ctypes.POINTER(c_int)],
            "nvrtcGetSupportedArchs": [ctypes.POINTER(c_int)],
            "nvrtcCreateProgram": [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p, c_int, char_pp, char_pp],
            "nvrtcCompileProgram": [p, c_int, char_pp],
            "nvrtcGetProgramLogSize": [p, c_size_p],
            "nvrtcGetProgramLog": [p, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [p, c_size_p],
            "nvrtcGetCUBIN": [p, ctypes.c_char_p],
            "nvrtcDestroyProgram": [ctypes.POINTER(p)],
        }
        for name, argtypes in signatures.items():
            try:
                function = getattr(lib, name)
            except AttributeError:
                raise NvrtcNotFoundError(
                    f"{self.path} has no {name}, so it is not a usable libnvrtc: {_INSTALL_HINT}"
                ) from None
            function.argtypes, function.restype = argtypes, c_int
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [c_int], ctypes.c_char_p

    @property
    def version_string(self) -> str:
        """'13.0 (13.0.88)', part of the JIT cache key."""
        short = f"{self.version[0]}.{self.version[1]}"
        return f"{short} ({self.release})" if self.release else short

    def _error_name(self, code: int) -> str:
        name = self._lib.nvrtcGetErrorString(code)
        return name.decode() if name else f"NVRTC error {code}"

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            raise NvrtcError(f"{call} failed: {self._error_name(code)} (NVRTC {self.path})")

    def supported_archs(self) -> list[int]:
        """The compute capabilities this NVRTC can compile for (75, 80, ..., 120, 121)."""
        count = ctypes.c_int()
        self._check(self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * count.value)()
        self._check(self._lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        return list(archs)

    def compile_cubin(self, source: str, *, name: str, options: list[str] | tuple[str, ...]) -> bytes:
        """Compile one translation unit; the cubin bytes, or NvrtcCompileError with NVRTC's log."""
        program = ctypes.c_void_p()
        self._check(
            self._lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            encoded = [option.encode() for option in options]
            array = (ctypes.c_char_p * len(encoded))(*encoded)
            code = self._lib.nvrtcCompileProgram(program, len(encoded), array)
            log = self._log(program)
            if code != 0:
                raise NvrtcCompileError(
                    f"NVRTC {self.version_string} failed to compile kernel {name} ({self._error_name(code)}) with "
                    f"options {' '.join(options)}:\n{log.strip() or '(empty log)'}",
                    name=name,
                    log=log,
                )
            if log.strip():
                logger.debug("NVRTC log for %s:\n%s", name, log.strip())
            size = ctypes.c_size_t()
            self._check(self._lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
            buffer = ctypes.create_string_buffer(size.value)
            self._check(self._lib.nvrtcGetCUBIN(program, buffer), "nvrtcGetCUBIN")
            return buffer.raw
        finally:
            self._lib.nvrtcDestroyProgram(ctypes.byref(program))

    def _log(self, program: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        if self._lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        buffer = ctypes.create_string_buffer(size.value)
        if self._lib.nvrtcGetProgramLog(program, buffer) != 0:
            return ""
        return buffer.value.decode(errors="replace")


_load_lock = threading.Lock()


@functools.cache
def _load(path: Path, source: str) -> Nvrtc:
    return Nvrtc(path, source)


def load_nvrtc() -> Nvrtc:
    """The libnvrtc of this process (found with ``find_nvrtc``, loaded once per path)."""
    candidate = find_nvrtc()
    with _load_lock:
        return _load(candidate.library, candidate.source)


def gpu_architecture(arch: str) -> str:
    """NVRTC's name of a catalog arch: 'sm90a' -> 'sm_90a', 'sm120' -> 'sm_120'."""
    number, suffix = parse_arch(arch)
    return f"sm_{number}{suffix}"


def compile_options(arch: str) -> tuple[str, ...]:
    """Every option of a compile for ``arch`` except -I (the headers are hashed by content instead)."""
    return (f"--gpu-architecture={gpu_architecture(arch)}", *BASE_OPTIONS)


def check_arch_supported(nvrtc: Nvrtc, arch: str) -> None:
    """NvrtcError when this NVRTC cannot target ``arch`` (e.g. sm_120 needs NVRTC 12.8 or newer)."""
    number, _ = parse_arch(arch)
    supported = nvrtc.supported_archs()
    if number not in supported:
        raise NvrtcError(
            f"NVRTC {nvrtc.version_string} ({nvrtc.path}) cannot compile for {gpu_architecture(arch)}: it "
            f"supports sm_{', sm_'.join(map(str, supported))}; install a newer nvidia-cuda-nvrtc"
        )
