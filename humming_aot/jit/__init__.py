"""The run-time fallback for kernels outside the catalog: the same generated source as the nvcc
build (``build/codegen.py``), compiled by NVRTC (``nvrtc.py``) into a content-hash keyed disk cache
(``cache.py``) and checked (``cubin.py``) before anyone loads it.

Dispatch asks in this order: in-memory -> catalog in the wheel -> JIT disk cache -> NVRTC compile.
``HUMMING_AOT_JIT=0`` forbids the last two (``jit_available`` then says so). Nothing here needs a
GPU, nvcc, a host compiler or the network.
"""
from __future__ import annotations

from humming_aot import env
from humming_aot.jit import cache, nvrtc
from humming_aot.jit.cubin import CubinError, check_cubin, expected_metadata
from humming_aot.jit.nvrtc import NvrtcCompileError, NvrtcError, NvrtcNotFoundError
from humming_aot.spec import KernelKey

__all__ = [
    "CubinError",
    "NvrtcCompileError",
    "NvrtcError",
    "NvrtcNotFoundError",
    "check_cubin",
    "compile_kernel",
    "expected_metadata",
    "jit_available",
    "obtain_cubin",
]


def _include_dir():
    from humming_aot.catalog_data import find_include_dir

    return find_include_dir()


def obtain_cubin(key: KernelKey) -> cache.CacheResult:
    """The cubin of ``key`` with where it came from (cache hit or fresh compile, and how long it took).

    Raises NvrtcNotFoundError (no libnvrtc), NvrtcCompileError (the log names the key), NvrtcError
    (e.g. this NVRTC cannot target key.arch), FileNotFoundError (headers missing) or
    cache.CacheDirError. Does not look at HUMMING_AOT_JIT: callers decide whether to compile.
    """
    return cache.obtain(key, include_dir=_include_dir(), nvrtc_lib=nvrtc.load_nvrtc())


def compile_kernel(key: KernelKey) -> bytes:
    """The cubin bytes of ``key`` for ``key.arch``: a JIT cache hit, or an NVRTC compile (cached)."""
    return obtain_cubin(key).data


def jit_available(arch: str | None = None) -> tuple[bool, str]:
    """(True, 'NVRTC 13.0 (13.0.88) at ...') when a kernel missing from the catalog can be compiled
    now (for ``arch``, if given); else (False, why not, and what to do)."""
    try:
        if not env.jit_enabled():
            return False, "run-time compilation is off (HUMMING_AOT_JIT=0)"
    except ValueError as e:
        return False, str(e)
    try:
        lib = nvrtc.load_nvrtc()
        if arch is not None:
            nvrtc.check_arch_supported(lib, arch)
        include_dir = _include_dir()
    except (NvrtcNotFoundError, NvrtcError, FileNotFoundError) as e:
        return False, str(e)
    return True, f"NVRTC {lib.version_string} at {lib.path}, headers in {include_dir}"
