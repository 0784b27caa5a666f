"""The enumerator: catalog families x archs x tiles -> the sorted KernelKeys a build compiles.

A catalog file (``catalog/default.toml``, ``catalog/smoke.toml`` or any file of the same shape)
lists *families*: a support pairing, optional subsets of its activation / weight / output dtypes, the archs,
and the tiles ("table" = every tile of the arch's table in tiles.toml, or a list of tile fields
such as "16x128x64_w1x2_s8"). Tiles whose shared memory exceeds the arch's limit for a spec are
left out. The result is deterministic: same files in, same sorted list out.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from pathlib import Path

from humming_aot import heuristics, support
from humming_aot.arch import validate_target
from humming_aot.catalog_data import catalog_file, load_toml
from humming_aot.codegen import kernel_smem_bytes
from humming_aot.spec import GemmSpec, GemmType, KernelKey, MmaKind, TileConfig, ZeroPoint

logger = logging.getLogger(__name__)

BUILTIN_CATALOGS = ("default", "dense", "moe", "smoke")
_FAMILY_KEYS = {"pairing", "doc", "archs", "gemm_type", "a_dtype", "w_dtype", "out_dtype", "tiles"}
_TILE_FIELD_RE = re.compile(r"^(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)(?:x(\d+))?_s(\d+)$")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Family:
    """One [[family]] of a catalog file, validated against support.toml."""

    index: int  # position in the file, for messages
    pairing: support.Pairing
    archs: tuple[str, ...]
    gemm_types: tuple[GemmType, ...]  # of the pairing's; default dense only
    a_dtypes: tuple[str, ...] | None  # None: every a_dtype of the pairing
    w_dtypes: tuple[str, ...] | None
    tiles: str | tuple[TileConfig, ...]  # "table" or explicit tiles
    out_dtypes: tuple[str, ...] | None = None  # None: every out_dtype of the pairing

    def specs(self) -> list[GemmSpec]:
        return [spec for spec in self.pairing.specs(
            a_dtypes=list(self.a_dtypes) if self.a_dtypes is not None else None,
            w_dtypes=list(self.w_dtypes) if self.w_dtypes is not None else None,
        ) if spec.gemm_type in self.gemm_types and (self.out_dtypes is None or spec.out_dtype in self.out_dtypes)]

    def tiles_for(self, arch: str, w_bits: int, gemm_type: GemmType = GemmType.DENSE,
                  zero_point: bool = False, float_codes: bool = False, quantized: bool = False) -> list[TileConfig]:
        """The family's tiles for an arch, w_bits-bit codes (with zero points or not, float codes or
        not) and a GEMM type: "table" is the table's rows for such codes, for the MoE types every tile
        heuristics.select_masked_tile can pick for the type (heuristics.moe_tile_table); listed tiles serve the MoE types where their body
        does (the mma.sync ones; for the masked type, the warp-specialized TMA body too, and with
        quantized activations the mma-w4a8 body only: heuristics.moe_bodies). A tile
        wider than 64 in K brings its 64-wide twin, which serves the shapes and group sizes it does
        not fit (heuristics.tile_fits), unless in the dense table a later row of its M interval
        serves those (heuristics.twin_reachable)."""
        moe = gemm_type is not GemmType.DENSE
        if self.tiles == "table":
            listed = (list(heuristics.moe_tile_table(arch, w_bits, masked=gemm_type is GemmType.MASKED,
                                                     zero_point=zero_point)) if moe
                      else [tile for _, tile in heuristics.arch_tile_table(arch, w_bits, float_codes)])
        else:
            bodies = heuristics.moe_bodies(gemm_type is GemmType.MASKED, quantized)
            listed = [tile for tile in self.tiles if not moe or tile.mma in bodies]
        dense_table = self.tiles == "table" and not moe
        seen = []
        for tile in listed:
            twin = not dense_table or heuristics.twin_reachable(arch, w_bits, tile, float_codes)
            for t in (tile, heuristics.narrow_twin(tile)) if twin else (tile,):
                if t not in seen:
                    seen.append(t)
        return seen


# Static shared memory beside a kernel's dynamic shared memory (its mbarriers, and the padding of
# the 1024-byte-aligned dynamic array: ptxas reports 1024 bytes for the TMA body's kernels, 128 for
# the mma.sync ones), which the per-block limit also counts: a tile is kept when its dynamic shared
# memory and this fit.
STATIC_SMEM_ALLOWANCE = 1024


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SkippedTile:
    """A (family, arch, spec, tile) left out because its shared memory exceeds the arch's limit."""

    name: str  # the kernel name it would have had
    smem_bytes: int
    smem_limit: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Enumeration:
    catalog: str  # label: 'default', 'smoke' or the file's stem
    archs: tuple[str, ...]  # as requested (sorted)
    keys: tuple[KernelKey, ...]  # sorted by name, no duplicates
    skipped: tuple[SkippedTile, ...]  # sorted by name


def parse_tile_field(text: str) -> TileConfig:
    """'16x128x64_w1x2_s8' (mma.sync) or 'wgmma:256x128x64_w1x8_s5' -> TileConfig (inverse of
    TileConfig.label)."""
    mma_text, _, field = text.rpartition(":")
    m = _TILE_FIELD_RE.match(field)
    if not m:
        raise ValueError(
            f"tile {text!r} does not read '[wgmma:]<M>x<N>x<K>_w<warps M>x<warps N>[x<warps K>]_s<stages>'"
        )
    try:
        mma = MmaKind(mma_text) if mma_text else MmaKind.MMA_SYNC
    except ValueError:
        raise ValueError(f"tile {text!r}: {mma_text!r} is not an mma kind ({', '.join(k.value for k in MmaKind)})") from None
    bm, bn, bk, wm, wn, wk, stages = (int(g or 1) for g in m.groups())
    tile = TileConfig(mma=mma, block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, warps_k=wk, stages=stages)
    if tile.label != text:
        raise ValueError(f"tile {text!r} is not in canonical form (expected {tile.label!r})")
    return tile


def catalog_label(catalog: str) -> str:
    """The name a catalog goes by in manifests and summaries: 'default', 'smoke' or a file stem."""
    return catalog if catalog in BUILTIN_CATALOGS else Path(catalog).stem


def _load_catalog_toml(catalog: str) -> tuple[Path, dict]:
    if catalog in BUILTIN_CATALOGS:
        return catalog_file(catalog), load_toml(f"{catalog}.toml")
    path = Path(catalog)
    if not path.is_file():
        raise ValueError(
            f"unknown catalog {catalog!r}: use one of {', '.join(BUILTIN_CATALOGS)} or the path of a "
            "catalog .toml file"
        )
    with path.open("rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"catalog file {path} is not valid TOML: {e}") from None
    if data.get("schema_version") != 1:
        raise ValueError(f"catalog file {path}: schema_version {data.get('schema_version')!r} is not 1")
    return path, data


def _parse_family(path: Path, index: int, entry: dict) -> Family:
    where = f"{path.name}: family {index + 1}"
    unknown = sorted(set(entry) - _FAMILY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (allowed: {sorted(_FAMILY_KEYS)})")
    if "pairing" not in entry:
        raise ValueError(f"{where}: has no 'pairing'")
    try:
        pairing = support.pairing_by_name(entry["pairing"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    archs = tuple(entry.get("archs", pairing.archs))
    for arch in archs:
        validate_target(arch)
        if arch not in pairing.archs:
            raise ValueError(
                f"{where}: arch {arch} is not allowed by pairing {pairing.name!r} "
                f"(it covers {', '.join(pairing.archs)})"
            )
    try:
        gemm_types = tuple(GemmType(t) for t in entry.get("gemm_type", ["dense"]))
    except (ValueError, TypeError):
        raise ValueError(f"{where}: gemm_type must be a list of {', '.join(repr(t.value) for t in GemmType)}, "
                         f"got {entry.get('gemm_type')!r}") from None
    refused = [t.value for t in gemm_types if t not in pairing.gemm_type]
    if refused or not gemm_types:
        raise ValueError(f"{where}: gemm_type {refused or '[]'} is not allowed by pairing {pairing.name!r} "
                         f"(it allows {', '.join(t.value for t in pairing.gemm_type)})")
    tiles = entry.get("tiles", "table")
    if tiles != "table":
        if isinstance(tiles, str) or not tiles:
            raise ValueError(f"{where}: tiles must be \"table\" or a non-empty list of tile fields")
        try:
            tiles = tuple(parse_tile_field(t) for t in tiles)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    out_dtypes = entry.get("out_dtype")
    if out_dtypes is not None:
        allowed = pairing.out_dtype or pairing.a_dtype  # (a pairing without out_dtype: the activations')
        refused = [d for d in out_dtypes if d not in allowed] if isinstance(out_dtypes, list) else None
        if refused is None or refused or not out_dtypes:
            raise ValueError(f"{where}: out_dtype must be a non-empty list of the pairing's output dtypes "
                             f"({', '.join(allowed)}), got {out_dtypes!r}")
        out_dtypes = tuple(out_dtypes)
    family = Family(
        index=index,
        pairing=pairing,
        archs=archs,
        gemm_types=gemm_types,
        a_dtypes=tuple(entry["a_dtype"]) if "a_dtype" in entry else None,
        w_dtypes=tuple(entry["w_dtype"]) if "w_dtype" in entry else None,
        tiles=tiles,
        out_dtypes=out_dtypes,
    )
    try:
        family.specs()  # checks the dtype subsets against the pairing
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return family


def load_families(catalog: str, _including: tuple[str, ...] = ()) -> list[Family]:
    """The validated families of a catalog (a built-in name or a path to a .toml file): those of
    the built-in catalogs its ``include`` list names, in order, then its own."""
    path, data = _load_catalog_toml(catalog)
    included = data.get("include", [])
    if not isinstance(included, list) or any(name not in BUILTIN_CATALOGS for name in included):
        raise ValueError(f"catalog file {path}: include must list built-in catalogs ({', '.join(BUILTIN_CATALOGS)}), "
                         f"got {included!r}")
    families = []
    for name in included:
        if name in (*_including, catalog):
            raise ValueError(f"catalog file {path}: including {name!r} would include it in itself")
        families += load_families(name, (*_including, catalog))
    own = data.get("family", [])
    if not own and not families:
        raise ValueError(f"catalog file {path} has no [[family]] entries and includes no catalog")
    return families + [_parse_family(path, i, entry) for i, entry in enumerate(own)]


def catalog_archs(catalog: str) -> list[str]:
    """Every arch some family of the catalog covers, in numeric order."""
    archs = {arch for family in load_families(catalog) for arch in family.archs}
    return sorted(archs, key=support.arch_sort_key)


def enumerate_catalog(catalog: str = "default", archs: list[str] | None = None) -> Enumeration:
    """Expand a catalog for some archs (None: every arch it covers) into sorted KernelKeys."""
    families = load_families(catalog)
    covered = sorted({a for f in families for a in f.archs}, key=support.arch_sort_key)
    wanted = sorted(set(covered if archs is None else archs), key=support.arch_sort_key)
    if not wanted:
        raise ValueError("no arch given: name at least one target, e.g. sm90a")
    for arch in wanted:
        validate_target(arch)
    keys: dict[str, KernelKey] = {}
    skipped: dict[str, SkippedTile] = {}
    for family in families:
        for arch in (a for a in family.archs if a in wanted):
            limit = heuristics.smem_limit(arch)
            for spec in family.specs():
                if not support.is_supported(spec, arch):  # a family never widens support.toml
                    raise AssertionError(support.why_unsupported(spec, arch))
                for tile in family.tiles_for(arch, spec.w_bits, spec.gemm_type,
                                             spec.w_zero_point is not ZeroPoint.NONE, spec.w_is_float,
                                             spec.a_is_quantized):
                    key = KernelKey(arch=arch, spec=spec, tile=tile)
                    smem = kernel_smem_bytes(key)
                    if smem + STATIC_SMEM_ALLOWANCE > limit:
                        skipped[key.name] = SkippedTile(name=key.name, smem_bytes=smem, smem_limit=limit)
                        logger.info("skipping %s: %d bytes of shared memory > %d on %s", key.name, smem, limit, arch)
                    else:
                        keys[key.name] = key
    empty = [arch for arch in wanted if not any(k.arch == arch for k in keys.values())]
    uncovered = [arch for arch in empty if arch not in covered]
    if uncovered:
        raise ValueError(
            f"catalog {catalog_label(catalog)!r} has no kernels for {', '.join(uncovered)}: "
            f"it covers {', '.join(covered)}"
        )
    if empty:
        raise ValueError(
            f"catalog {catalog_label(catalog)!r} has no kernels for {', '.join(empty)}: every tile it "
            f"lists there exceeds the shared-memory limit ({heuristics.smem_limit(empty[0])} bytes on "
            f"{empty[0]}); list smaller tiles (fewer stages) for that arch"
        )
    return Enumeration(
        catalog=catalog_label(catalog),
        archs=tuple(wanted),
        keys=tuple(keys[name] for name in sorted(keys)),
        skipped=tuple(skipped[name] for name in sorted(set(skipped) - set(keys))),
    )


def enumerate_keys(catalog: str = "default", archs: list[str] | None = None) -> list[KernelKey]:
    """The sorted, duplicate-free KernelKeys of a catalog for some archs (None: all it covers)."""
    return list(enumerate_catalog(catalog, archs).keys)
