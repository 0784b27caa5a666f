"""The distributions humming_aot ships as, and their names: one core plus one kernel catalog per arch
and CUDA major.

- ``humming_aot`` (the core): Python, the launcher extension ``humming_aot._C``, the JIT, the CUDA
  headers and the catalog data. Tagged for the Python it was built with (the launcher is a CPython
  extension); no kernels.
- ``humming-aot-kernels-<arch>-cu<major>`` (a catalog): ``manifest.json`` and the fatbins of one
  arch, built with one CUDA major, under the namespace package directory
  ``humming_aot_kernels/<arch>_cu<major>/``. Tagged ``py3-none-any``: fatbins depend on neither
  the Python version nor the host's CPU. Several install side by side (each owns its directory)
  and the core finds them all on ``sys.path`` (``humming_aot.catalog``).
- Extras on the core pin the catalogs to the core's exact version: ``humming_aot[sm89]``,
  ``humming_aot[sm89,sm90a]``, ``humming_aot[all]``; pip, not a local version label, picks them.

This module must stay importable by file path from ``setup.py``, before the package is installed:
it imports nothing from ``humming_aot``.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

CORE_NAME = "humming_aot"
KERNELS_NAMESPACE = "humming_aot_kernels"
# The CUDA major whose catalogs the extras name. A CUDA 12 build would ship as
# humming-aot-kernels-<arch>-cu12 from its own index (PyTorch's per-CUDA index pattern).
EXTRAS_CUDA_MAJOR = 13
REQUIRES_PYTHON = ">=3.11"
INSTALL_REQUIRES = ["torch>=2.4"]
# Extras that are not kernel catalogs.
TOOL_EXTRAS = {
    "test": ["pytest>=8", "hypothesis>=6", "ml_dtypes>=0.5", "safetensors>=0.4", "numpy",
             "nvidia-cuda-nvrtc==13.0.88"],
    "build": ["ninja", "pybind11>=2.12", "setuptools>=70", "wheel"],
    # The JIT needs only libnvrtc: the kernel headers include no CUDA toolkit header, and the
    # cache locks with fcntl.flock.
    "jit": ["nvidia-cuda-nvrtc"],
}
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def cuda_major(cuda_version: str) -> int:
    """'13.0' -> 13."""
    return int(cuda_version.split(".")[0])


def kernel_dist_name(arch: str, major: int) -> str:
    """The catalog distribution of one arch and CUDA major: 'humming-aot-kernels-sm90a-cu13'."""
    return f"humming-aot-kernels-{arch}-cu{major}"


def kernel_dir_name(arch: str, major: int) -> str:
    """Its directory under the humming_aot_kernels namespace: 'sm90a_cu13'."""
    return f"{arch}_cu{major}"


def parse_kernel_dir_name(name: str) -> tuple[str, int] | None:
    """'sm90a_cu13' -> ('sm90a', 13); None for anything else."""
    match = re.fullmatch(r"(sm\d+[af]?)_cu(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else None


def normalize(name: str) -> str:
    """PEP 503 project name: 'humming_aot' -> 'humming-aot'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_part(name: str) -> str:
    """The name as a wheel file spells it (PEP 427): 'humming-aot-kernels-sm89-cu13' -> 'humming_aot_kernels_sm89_cu13'."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _families(folder: Path, name: str) -> list[dict]:
    """A built-in catalog's [[family]] tables, those of the catalogs it includes first (read
    without humming_aot.enumerate, which needs the support matrix; every family of a built-in
    catalog lists its archs)."""
    with (folder / f"{name}.toml").open("rb") as f:
        data = tomllib.load(f)
    families = []
    for included in data.get("include", []):
        families += _families(folder, included)
    return families + data.get("family", [])


def default_catalog_archs(source_root: Path | str | None = None) -> list[str]:
    """The archs of the default catalog (catalog/default.toml, or the installed copy), in file order."""
    root = Path(source_root) if source_root is not None else _SOURCE_ROOT
    here = Path(__file__).resolve().parent  # the installed package
    for folder in (root / "catalog", here / "catalog_files"):
        if (folder / "default.toml").is_file():
            archs: list[str] = []
            for family in _families(folder, "default"):
                archs += [a for a in family["archs"] if a not in archs]
            return sorted(archs, key=lambda a: (int(re.sub(r"\D", "", a)), a))
    raise FileNotFoundError(f"catalog/default.toml is missing under {root} and {here / 'catalog_files'}")


def catalog_extras(version: str, archs: list[str], major: int = EXTRAS_CUDA_MAJOR) -> dict[str, list[str]]:
    """One extra per arch pinning its catalog to ``version``, plus 'all'."""
    extras = {arch: [f"{kernel_dist_name(arch, major)}=={version}"] for arch in archs}
    extras["all"] = [req for arch in archs for req in extras[arch]]
    return extras


def core_extras(version: str, archs: list[str]) -> dict[str, list[str]]:
    """Every extra of the core: the tool extras and the catalog extras."""
    return {**TOOL_EXTRAS, **catalog_extras(version, archs)}
