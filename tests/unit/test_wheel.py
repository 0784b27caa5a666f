"""Wheel assembly: names, extras, determinism, RECORD, the simple index (tests/unit/test_distribution.py
builds, installs and resolves real ones)."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import sys
import zipfile
from pathlib import Path

from humming_aot import distribution
from humming_aot._version import __version__
from humming_aot.aot import index, wheel


def _check_record(path: Path) -> list[str]:
    """Every entry is listed in RECORD with its right hash and size; returns the entry names."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        assert [r[0] for r in rows] == names  # same order, nothing missing
        for name, digest, size in rows:
            if name == record_name:
                assert digest == size == ""
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data), name
    return names


def test_names_tags_and_filenames():
    assert distribution.kernel_dist_name("sm90a", 13) == "humming-aot-kernels-sm90a-cu13"
    assert distribution.kernel_dir_name("sm90a", 13) == "sm90a_cu13"
    assert distribution.parse_kernel_dir_name("sm120_cu12") == ("sm120", 12)
    assert distribution.parse_kernel_dir_name("__pycache__") is None
    assert distribution.cuda_major("13.0") == 13
    tag = wheel.wheel_tag()
    assert tag.startswith(f"cp{sys.version_info.major}{sys.version_info.minor}-")
    meta = wheel.kernel_wheel_metadata("sm89", "13.0")
    assert meta.filename == f"humming_aot_kernels_sm89_cu13-{__version__}-py3-none-any.whl"
    assert meta.dist_info == f"humming_aot_kernels_sm89_cu13-{__version__}.dist-info"
    assert wheel.core_wheel_metadata().filename == f"humming_aot-{__version__}-{tag}.whl"


def test_core_extras_pin_every_default_catalog_arch():
    archs = distribution.default_catalog_archs()
    assert archs == ["sm75", "sm80", "sm86", "sm89", "sm90a", "sm100", "sm110", "sm120", "sm120a", "sm121a"]
    extras = distribution.core_extras("1.2.3", archs)
    assert extras["sm89"] == ["humming-aot-kernels-sm89-cu13==1.2.3"]
    assert extras["all"] == [f"humming-aot-kernels-{a}-cu13==1.2.3" for a in archs]
    assert {"test", "build", "jit"} <= set(extras)
    requires = wheel.core_wheel_metadata().requires
    assert f'humming-aot-kernels-sm90a-cu13=={__version__}; extra == "sm90a"' in requires
    assert "torch>=2.4" in requires


def test_write_wheel_is_deterministic_and_recorded(tmp_path):
    source = tmp_path / "lib.so"
    source.write_bytes(b"\x7fELF fake")
    files = {"humming_aot/z.py": b"z = 1\n", "humming_aot/a.py": b"a = 1\n", "humming_aot/_C.so": source}
    meta = wheel.WheelMetadata(name="humming_aot", version="0.1.0", tag="cp311-cp311-linux_x86_64", purelib=False,
                               requires=("torch>=2.4",), console_scripts=("humming-aot = humming_aot.cli:main",))
    first = wheel.write_wheel(files, tmp_path / "one", meta)
    second = wheel.write_wheel(dict(reversed(files.items())), tmp_path / "two", meta)
    assert first.read_bytes() == second.read_bytes()
    names = _check_record(first)
    dist_info = "humming_aot-0.1.0.dist-info"
    assert names == [
        "humming_aot/_C.so", "humming_aot/a.py", "humming_aot/z.py",
        f"{dist_info}/METADATA", f"{dist_info}/WHEEL", f"{dist_info}/entry_points.txt",
        f"{dist_info}/top_level.txt", f"{dist_info}/RECORD",
    ]
    with zipfile.ZipFile(first) as zf:
        assert "Root-Is-Purelib: false" in zf.read(f"{dist_info}/WHEEL").decode()
        assert "Tag: cp311-cp311-linux_x86_64" in zf.read(f"{dist_info}/WHEEL").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        assert "Version: 0.1.0" in metadata and "Requires-Dist: torch>=2.4" in metadata
        assert "humming-aot = humming_aot.cli:main" in zf.read(f"{dist_info}/entry_points.txt").decode()
        assert zf.getinfo("humming_aot/_C.so").external_attr >> 16 == 0o100755


def test_simple_index_lists_every_wheel_with_its_hash(tmp_path):
    meta = wheel.kernel_wheel_metadata("sm89", "13.0")
    one = wheel.write_wheel({"humming_aot_kernels/sm89_cu13/manifest.json": b"{}\n"}, tmp_path / "a", meta)
    two = wheel.write_wheel({"humming_aot/__init__.py": b""}, tmp_path / "b", wheel.core_wheel_metadata())
    index_dir = tmp_path / "index"
    index.add_to_index(index_dir, [one])
    assert index.add_to_index(index_dir, [two]) == [  # a second build adds to the index
        index_dir / "humming-aot" / two.name, index_dir / "humming-aot-kernels-sm89-cu13" / one.name]
    root = (index_dir / "index.html").read_text()
    assert '<a href="humming-aot/">' in root and '<a href="humming-aot-kernels-sm89-cu13/">' in root
    page = (index_dir / "humming-aot-kernels-sm89-cu13" / "index.html").read_text()
    assert f'href="{one.name}#sha256={hashlib.sha256(one.read_bytes()).hexdigest()}"' in page


def test_package_files_leave_out_build_products():
    files = wheel.package_files()
    assert "humming_aot/__init__.py" in files and "humming_aot/cli.py" in files
    for name in files:
        assert "__pycache__" not in name and not name.endswith((".pyc", ".so"))
        assert not name.startswith(("humming_aot/_catalog/", "humming_aot/include/", "humming_aot/catalog_files/"))


def test_data_files_carry_headers_and_catalog_data():
    files = wheel.data_files()
    assert "humming_aot/catalog_files/support.toml" in files
    assert "humming_aot/include/humming_aot/kernel/dense_mma_sync.cuh" in files
