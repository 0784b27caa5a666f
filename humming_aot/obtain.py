"""Step 4 of a call: which KernelKey serves a problem on a GPU, and where its image comes from.

select:  the tile table's key where the catalog has it (on any arch that serves the GPU); else the
         table's key compiled by the JIT, when JIT is on and NVRTC is there; else the catalog's
         nearest tile for the same spec (a smoke wheel serves every M with its one tile)
load:    installed catalog (manifest + sha256) -> JIT disk cache -> NVRTC compile; with
         HUMMING_AOT_JIT=0 (or no NVRTC) a catalog miss is a KernelNotAvailableError that names
         the key and the `humming-aot build` command that would ship it

The in-memory caches sit around this: ``dispatch.obtain`` per (spec, device, tile) and
``kernels.get_loaded`` per (kernel, device).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from humming_aot import heuristics, support
from humming_aot.spec import GemmSpec, KernelKey, TileConfig

if TYPE_CHECKING:
    from humming_aot.dispatch import DeviceInfo
    from humming_aot.kernels import LoadedKernel


class KernelNotAvailableError(RuntimeError):
    """No compiled kernel for a request, and run-time compilation is unavailable or off."""


@functools.cache
def _default_catalog_names(arch: str) -> frozenset[str]:
    from humming_aot.enumerate import catalog_archs, enumerate_keys

    if arch not in catalog_archs("default"):
        return frozenset()
    return frozenset(key.name for key in enumerate_keys("default", [arch]))


def build_hint(key: KernelKey) -> str:
    """The `humming-aot build` command (and, outside the default catalog, the catalog entry) that ships ``key``."""
    if key.name in _default_catalog_names(key.arch):
        return (f"install the {key.arch} catalog (`pip install 'humming_aot[{key.arch}]'`), or build it with "
                f"`humming-aot build --arch {key.arch} --catalog default` and install that wheel")
    pairing = support.pairing_for(key.spec, key.arch)
    family = (
        f'family = [{{ pairing = "{pairing.name if pairing else "<pairing from catalog/support.toml>"}", '
        f'archs = ["{key.arch}"], a_dtype = ["{key.spec.a_dtype}"], w_dtype = ["{key.spec.w_dtype}"], '
        f'tiles = ["{key.tile.label}"] }}]'
    )
    return (
        "it is not in the default catalog: write a catalog file (e.g. my_kernels.toml) holding the two lines\n"
        f"    schema_version = 1\n    {family}\n"
        f"then run `humming-aot build --arch {key.arch} --catalog my_kernels.toml` and install that wheel "
        "(or add the tile to the `tiles` of an existing family of your catalog file)"
    )


def missing_kernel_error(key: KernelKey, info: "DeviceInfo", reason: str) -> KernelNotAvailableError:
    return KernelNotAvailableError(
        f"no compiled kernel {key.name} for {info.name} (compute capability "
        f"{info.capability[0]}.{info.capability[1]}): {reason}. To ship it, {build_hint(key)}"
    )


def jit_arch(spec: GemmSpec, info: "DeviceInfo") -> str:
    """The arch the JIT compiles for: the best arch serving this GPU that supports the spec."""
    for arch in info.arches:
        if support.is_supported(spec, arch):
            return arch
    return info.arches[0]


def _jit_usable(arch: str) -> tuple[bool, str]:
    from humming_aot import jit

    return jit.jit_available(arch)


def _key_if_valid(arch: str, spec: GemmSpec, tile: TileConfig) -> KernelKey | None:
    """The key, or None where the tile's body does not exist for the arch (wgmma off sm90a)."""
    try:
        return KernelKey(arch=arch, spec=spec, tile=tile)
    except ValueError:
        return None


def select_key(spec: GemmSpec, info: "DeviceInfo", m: int, tile: TileConfig | None = None,
               k: int | None = None, group: int | None = None, n: int | None = None) -> KernelKey:
    """The key to run for ``m`` rows (``tile``: forced, for tuning), without loading anything; K
    and the group size, when given, rule out table tiles they do not fit, and N (with K) picks
    between the rows of one M (heuristics.select_tile, heuristics.tiles.FillCondition)."""
    from humming_aot.catalog import installed_catalog

    catalog = installed_catalog()
    if tile is not None:
        for arch in info.arches:
            key = _key_if_valid(arch, spec, tile)
            if key is not None and catalog is not None and catalog.lookup(key.name) is not None:
                return key
        return KernelKey(arch=jit_arch(spec, info), spec=spec, tile=tile)
    if catalog is not None:
        for arch in info.arches:
            table_tile = heuristics.select_tile(arch, m, k, group, spec.w_bits, n=n, num_sms=info.num_sms,
                                                float_codes=spec.w_is_float)
            key = _key_if_valid(arch, spec, table_tile)
            if key is not None and catalog.lookup(key.name) is not None:
                return key
    arch = jit_arch(spec, info)
    preferred = KernelKey(arch=arch, spec=spec,
                          tile=heuristics.select_tile(arch, m, k, group, spec.w_bits, n=n, num_sms=info.num_sms,
                                                     float_codes=spec.w_is_float))
    usable, reason = _jit_usable(arch)
    if usable:  # the table's tile compiled once beats a catalog tile made for another M
        return preferred
    if catalog is None:
        raise missing_kernel_error(preferred, info, f"no kernel catalog is installed and {reason}")
    for arch in info.arches:
        same_spec = [
            key for key in map(KernelKey.from_name, catalog.keys_for(arch))
            if key.spec == spec and (k is None or group is None or heuristics.tile_fits(key.tile, k, group))
        ]
        if same_spec:
            # smallest tile that covers m, else the largest
            return min(same_spec, key=lambda c: (c.tile.block_m < m, abs(c.tile.block_m - m), c.name))
    raise missing_kernel_error(
        preferred, info,
        f"the installed catalog has no kernel for this format on {', '.join(info.arches)} and {reason}",
    )


def load(key: KernelKey, info: "DeviceInfo") -> "LoadedKernel":
    """The kernel of ``key`` loaded on ``info``'s device: from the catalog, else from the JIT."""
    from humming_aot import kernels
    from humming_aot.catalog import installed_catalog

    catalog = installed_catalog()
    entry = catalog.lookup(key.name) if catalog is not None else None
    if entry is not None:
        return kernels.get_loaded(
            key.name, info.index,
            lambda: kernels.load_kernel_image(lambda: catalog.read_image(key.name), name=key.name, expected=entry,
                                              device=info.index, image_digest=entry.sha256),
        )
    usable, reason = _jit_usable(key.arch)
    if not usable:
        where = "it is not in the installed catalog" if catalog is not None else "no kernel catalog is installed"
        raise missing_kernel_error(key, info, f"{where} and {reason}")
    from humming_aot import jit

    return kernels.get_loaded(
        key.name, info.index,
        lambda: kernels.load_kernel_image(jit.compile_kernel(key), name=key.name,
                                          expected=jit.expected_metadata(key), device=info.index),
    )
