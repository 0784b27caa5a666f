"""What exists precompiled: the kernel catalogs installed as packages, built in place, or pointed at
by HUMMING_AOT_CATALOG_DIR, read through their manifest.json.

A catalog directory holds ``manifest.json`` and ``kernels/<unit>.fatbin``, each file a few
kernels (see ``humming_aot.manifest``). Directories are searched in order: each HUMMING_AOT_CATALOG_DIR
entry, then the package's ``humming_aot/_catalog`` (written by ``humming-aot build --inplace`` in a
checkout), then every installed catalog package: ``humming_aot_kernels/<arch>_cu<major>/`` in
any ``sys.path`` entry (``humming-aot-kernels-sm90a-cu13`` and its siblings, see
``humming_aot.distribution``), newest CUDA major first, then arch order. The first directory
holding a kernel name serves it. Every image is checked against its manifest sha256 when read; a mismatch is an error naming
the file, never a silent wrong result.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import sys
from pathlib import Path

from humming_aot import distribution, env
from humming_aot._version import __version__
from humming_aot.manifest import MANIFEST_NAME, manifest_problems
from humming_aot.params_abi import PARAMS_VERSION
from humming_aot.spec import KernelKey

logger = logging.getLogger(__name__)

PACKAGE_CATALOG_DIR = Path(__file__).resolve().parent / "_catalog"


class CatalogIntegrityError(RuntimeError):
    """A catalog file is missing, malformed, or not what its manifest says."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    """One precompiled kernel as its manifest describes it."""

    name: str
    path: Path  # absolute path of the fatbin
    sha256: str
    arch: str
    toolkit: str  # nvcc release string it was built with
    cuda_version: str  # "13.0"
    smem_bytes: int  # dynamic shared memory per CTA
    threads: int  # threads per CTA
    params_version: int  # GemmParams layout version

    @property
    def key(self) -> KernelKey:
        return KernelKey.from_name(self.name)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HelperEntry:
    """One precompiled unit of helper kernels (humming_aot.helper_kernels) as its manifest describes it."""

    name: str  # helper_kernels.unit_name(unit, arch)
    unit: str
    path: Path
    sha256: str
    arch: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ManifestInfo:
    """The header of one catalog directory's manifest."""

    directory: Path
    catalog: str
    cuda_version: str
    toolkit: str
    archs: tuple[str, ...]
    kernel_count: int
    package: str | None = None  # the distribution that installed it, e.g. 'humming-aot-kernels-sm90a-cu13'


def _package_of(directory: Path) -> str | None:
    if directory.parent.name != distribution.KERNELS_NAMESPACE:
        return None
    parsed = distribution.parse_kernel_dir_name(directory.name)
    return distribution.kernel_dist_name(*parsed) if parsed else None


def _load_dir(directory: Path) -> tuple[ManifestInfo, list[CatalogEntry], list[HelperEntry]]:
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CatalogIntegrityError(f"{path}: cannot read the catalog manifest ({e})") from None
    problems = manifest_problems(manifest)
    if problems:
        raise CatalogIntegrityError(f"{path} is malformed: {'; '.join(problems)}; rebuild the catalog")
    package = _package_of(directory)
    if manifest["package_version"] != __version__:
        fix = (f"`pip install {package}=={__version__}` (or `humming-aot build` one)" if package else
               "reinstall the matching wheel or rebuild it (`humming-aot build --inplace` in a checkout)")
        raise CatalogIntegrityError(
            f"{path} was built for humming_aot {manifest['package_version']}, this is {__version__}: {fix}"
        )
    entries = []
    for name, entry in sorted(manifest["kernels"].items()):
        if entry["params_version"] != PARAMS_VERSION:
            raise CatalogIntegrityError(
                f"{path}: kernel {name} has GemmParams version {entry['params_version']}, this humming_aot "
                f"launches version {PARAMS_VERSION}: rebuild the catalog"
            )
        entries.append(CatalogEntry(
            name=name, path=directory / entry["file"], sha256=entry["sha256"], arch=entry["arch"],
            toolkit=entry["toolkit"], cuda_version=manifest["cuda_version"],
            smem_bytes=int(entry["smem_bytes"]), threads=int(entry["threads"]),
            params_version=int(entry["params_version"]),
        ))
    from humming_aot.helper_kernels import HELPERS_VERSION

    helpers = []
    for name, entry in sorted(manifest.get("helpers", {}).items()):
        if entry["helpers_version"] != HELPERS_VERSION:  # the JIT serves it; the GEMM kernels stay usable
            logger.warning("%s: helper unit %s has version %s, this humming_aot launches version %s: not using it "
                           "(rebuild the catalog)", path, name, entry["helpers_version"], HELPERS_VERSION)
            continue
        helpers.append(HelperEntry(name=name, unit=entry["unit"], path=directory / entry["file"],
                                   sha256=entry["sha256"], arch=entry["arch"]))
    info = ManifestInfo(
        directory=directory, catalog=manifest["catalog"], cuda_version=manifest["cuda_version"],
        toolkit=manifest["toolkit"], archs=tuple(manifest["archs"]), kernel_count=len(entries),
        package=package,
    )
    return info, entries, helpers


@dataclasses.dataclass(frozen=True, slots=True)
class Catalog:
    """The kernels of one or more catalog directories (the first directory holding a name wins)."""

    manifests: tuple[ManifestInfo, ...]
    entries: dict[str, CatalogEntry]
    helpers: dict[str, HelperEntry] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dirs(cls, directories: list[Path]) -> "Catalog":
        manifests, entries, helpers = [], {}, {}
        for directory in directories:
            info, dir_entries, dir_helpers = _load_dir(Path(directory).resolve())
            manifests.append(info)
            for entry in dir_entries:
                entries.setdefault(entry.name, entry)
            for helper in dir_helpers:
                helpers.setdefault(helper.name, helper)
        return cls(tuple(manifests), entries, helpers)

    @property
    def archs(self) -> list[str]:
        from humming_aot.support import arch_sort_key

        return sorted({e.arch for e in self.entries.values()}, key=arch_sort_key)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, name: str) -> CatalogEntry | None:
        return self.entries.get(name)

    def keys_for(self, arch: str) -> list[str]:
        """The names of every kernel of one arch, sorted (``KernelKey.from_name`` parses one)."""
        return [name for name, entry in sorted(self.entries.items()) if entry.arch == arch]

    def read_image(self, name: str) -> bytes:
        """The fatbin bytes of a kernel (or of a helper unit), verified against the manifest's sha256.
        A file holds a few kernels (manifest.py); obtain.py reads it only for the first of them to
        load (kernels.load_kernel_image shares the file's library by that sha256)."""
        entry = self.entries.get(name) or self.helpers.get(name)
        if entry is None:
            dirs = ", ".join(str(m.directory) for m in self.manifests)
            raise KeyError(f"kernel {name} is not in the catalog ({dirs})")
        try:
            data = entry.path.read_bytes()
        except OSError as e:
            raise CatalogIntegrityError(
                f"{entry.path}: kernel file listed in the manifest cannot be read ({e}); reinstall or "
                "rebuild the catalog"
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256:
            raise CatalogIntegrityError(
                f"{entry.path}: sha256 {digest} does not match the manifest's {entry.sha256}; the file "
                "is corrupt or was replaced: reinstall the wheel or rebuild the catalog"
            )
        return data


def kernel_package_roots() -> list[Path]:
    """The ``humming_aot_kernels`` directories on ``sys.path`` (where catalog packages install), in
    ``sys.path`` order: a namespace package, found without importing anything."""
    roots, seen = [], set()
    for entry in sys.path:
        root = Path(entry or ".") / distribution.KERNELS_NAMESPACE
        if root.is_dir() and root.resolve() not in seen:
            seen.add(root.resolve())
            roots.append(root)
    return roots


def installed_package_dirs() -> list[Path]:
    """Every installed catalog package's directory, newest CUDA major first, then arch order."""
    from humming_aot.support import arch_sort_key

    found: dict[str, Path] = {}
    for root in kernel_package_roots():
        for directory in sorted(root.iterdir()):
            parsed = distribution.parse_kernel_dir_name(directory.name)
            if parsed and (directory / MANIFEST_NAME).is_file():
                found.setdefault(directory.name, directory)  # an earlier sys.path entry wins

    def order(name: str) -> tuple:
        arch, major = distribution.parse_kernel_dir_name(name)
        return -major, arch_sort_key(arch)

    return [found[name] for name in sorted(found, key=order)]


def catalog_search_dirs() -> list[Path]:
    """Catalog directories in search order: HUMMING_AOT_CATALOG_DIR entries, the package's
    in-place catalog, then the installed catalog packages."""
    dirs = []
    for directory in env.catalog_dirs():
        if not (directory / MANIFEST_NAME).is_file():
            raise FileNotFoundError(
                f"HUMMING_AOT_CATALOG_DIR entry {directory} has no {MANIFEST_NAME}: point it at a "
                "directory written by `humming-aot build --inplace` (humming_aot/_catalog) or unset it"
            )
        dirs.append(directory)
    if (PACKAGE_CATALOG_DIR / MANIFEST_NAME).is_file():
        dirs.append(PACKAGE_CATALOG_DIR)
    return dirs + installed_package_dirs()


@functools.cache
def installed_catalog() -> Catalog | None:
    """The catalog of this installation, or None when no catalog directory exists (every kernel
    then comes from the JIT). Cached; ``installed_catalog.cache_clear()`` re-reads."""
    dirs = catalog_search_dirs()
    if not dirs:
        logger.info("no kernel catalog installed (searched HUMMING_AOT_CATALOG_DIR, %s and the "
                    "humming_aot_kernels packages on sys.path)", PACKAGE_CATALOG_DIR)
        return None
    return Catalog.from_dirs(dirs)


def test_keys(arch: str, tier: str = "smoke", catalog: str = "dense") -> list[KernelKey]:
    """Kernel keys for tests on ``arch``, from a catalog's families (default: the dense catalog,
    the default one without its MoE GEMMs).

    tier "smoke": one tile per GemmSpec (the smallest); "full": every kernel. An arch the catalog
    does not cover gives no keys.
    """
    from humming_aot.enumerate import catalog_archs, enumerate_keys

    if tier not in ("smoke", "full"):
        raise ValueError(f"tier {tier!r} is not 'smoke' or 'full'")
    if arch not in catalog_archs(catalog):
        return []
    keys = enumerate_keys(catalog, [arch])
    if tier == "full":
        return keys
    smallest: dict = {}
    for key in keys:
        size = (key.tile.block_m * key.tile.block_n, key.tile.stages, key.name)
        if key.spec not in smallest or size < smallest[key.spec][0]:
            smallest[key.spec] = (size, key)
    return sorted(key for _, key in smallest.values())


test_keys.__test__ = False  # not a pytest test, despite the name
