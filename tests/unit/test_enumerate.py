"""The enumerator (determinism, sorting, shared-memory filtering, errors), the manifest writer and
the run-time catalog reader (lookup, integrity checks)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from humming_aot import codegen, heuristics, support, w4a8, w8a8
from humming_aot._version import __version__
from humming_aot.aot.ninja import plan_units
from humming_aot.catalog import Catalog, CatalogIntegrityError, installed_catalog, test_keys
from humming_aot.enumerate import (
    catalog_archs,
    enumerate_catalog,
    enumerate_keys,
    parse_tile_field,
)
from humming_aot.manifest import (
    MANIFEST_NAME,
    build_manifest,
    manifest_bytes,
    manifest_problems,
    write_manifest,
)
from humming_aot.moe import a8_launch
from humming_aot.moe.a8 import W8A8_MAX_TILE_ROWS
from humming_aot.spec import GemmType, KernelKey, MmaKind, ZeroPoint

TOOLKIT = "Cuda compilation tools, release 13.0, V13.0.88"


def _write_catalog_toml(path: Path, body: str) -> str:
    path.write_text("schema_version = 1\n" + body)
    return str(path)


# --- enumeration -------------------------------------------------------------------------------


def test_default_catalog_is_sorted_unique_and_deterministic():
    first = enumerate_keys("default", ["sm80", "sm89", "sm90a"])
    second = enumerate_keys("default", ["sm90a", "sm80", "sm89", "sm80"])
    assert first == second
    names = [k.name for k in first]
    assert names == sorted(names) and len(set(names)) == len(names)


def test_every_key_is_supported_and_fits_in_shared_memory():
    for key in enumerate_keys("default"):
        assert support.is_supported(key.spec, key.arch), key.name
        assert codegen.kernel_smem_bytes(key) <= heuristics.smem_limit(key.arch), key.name


def test_table_tiles_kept_exactly_when_they_fit():
    enumeration = enumerate_catalog("default")
    kept = {k.name for k in enumeration.keys}
    skipped = {s.name for s in enumeration.skipped}
    assert not kept & skipped
    for arch in enumeration.archs:
        limit = heuristics.smem_limit(arch)
        for spec in support.supported_specs(arch, GemmType.DENSE):
            if spec.a_is_quantized:  # W8A8: the wgmma-ss tiles its families list, not the table
                continue
            for _, tile in heuristics.arch_tile_table(arch, spec.w_bits, spec.w_is_float):
                smem = heuristics.smem_bytes(tile, spec.w_bits, spec.w_zero_point is not ZeroPoint.NONE)
                name = KernelKey(arch=arch, spec=spec, tile=tile).name
                assert (name in kept) == (smem <= limit), name
                assert (name in skipped) == (smem > limit), name
    assert all(s.smem_bytes > s.smem_limit for s in enumeration.skipped)


def test_tiles_over_the_arch_smem_limit_are_left_out(tmp_path):
    # 8-bit weights with a 6-stage 64x256 tile need 156 KB: over sm86's ~99 KB, under sm80's 163 KB
    catalog = _write_catalog_toml(tmp_path / "big.toml", """
[[family]]
pairing = "wna16_int_symmetric"
archs = ["sm80", "sm86"]
w_dtype = ["int8"]
a_dtype = ["bfloat16"]
tiles = ["64x256x64_w1x4_s6", "16x128x64_w1x2_s4"]
""")
    enumeration = enumerate_catalog(str(catalog), ["sm80", "sm86"])
    assert sorted(k.arch + " " + k.tile.field for k in enumeration.keys) == [
        "sm80 16x128x64_w1x2_s4", "sm80 64x256x64_w1x4_s6", "sm86 16x128x64_w1x2_s4"
    ]
    assert [s.name for s in enumeration.skipped] == [
        "gemm_dense_sm86_mma_a-bf16_w-s8-g-bf16_o-bf16_64x256x64_w1x4_s6"
    ]
    assert all(s.smem_bytes > s.smem_limit for s in enumeration.skipped)


def test_smoke_catalog_has_one_16_bit_kernel_per_arch_and_the_compile_only_pairings():
    keys = enumerate_keys("smoke")
    wna16 = [k for k in keys if not k.spec.a_is_quantized]
    assert Counter(k.arch for k in wna16) == {a: 1 for a in catalog_archs("smoke") if a != "sm120a"}
    assert {k.tile.field for k in wna16} == {"16x128x64_w1x2_s4"}
    # W4A4 int4 (native s4 mma on sm80-sm89) and block-scaled NVFP4 (sm120a), one each
    assert sorted(k.name for k in keys if k.spec.a_is_quantized) == [
        "gemm_dense_sm120a_mma-fp4_a-e2m1-g-e4m3_w-e2m1-g-e4m3_o-bf16_16x128x128_w1x4_s4",
        "gemm_dense_sm86_mma-ss_a-s4-k-f32_w-s4-g-f32_o-bf16_16x128x128_w1x4_s4",
    ]


def test_subset_and_explicit_tiles(tmp_path):
    catalog = _write_catalog_toml(tmp_path / "mine.toml", """
[[family]]
pairing = "wna16_uint_zero_point"
archs = ["sm89"]
a_dtype = ["float16"]
w_dtype = ["uint4"]
tiles = ["32x128x64_w1x2_s6", "16x128x64_w1x2_s8"]
""")
    enumeration = enumerate_catalog(catalog, ["sm89"])
    assert enumeration.catalog == "mine"
    assert [k.name for k in enumeration.keys] == [
        "gemm_dense_sm89_mma_a-f16_w-u4-g-f16-zpi_o-f16_16x128x64_w1x2_s8",
        "gemm_dense_sm89_mma_a-f16_w-u4-g-f16-zpi_o-f16_32x128x64_w1x2_s6",
    ]


def test_explicit_tile_over_the_limit_is_skipped(tmp_path):
    catalog = _write_catalog_toml(tmp_path / "big.toml", """
[[family]]
pairing = "wna16_int_symmetric"
archs = ["sm86"]
a_dtype = ["bfloat16"]
w_dtype = ["int4", "int8"]
tiles = ["128x256x64_w2x4_s3"]
""")
    enumeration = enumerate_catalog(catalog, ["sm86"])
    assert [k.spec.w_dtype for k in enumeration.keys] == ["int4"]
    assert [s.name.split("_")[5] for s in enumeration.skipped] == ["w-s8-g-bf16"]


def test_arch_where_every_tile_is_over_the_limit(tmp_path):
    catalog = _write_catalog_toml(tmp_path / "huge.toml", """
[[family]]
pairing = "wna16_int_symmetric"
archs = ["sm86"]
tiles = ["128x256x64_w2x4_s8"]
""")
    with pytest.raises(ValueError, match="every tile it lists there exceeds the shared-memory limit"):
        enumerate_keys(catalog, ["sm86"])


@pytest.mark.parametrize(
    "field",
    ["16x128x64_w1x2_s8", "128x256x64_w2x4_s3", "64x128x64_w2x2_s4", "wgmma:256x128x64_w1x8_s5",
     "wgmma:128x256x64_w1x16_s4"],
)
def test_parse_tile_field_round_trip(field):
    assert parse_tile_field(field).label == field


def test_wgmma_tile_field_sets_the_mma_kind():
    tile = parse_tile_field("wgmma:256x128x64_w1x8_s5")
    assert tile.mma is MmaKind.WGMMA and tile.threads == 256 and tile.field == "256x128x64_w1x8_s5"
    assert parse_tile_field("16x128x64_w1x2_s8").mma is MmaKind.MMA_SYNC


@pytest.mark.parametrize(
    "field",
    ["16x128_w1x2_s8", "16x128x64_w1x2", "16x128x64_w1x3_s8", "016x128x64_w1x2_s8",
     "mma:16x128x64_w1x2_s8",  # not canonical: the portable body has no prefix
     "tcgen05:128x128x64_w1x8_s5", "wgmma:16x128x64_w1x2_s4", "wgmma:256x128x64_w1x8_s2",
     "wgmma:256x128x64_w2x8_s4", "wgmma:256x256x64_w1x8_s4", "wgmma:192x128x64_w1x8_s4"],
)
def test_parse_tile_field_rejects(field):
    with pytest.raises(ValueError):
        parse_tile_field(field)


@pytest.mark.parametrize(
    "catalog,archs,match",
    [
        ("smokey", ["sm80"], "unknown catalog 'smokey': use one of default, dense, moe, smoke"),
        ("smoke", ["sm100a"], "catalog 'smoke' has no kernels for sm100a: it covers sm75, sm80, sm86, sm89, sm90a, sm100, sm110, sm120"),
        ("default", ["sm90"], "has no kernels for sm90: it covers"),
        ("smoke", ["sm91"], "arch 'sm91' is not a target"),
        ("smoke", [], "no arch given"),
    ],
)
def test_enumeration_errors(catalog, archs, match):
    with pytest.raises(ValueError, match=match):
        enumerate_keys(catalog, archs)


@pytest.mark.parametrize(
    "body,match",
    [
        ('[[family]]\npairing = "w4a4_magic"\n', "family 1: unknown pairing 'w4a4_magic': support.toml has"),
        ('[[family]]\npairing = "wna16_int_symmetric"\na_dtype = ["float8e4m3"]\n',
         "family 1: a_dtype \\['float8e4m3'\\] is not in pairing"),
        ('[[family]]\npairing = "wna16_int_symmetric"\ntiles = ["16x128x64"]\n', "family 1: tile '16x128x64'"),
        ('[[family]]\npairing = "wna16_int_symmetric"\narchs = ["sm75"]\n', "arch sm75 is not allowed by pairing"),
        ('[[family]]\npairing = "wna16_int_symmetric"\ntile = "table"\n', "unknown keys \\['tile'\\]"),
        ('', "has no \\[\\[family\\]\\] entries"),
        ('[[family]]\npairing = "wna16_int_symmetric_turing"\ngemm_type = ["masked"]\n',
         "gemm_type \\['masked'\\] is not allowed by pairing 'wna16_int_symmetric_turing' \\(it allows dense\\)"),
        ('[[family]]\npairing = "wna16_int_symmetric"\ngemm_type = ["sparse"]\n', "gemm_type must be a list of"),
        ('[[family]]\npairing = "wna16_int_symmetric"\ngemm_type = []\n', "gemm_type \\[\\] is not allowed"),
    ],
)
def test_catalog_file_errors(tmp_path, body, match):
    catalog = _write_catalog_toml(tmp_path / "bad.toml", body)
    with pytest.raises(ValueError, match=match):
        enumerate_keys(catalog, ["sm80"])


def test_the_moe_catalog_holds_every_tile_the_moe_schedules_pick():
    """The moe catalog (catalog/moe.toml): the grouped masked and contiguous kernels of every 16-bit pairing, for
    every tile heuristics.select_masked_tile picks for each (the masked one's wgmma-ws tiles on
    sm90a; M from 1 up, K that 256 or 128 does not divide, channel and group scales), the grouped
    masked kernels of the W4A8 and W8A8 pairings for every tile humming_aot.moe.a8 picks, and nothing
    else; the dense catalog holds none of them (a family's gemm_type defaults to dense), and the
    default catalog is the two together."""
    for arch in ("sm90a", "sm80", "sm120"):
        keys = enumerate_keys("moe", [arch])
        names = {key.name for key in keys}
        assert {key.spec.gemm_type for key in keys} == {GemmType.MASKED, GemmType.GROUPED}
        assert all(key.tile.mma in heuristics.moe_bodies(key.spec.gemm_type is GemmType.MASKED,
                                                         key.spec.a_is_quantized) for key in keys)
        dense_specs = {dataclasses.replace(key.spec, gemm_type=GemmType.DENSE) for key in keys}
        # (of the 8-bit-activation pairings, the W4A8 ones have the masked type; the W8A8 ones none)
        assert dense_specs == {dataclasses.replace(s, gemm_type=GemmType.DENSE)
                               for s in support.supported_specs(arch, GemmType.MASKED)}
        assert {k.spec for k in keys if k.spec.a_is_quantized} == {
            s for t in (GemmType.MASKED, GemmType.GROUPED) for s in support.supported_specs(arch, t) if s.a_is_quantized}
        for spec in support.supported_specs(arch, GemmType.MASKED):
            if spec.a_is_quantized:  # (W4A8, W8A8: the portable tiles moe.a8 picks; on sm90a the wgmma ones)
                w4 = spec.w_dtype in ("int4", "uint4", "float4e2m1")
                # sm90a: float8 W4A8 and channel-scaled W8A8 run the masked type on the wgmma bodies
                # (a8_launch.ws_takes); float8 W8A8 has no portable MoE kernels there (emulated e4m3)
                ws = arch == "sm90a" and (spec.a_dtype == "float8e4m3" if w4 else spec.w_scale.value != "b")
                portable = not (arch == "sm90a" and not w4 and spec.a_dtype == "float8e4m3")
                for m in (1, 16, 17, 32, 33, 64, 65, 4096):
                    tile = w4a8.select_sync_tile(m) if w4 else w8a8.select_sync_tile(min(m, W8A8_MAX_TILE_ROWS))
                    for gemm_type in (GemmType.MASKED, GemmType.GROUPED) if portable else ():
                        key = KernelKey(arch=arch, spec=dataclasses.replace(spec, gemm_type=gemm_type), tile=tile)
                        assert key.name in names, (spec, m)
                    if ws:
                        table = a8_launch.WS_TILES if w4 else a8_launch.W8A8_WS_TILES
                        key = KernelKey(arch=arch, spec=dataclasses.replace(spec, gemm_type=GemmType.MASKED),
                                        tile=w8a8.table_tile(table, m))
                        assert key.name in names, (spec, m, "ws")
                continue
            for m in (1, 5, 8, 9, 10, 16, 17, 32, 37, 64, 121, 200, 256, 257, 4096):
                for k, group in ((4096, 128), (4096 + 64, 64), (4096 + 128, 128), (2880, 32), (4096, 4096), (256, 128),
                                 (768, 64), (2048, 2048)):
                    for gemm_type in (GemmType.MASKED, GemmType.GROUPED):
                        tile = heuristics.select_masked_tile(arch, m, k, group, spec.w_bits,
                                                             masked=gemm_type is GemmType.MASKED,
                                                             zero_point=spec.w_zero_point is not ZeroPoint.NONE)
                        name = KernelKey(arch=arch, spec=dataclasses.replace(spec, gemm_type=gemm_type), tile=tile).name
                        assert name in names, f"{name} (m={m}, k={k}, group={group})"
    dense = enumerate_keys("dense", ["sm90a"])
    assert {key.spec.gemm_type for key in dense} == {GemmType.DENSE}
    default = {key.name for key in enumerate_keys("default", ["sm90a"])}
    assert default == {key.name for key in dense} | {key.name for key in enumerate_keys("moe", ["sm90a"])}


def test_catalog_includes(tmp_path):
    """A catalog file may include built-in catalogs by name (their families first, then its own);
    anything else, or a catalog including itself, is refused."""
    from humming_aot.enumerate import load_families

    own = tmp_path / "own.toml"
    own.write_text('schema_version = 1\ninclude = ["smoke"]\n\n[[family]]\npairing = "wna16_int_symmetric"\n'
                   'archs = ["sm80"]\ntiles = ["16x128x64_w1x2_s4"]\n')
    smoke = load_families("smoke")
    families = load_families(str(own))
    assert len(families) == len(smoke) + 1 and families[-1].archs == ("sm80",)
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\ninclude = ["other.toml"]\n')
    with pytest.raises(ValueError, match="include must list built-in catalogs"):
        load_families(str(bad))
    empty = tmp_path / "empty.toml"
    empty.write_text("schema_version = 1\ninclude = []\n")
    with pytest.raises(ValueError, match="has no \\[\\[family\\]\\] entries and includes no catalog"):
        load_families(str(empty))
    from humming_aot.distribution import default_catalog_archs

    assert default_catalog_archs() == ["sm75", "sm80", "sm86", "sm89", "sm90a", "sm100", "sm110", "sm120", "sm120a",
                                      "sm121a"]


# --- manifest ----------------------------------------------------------------------------------


def _fake_build(directory: Path, keys) -> dict[str, Path]:
    """Stand-in fatbins, one per build unit (aot.ninja.plan_units), whose bytes depend only on its
    keys' names."""
    (directory / "kernels").mkdir(parents=True, exist_ok=True)
    fatbins = {}
    for unit in plan_units(keys):
        path = directory / "kernels" / f"{unit.name}.fatbin"
        path.write_bytes(b"".join(hashlib.sha512(key.name.encode()).digest() * 8 for key in unit.keys))
        fatbins.update((key.name, path) for key in unit.keys)
    return fatbins


def _manifest(directory: Path, keys, catalog="default") -> dict:
    return build_manifest(keys=keys, fatbins=_fake_build(directory, keys), cuda_version="13.0",
                          toolkit=TOOLKIT, catalog=catalog, archs=sorted({k.arch for k in keys}))


def test_manifest_is_byte_identical_for_the_same_input(tmp_path):
    keys = enumerate_keys("default", ["sm80", "sm90a"])
    first = manifest_bytes(_manifest(tmp_path / "a", keys))
    second = manifest_bytes(_manifest(tmp_path / "b", list(reversed(keys))))
    assert first == second
    assert str(tmp_path).encode() not in first  # no absolute paths
    write_manifest(json.loads(first), tmp_path / "m.json")
    assert (tmp_path / "m.json").read_bytes() == first


def test_manifest_content(tmp_path):
    keys = enumerate_keys("smoke", ["sm89", "sm80"])
    manifest = _manifest(tmp_path, keys, catalog="smoke")
    assert manifest_problems(manifest) == []
    assert manifest["archs"] == ["sm80", "sm89"]
    assert manifest["cuda_version"] == "13.0" and manifest["toolkit"] == TOOLKIT
    assert list(manifest["kernels"]) == sorted(k.name for k in keys)
    unit_of = {key.name: unit.name for unit in plan_units(keys) for key in unit.keys}
    for key in keys:
        entry = manifest["kernels"][key.name]
        data = (tmp_path / entry["file"]).read_bytes()
        assert entry == {
            "file": f"kernels/{unit_of[key.name]}.fatbin",
            "sha256": hashlib.sha256(data).hexdigest(),
            "arch": key.arch,
            "toolkit": TOOLKIT,
            "smem_bytes": codegen.kernel_smem_bytes(key),
            "threads": key.tile.threads,
            "params_version": codegen.PARAMS_VERSION,
        }


def test_manifest_problems():
    assert manifest_problems([]) == ["the top level is not a JSON object"]
    assert "schema_version is 1, this humming_aot reads 2" in manifest_problems({"schema_version": 1})[0]
    bad = {"schema_version": 2, "kernels": {"k": {"file": "../../etc/passwd"}}}
    problems = manifest_problems(bad)
    assert any("missing field 'toolkit'" in p for p in problems)
    assert any("kernel 'k' lacks" in p for p in problems)
    entry = {"sha256": "a" * 64, "arch": "sm90a", "toolkit": "t", "smem_bytes": 0, "threads": 128, "params_version": 6}
    for path in ("../../etc/passwd", "kernels/../x.fatbin", "kernels/a/b.fatbin", "/abs/kernels/x.fatbin",
                 "kernels/x.cubin", "kernels/.fatbin", "kernels/x.fatbin\n", 7):
        problems = manifest_problems({"schema_version": 2, "kernels": {"k": {**entry, "file": path}}})
        assert any(f"kernel 'k' points at {path!r}" in p for p in problems), path
    shared = {"k1": {**entry, "file": "kernels/u.fatbin"}, "k2": {**entry, "file": "kernels/u.fatbin"}}
    assert not any("'k" in p for p in manifest_problems({"schema_version": 2, "kernels": shared}))
    shared["k2"] = {**entry, "file": "kernels/u.fatbin", "sha256": "b" * 64}
    assert any("kernel 'k2' gives 'kernels/u.fatbin' a sha256" in p
               for p in manifest_problems({"schema_version": 2, "kernels": shared}))


# --- run-time catalog --------------------------------------------------------------------------


@pytest.fixture
def catalog_dir(tmp_path, monkeypatch):
    keys = enumerate_keys("smoke", ["sm80", "sm90a"])
    directory = tmp_path / "cat"
    write_manifest(_manifest(directory, keys, catalog="smoke"), directory / MANIFEST_NAME)
    monkeypatch.setenv("HUMMING_AOT_CATALOG_DIR", str(directory))
    monkeypatch.setattr("humming_aot.catalog.PACKAGE_CATALOG_DIR", tmp_path / "no_package_catalog")
    monkeypatch.setattr("humming_aot.catalog.kernel_package_roots", lambda: [])
    installed_catalog.cache_clear()
    yield directory
    installed_catalog.cache_clear()


def test_catalog_lookup_and_read(catalog_dir):
    catalog = installed_catalog()
    assert catalog is installed_catalog()  # cached
    assert catalog.archs == ["sm80", "sm90a"]
    (name,) = catalog.keys_for("sm90a")
    key = KernelKey.from_name(name)
    entry = catalog.lookup(key.name)
    assert entry.arch == "sm90a" and entry.key == key and entry.cuda_version == "13.0"
    (unit,) = plan_units([key])
    assert entry.path == catalog_dir / "kernels" / f"{unit.name}.fatbin"
    assert catalog.read_image(key.name) == entry.path.read_bytes()
    assert catalog.lookup("gemm_nothing") is None
    assert catalog.keys_for("sm89") == []
    with pytest.raises(KeyError):
        catalog.read_image("gemm_nothing")


def test_corrupt_kernel_file_is_an_error_naming_file_and_hashes(catalog_dir):
    catalog = installed_catalog()
    (name,) = catalog.keys_for("sm80")
    key = KernelKey.from_name(name)
    entry = catalog.lookup(key.name)
    entry.path.write_bytes(b"not the kernel")
    with pytest.raises(CatalogIntegrityError) as info:
        catalog.read_image(key.name)
    message = str(info.value)
    assert str(entry.path) in message and entry.sha256 in message
    assert hashlib.sha256(b"not the kernel").hexdigest() in message
    entry.path.unlink()
    with pytest.raises(CatalogIntegrityError, match="cannot be read"):
        catalog.read_image(key.name)


def test_the_kernels_of_a_unit_file_share_its_entry_and_each_read_is_checked(tmp_path):
    keys = enumerate_keys("default", ["sm90a"])
    unit = next(u for u in plan_units(keys) if len(u.keys) >= 3)
    directory = tmp_path / "cat"
    write_manifest(_manifest(directory, list(unit.keys), catalog="default"), directory / MANIFEST_NAME)
    catalog = Catalog.from_dirs([directory])
    first, second, third = (catalog.lookup(key.name) for key in unit.keys[:3])
    assert first.path == second.path == third.path and first.sha256 == second.sha256
    assert catalog.read_image(first.name) == catalog.read_image(second.name) == first.path.read_bytes()
    first.path.write_bytes(b"replaced after the first read")
    with pytest.raises(CatalogIntegrityError, match="does not match the manifest"):
        catalog.read_image(third.name)  # (obtain.py reads a file once: kernels share its library)


def test_catalog_from_another_version_is_refused(catalog_dir):
    manifest = json.loads((catalog_dir / MANIFEST_NAME).read_text())
    manifest["package_version"] = "0.0.1"
    write_manifest(manifest, catalog_dir / MANIFEST_NAME)
    with pytest.raises(CatalogIntegrityError, match="built for humming_aot 0.0.1"):
        installed_catalog()


def test_catalog_package_from_another_version_names_the_pip_fix(tmp_path, monkeypatch):
    keys = enumerate_keys("smoke", ["sm80"])
    directory = tmp_path / "humming_aot_kernels" / "sm80_cu13"
    manifest = _manifest(directory, keys, catalog="smoke")
    manifest["package_version"] = "0.0.1"
    write_manifest(manifest, directory / MANIFEST_NAME)
    monkeypatch.delenv("HUMMING_AOT_CATALOG_DIR", raising=False)
    monkeypatch.setattr("humming_aot.catalog.PACKAGE_CATALOG_DIR", tmp_path / "no_package_catalog")
    monkeypatch.setattr("humming_aot.catalog.kernel_package_roots", lambda: [tmp_path / "humming_aot_kernels"])
    installed_catalog.cache_clear()
    try:
        with pytest.raises(CatalogIntegrityError,
                           match=rf"built for humming_aot 0.0.1, .*`pip install humming-aot-kernels-sm80-cu13=={__version__}`"):
            installed_catalog()
    finally:
        installed_catalog.cache_clear()


def test_malformed_manifest_is_refused(catalog_dir):
    (catalog_dir / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(CatalogIntegrityError, match="cannot read the catalog manifest"):
        installed_catalog()


def test_catalog_dir_without_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMMING_AOT_CATALOG_DIR", str(tmp_path))
    installed_catalog.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="has no manifest.json"):
            installed_catalog()
    finally:
        installed_catalog.cache_clear()


def test_first_directory_wins(tmp_path):
    keys = enumerate_keys("smoke", ["sm80"])
    for name in ("first", "second"):
        write_manifest(_manifest(tmp_path / name, keys), tmp_path / name / MANIFEST_NAME)
    catalog = Catalog.from_dirs([tmp_path / "first", tmp_path / "second"])
    assert len(catalog) == 1 and len(catalog.manifests) == 2
    assert catalog.lookup(keys[0].name).path.parent.parent == (tmp_path / "first").resolve()


def test_test_keys_tiers():
    full = test_keys("sm90a", "full")
    smoke = test_keys("sm90a", "smoke")
    assert full == enumerate_keys("dense", ["sm90a"])
    assert len(smoke) == len({k.spec for k in full}) == len(support.supported_specs("sm90a", GemmType.DENSE))
    for key in smoke:  # the smallest tile of each spec
        assert key.tile.block_m * key.tile.block_n == min(k.tile.block_m * k.tile.block_n for k in full
                                                          if k.spec == key.spec)
    assert smoke == sorted(smoke)
    assert test_keys("sm100a") == []
    with pytest.raises(ValueError, match="tier"):
        test_keys("sm90a", "medium")
