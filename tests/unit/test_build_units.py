"""Build units (aot.ninja.plan_units): a catalog build compiles a few kernels per nvcc run.

The plan is pure (no compiler): sizes, the groups a unit never spans (arch, compression), bounds
that follow the key names rather than their positions, names. With nvcc, one unit's fatbin holds
each of its kernels with its own metadata symbol (against the stand-in header of test_build_nvcc).
"""
from __future__ import annotations

import io
from collections import Counter

import pytest
from test_build_nvcc import int8_key, smoke_keys, write_stand_in

from humming_aot.aot import ninja as driver
from humming_aot.enumerate import enumerate_keys
from humming_aot.spec import KernelKey
from humming_aot.testing.nvcc import needs_nvcc


@pytest.fixture(scope="module")
def keys() -> list[KernelKey]:
    return enumerate_keys("default", ["sm80", "sm90a"])


def test_every_key_lands_in_one_unit_of_one_arch_and_one_storage(keys):
    units = driver.plan_units(list(reversed(keys)) + keys[:5])  # (order and repeats do not matter)
    assert units == driver.plan_units(keys)
    placed = Counter(key.name for unit in units for key in unit.keys)
    assert set(placed) == {key.name for key in keys} and set(placed.values()) == {1}
    for unit in units:
        assert len({key.arch for key in unit.keys}) == 1
        assert len({driver.key_compression(key, "auto") for key in unit.keys}) == 1
        assert list(unit.keys) == sorted(unit.keys)
        assert unit.name.startswith(f"{unit.keys[0].name}.{len(unit.keys)}k-")
    sizes = [len(unit.keys) for unit in units]
    assert max(sizes) == driver.UNIT_KERNELS * 3 // 2  # (the cap is reached somewhere in a catalog this big)
    assert 5 <= len(keys) / len(units) <= driver.UNIT_KERNELS  # about UNIT_KERNELS a unit on average
    assert len({unit.name for unit in units}) == len(units)


def test_a_key_added_or_removed_changes_only_nearby_units(keys):
    sm90a = [key for key in keys if key.arch == "sm90a"]
    before = {unit.name for unit in driver.plan_units(sm90a)}
    for drop in (sm90a[10], sm90a[len(sm90a) // 2], sm90a[-3]):
        after = {unit.name for unit in driver.plan_units([k for k in sm90a if k != drop])}
        assert 1 <= len(before - after) <= 3, drop.name  # its unit, and where a cap moved, the next one or two
    assert len(before) > 100


def test_plan_units_refuses_an_empty_unit_size(keys):
    with pytest.raises(ValueError, match="at least one kernel"):
        driver.plan_units(keys[:3], size=0)
    assert [len(u.keys) for u in driver.plan_units(keys[:3], size=1)] == [1, 1, 1]


@needs_nvcc
def test_keys_of_one_arch_share_a_fatbin_each_with_its_own_metadata(tmp_path):
    include = write_stand_in(tmp_path / "include")
    keys = [smoke_keys(["sm80"])[0], int8_key("sm80")]
    log = io.StringIO()
    result = driver.compile_keys(keys, tmp_path / "out", jobs=2, include_dir=include, stream=log)
    assert "compiling 2 kernels in 1 units with nvcc" in log.getvalue()
    (path,) = {result.fatbins[key.name] for key in keys}
    assert path.name.startswith(keys[0].name + ".2k-") and path.parent.name == "kernels"
    (entry,) = driver.read_fatbin(path.read_bytes())
    assert (entry.kind, entry.elf_sm) == (driver.KIND_ELF, 80)
    data = path.read_bytes()
    for key in keys:  # each kernel is its own symbol, and describes itself through its own metadata
        assert key.symbol.encode() + b"\0" in data and key.metadata_symbol.encode() + b"\0" in data
        assert key.name.encode() + b"\0" in data
