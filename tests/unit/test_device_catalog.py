"""tools/device_catalog.sh's carried catalog wheel, as tools/device_check.sh's catalog step takes it:
the shared stamp (tools/device_lib.sh) follows the kernel sources, a wheel whose stamp matches
the tree becomes the in-place catalog without a build, and one of other sources is named and left.

The step runs in a copy of the tree (it writes humming_aot/_catalog), with a small wheel made here in
the catalog packages' layout; nothing is compiled."""
from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The parts of the checkout the stamp and the catalog step read."""
    copy = tmp_path / "repo"
    ignore = shutil.ignore_patterns("_catalog", "__pycache__", "*.so", "*.pyc")
    for part in ("csrc", "catalog", "humming_aot"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    (copy / "tools").mkdir()
    for script in ("device_check.sh", "device_lib.sh"):
        shutil.copy2(ROOT / "tools" / script, copy / "tools" / script)
    return copy


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DEVICE_", "HUMMING_AOT_DEVICE_", "PYTEST_ARGS"))}
    env.update(extra)
    return env


def _stamp(tree: Path, catalog: str = "dense", **extra: str) -> str:
    out = subprocess.run(["bash", "-c", f"source tools/device_lib.sh; catalog_stamp {catalog}"], cwd=tree,
                         env=_env(ARCH="sm90a", CATALOG=catalog, **extra), capture_output=True, text=True, check=True)
    stamp = out.stdout.strip()
    assert len(stamp) == 64 and int(stamp, 16) >= 0, out
    return stamp


def _wheel(tree: Path, stamp: str) -> Path:
    """A catalog wheel in the layout `humming-aot build` writes: humming_aot_kernels/<arch>_cu<N>/."""
    wheel = tree / ".whl" / "catalog" / "humming_aot_kernels_sm90a_cu13-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("humming_aot_kernels/sm90a_cu13/manifest.json", '{"kernels": {}}')
        z.writestr("humming_aot_kernels/sm90a_cu13/kernels/k.fatbin", b"\x01\x02")
        z.writestr("humming_aot_kernels/sm90a_cu13/helpers/h.fatbin", b"\x03")
        z.writestr("humming_aot_kernels_sm90a_cu13-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    (wheel.parent / (wheel.name + ".stamp")).write_text(stamp + "\n")
    return wheel


def _catalog_step(tree: Path, out: Path, **extra: str) -> str:
    subprocess.run(["bash", "tools/device_check.sh", str(out)], cwd=tree,
                   env=_env(DEVICE_STEPS="catalog", **extra), capture_output=True, text=True, timeout=300)
    return (out / "build.log").read_text()


def test_the_stamp_follows_the_kernel_sources_and_the_build_arguments(tree):
    first = _stamp(tree)
    assert _stamp(tree) == first
    assert _stamp(tree, "default") != first
    assert _stamp(tree, DEVICE_BUILD_ARGS="--fatbin-compression none") != first
    header = next((tree / "csrc").rglob("*.cuh"))
    header.write_text(header.read_text() + "\n// changed\n")
    assert _stamp(tree) != first


def test_a_wheel_of_the_same_sources_becomes_the_in_place_catalog(tree, tmp_path):
    stamp = _stamp(tree)
    _wheel(tree, stamp)
    log = _catalog_step(tree, tmp_path / "out")
    assert "unpacked from the carried wheel" in log, log
    catalog = tree / "humming_aot" / "_catalog"
    assert (catalog / "manifest.json").read_text() == '{"kernels": {}}'
    assert (catalog / "kernels" / "k.fatbin").read_bytes() == b"\x01\x02"
    assert (catalog / "helpers" / "h.fatbin").read_bytes() == b"\x03"
    assert (catalog / ".device_check_stamp").read_text().strip() == stamp
    assert "humming_aot build" not in log and "catalog build" not in log, log
    # a second call keeps it (the warm box's path), still without a build
    assert "kept, built on this box" in _catalog_step(tree, tmp_path / "out2"), log


def test_a_wheel_of_other_sources_is_named_and_the_box_builds(tree, tmp_path):
    _wheel(tree, "0" * 64)
    # a build argument humming-aot rejects at once: the step's build path runs and fails fast here
    log = _catalog_step(tree, tmp_path / "out", DEVICE_BUILD_ARGS="--no-such-option")
    assert "its .stamp differs): not used" in log, log
    assert "catalog build (sm90a, dense" in log, log
    assert not (tree / "humming_aot" / "_catalog" / "manifest.json").exists()
