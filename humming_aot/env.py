"""Every environment variable humming_aot reads, declared once with its default and meaning.

This is the only module that touches ``os.environ``. Other modules call the accessors below
(``jit_enabled()``, ``cache_dir()``, ...), so a reader finds every knob here and ``humming-aot info``
can print them all from ``VARIABLES``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EnvVar:
    """One environment variable: its name, the value used when it is unset or empty, and what it does."""

    name: str
    default: str | None
    doc: str

    def get(self) -> str | None:
        """The variable's value; the default when it is unset or set to the empty string."""
        value = os.environ.get(self.name)
        return self.default if value is None or value == "" else value

    def is_set(self) -> bool:
        return bool(os.environ.get(self.name))


VARIABLES: dict[str, EnvVar] = {}


def _declare(name: str, default: str | None, doc: str) -> EnvVar:
    if name in VARIABLES:
        raise RuntimeError(f"environment variable {name} is declared twice")
    var = EnvVar(name=name, default=default, doc=doc)
    VARIABLES[name] = var
    return var


CATALOG_DIR = _declare(
    "HUMMING_AOT_CATALOG_DIR",
    None,
    "Extra kernel catalog directories (each holding manifest.json and kernels/, as written by "
    "`humming-aot build --inplace` or unpacked from a wheel's humming_aot/_catalog), separated by "
    "os.pathsep. Searched before the catalog packaged with humming_aot; the first match of a kernel "
    "name wins.",
)
JIT = _declare(
    "HUMMING_AOT_JIT",
    "1",
    "'1' (default): a kernel missing from the catalog is compiled at run time with NVRTC. '0': "
    "run-time compilation is forbidden and a missing kernel is an error that names it and the "
    "`humming-aot build` command that would add it (strict air-gapped use).",
)
PDL = _declare(
    "HUMMING_AOT_PDL",
    "1",
    "'1', 'true' or 'on' (default): on sm_90+ GPUs kernels are launched with Programmatic Dependent "
    "Launch, so a GEMM's prologue (barrier setup, descriptor prefetch) overlaps the tail of the "
    "kernel before it in the stream. '0', 'false' or 'off': ordinary launches, e.g. to rule PDL out "
    "while debugging. Results are the same either way. Read when a kernel is first loaded on a device.",
)
CLUSTERS = _declare(
    "HUMMING_AOT_CLUSTERS",
    "1",
    "'1', 'true' or 'on' (default): on sm_90+ GPUs the kernels that can (the 8-row tiles of M <= 8) sum "
    "their split-K slices inside a thread-block cluster, through distributed shared memory, and the "
    "activation quantization splits a few long per-token rows over the CTAs of a cluster. '0', "
    "'false' or 'off': through the global workspace, as every other kernel does, and such rows stay "
    "one CTA, e.g. to rule clusters out while debugging. Results are the same bits either way. Read "
    "when a GEMM kernel is first loaded on a device, and at each quantization call.",
)
HELPERS = _declare(
    "HUMMING_AOT_HELPERS",
    "1",
    "'1', 'true' or 'on' (default): on a GPU the steps around the MoE GEMMs (routing, activation, "
    "combine) run as humming_aot's own kernels (humming_aot.helper_kernels). '0', 'false' or 'off': "
    "as torch operations, the same results bit for bit for expert ids in [0, E) (slower: several "
    "kernels per step; an id out of range, which the kernels drop, fails there). Read at each call.",
)
CACHE_DIR = _declare(
    "HUMMING_AOT_CACHE_DIR",
    "~/.cache/humming_aot",
    "Directory of the JIT disk cache (content-hash keyed cubins). Use a node-local path on clusters.",
)
NVCC = _declare(
    "HUMMING_AOT_NVCC",
    None,
    "Path of the nvcc used by `humming-aot build`; default: nvcc on PATH, then $CUDA_HOME/bin/nvcc, "
    "then /usr/local/cuda/bin/nvcc.",
)
NVRTC = _declare(
    "HUMMING_AOT_NVRTC",
    None,
    "Path of the libnvrtc.so the JIT loads (or of the directory holding it). Default: the pip package "
    "nvidia-cuda-nvrtc (site-packages/nvidia/cu13/lib, then nvidia/cuda_nvrtc/lib), then "
    "$CUDA_HOME/lib64, then /usr/local/cuda/lib64.",
)
LOG_LEVEL = _declare(
    "HUMMING_AOT_LOG_LEVEL",
    "WARNING",
    "Level of the 'humming_aot' logger: DEBUG, INFO, WARNING, ERROR or CRITICAL. At DEBUG the CLI "
    "also prints tracebacks for errors it would otherwise report in one line.",
)
CUDA_HOME = _declare(
    "CUDA_HOME",
    None,
    "Not ours, read only as a fallback: the CUDA toolkit root whose bin/nvcc `humming-aot build` "
    "uses when HUMMING_AOT_NVCC is unset and no nvcc is on PATH, and whose lib64/libnvrtc.so the "
    "JIT uses when HUMMING_AOT_NVRTC is unset and no nvidia-cuda-nvrtc pip package is installed.",
)

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ON = ("1", "true", "on")
_OFF = ("0", "false", "off")


def catalog_dirs() -> list[Path]:
    """The HUMMING_AOT_CATALOG_DIR entries, in search order (empty when unset)."""
    value = CATALOG_DIR.get()
    if value is None:
        return []
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part]


def jit_enabled() -> bool:
    """Whether a kernel missing from the catalog may be compiled at run time."""
    value = JIT.get()
    if value not in ("0", "1"):
        raise ValueError(
            f"HUMMING_AOT_JIT={value!r} is not '0' or '1': set it to '0' to forbid run-time "
            "compilation or '1' (the default) to allow it"
        )
    return value == "1"


def _switch(var: EnvVar, off_means: str, on_means: str) -> bool:
    """An on/off variable: 1/true/on or 0/false/off in any case; anything else is an error that
    says what either setting does."""
    value = var.get()
    if value.lower() not in _ON + _OFF:
        raise ValueError(
            f"{var.name}={value!r} is not one of 0/false/off or 1/true/on: set it to '0' to {off_means} "
            f"or '1' (the default) to {on_means}"
        )
    return value.lower() in _ON


def pdl_enabled() -> bool:
    """Whether kernels on sm_90+ GPUs may be launched with Programmatic Dependent Launch."""
    return _switch(PDL, "launch without Programmatic Dependent Launch", "use it on sm_90+ GPUs")


def clusters_enabled() -> bool:
    """Whether kernels on sm_90+ GPUs may sum their split-K slices inside a thread-block cluster."""
    return _switch(CLUSTERS, "reduce split-K slices through the global workspace", "use clusters on sm_90+ GPUs")


def helpers_enabled() -> bool:
    """Whether the steps around the MoE GEMMs may run as humming_aot's helper kernels on a GPU."""
    return _switch(HELPERS, "keep them on torch operations", "use the helper kernels")


def cache_dir() -> Path:
    """The JIT disk cache directory (not created here)."""
    return Path(CACHE_DIR.get()).expanduser()


def nvcc_override() -> Path | None:
    """HUMMING_AOT_NVCC as a path, or None when unset."""
    value = NVCC.get()
    return Path(value).expanduser() if value is not None else None


def nvrtc_override() -> Path | None:
    """HUMMING_AOT_NVRTC as a path (a libnvrtc.so file or its directory), or None when unset."""
    value = NVRTC.get()
    return Path(value).expanduser() if value is not None else None


def cuda_home() -> Path | None:
    value = CUDA_HOME.get()
    return Path(value).expanduser() if value is not None else None


def log_level() -> int:
    """HUMMING_AOT_LOG_LEVEL as a ``logging`` level number."""
    value = LOG_LEVEL.get().upper()
    if value not in _LOG_LEVELS:
        raise ValueError(
            f"HUMMING_AOT_LOG_LEVEL={LOG_LEVEL.get()!r} is not a log level: use one of {', '.join(_LOG_LEVELS)}"
        )
    return getattr(logging, value)


def subprocess_env(**overrides: str) -> dict[str, str]:
    """A copy of the process environment with ``overrides`` applied, for child processes."""
    env = dict(os.environ)
    env.update(overrides)
    return env


def describe() -> list[tuple[str, str | None, bool, str]]:
    """(name, effective value, whether it is set, doc) for every declared variable, in declaration order."""
    return [(var.name, var.get(), var.is_set(), var.doc) for var in VARIABLES.values()]
