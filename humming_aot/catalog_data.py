"""Reads the declarative data under catalog/ (support matrix, families, tile tables), and finds
the CUDA headers the kernels compile against (the build's and the JIT's -I).

One loader for everyone: the run time, the enumerator, the docs generator and the tests. The
files are found inside the installed package (``humming_aot/catalog_files``, put there by the wheel
build) or, in a source checkout, at the repository's ``catalog/``.
"""
from __future__ import annotations

import functools
import tomllib
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def catalog_data_dir() -> Path:
    """The folder holding support.toml, tiles.toml and the built-in catalogs' .toml files."""
    for candidate in (_PACKAGE_DIR / "catalog_files", _PACKAGE_DIR.parent / "catalog"):
        if (candidate / "support.toml").is_file():
            return candidate
    raise FileNotFoundError(
        "humming_aot's catalog data (support.toml, tiles.toml) is missing: neither "
        f"{_PACKAGE_DIR / 'catalog_files'} nor {_PACKAGE_DIR.parent / 'catalog'} has it; "
        "reinstall the package"
    )


def find_include_dir() -> Path:
    """The directory to pass as -I: it holds humming_aot/kernel/... .

    A source checkout's csrc/include comes first (the headers being edited), then the copy an
    installed wheel carries in humming_aot/include.
    """
    for candidate in (_PACKAGE_DIR.parent / "csrc" / "include", _PACKAGE_DIR / "include"):
        if (candidate / "humming_aot").is_dir():
            return candidate
    raise FileNotFoundError(
        f"humming_aot's CUDA headers are missing: neither {_PACKAGE_DIR.parent / 'csrc' / 'include'} "
        f"nor {_PACKAGE_DIR / 'include'} has a humming_aot/ folder; reinstall the package"
    )


@functools.cache
def load_toml(name: str) -> dict:
    """Parse one of the catalog data files by file name (e.g. 'tiles.toml')."""
    path = catalog_data_dir() / name
    with path.open("rb") as f:
        data = tomllib.load(f)
    if data.get("schema_version") != 1:
        raise ValueError(f"{path}: schema_version {data.get('schema_version')!r} is not 1")
    return data


BUILTIN_CATALOG_NAMES = ("default", "dense", "moe", "smoke")


def catalog_file(name_or_path: str) -> Path:
    """A built-in catalog's name ('default', 'dense', 'moe', 'smoke') -> its packaged family file;
    anything else is a path to a .toml file."""
    if name_or_path in BUILTIN_CATALOG_NAMES:
        return catalog_data_dir() / f"{name_or_path}.toml"
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"catalog {name_or_path!r} is neither a built-in catalog ({', '.join(BUILTIN_CATALOG_NAMES)}) nor an "
            "existing .toml file"
        )
    return path
