"""Wheel assembly: names, determinism, RECORD; and (slow) build -> fresh venv -> import -> list."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from humming_aot._version import __version__
from humming_aot.aot import wheel

REPO = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    """The environment for child processes, without anything pointing at the checkout."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HUMMING_AOT_") and k != "PYTHONPATH"}


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


def test_version_tag_and_filename():
    assert wheel.local_version("13.0", ["sm90a"]) == f"{__version__}+cu130.sm90a"
    assert wheel.local_version("13.0", ["sm90a", "sm89", "sm120", "sm89"]) == f"{__version__}+cu130.sm89.sm90a.sm120"
    tag = wheel.wheel_tag()
    assert tag.startswith(f"cp{sys.version_info.major}{sys.version_info.minor}-")
    assert wheel.wheel_filename("0.1.0+cu130.sm90a", "cp311-cp311-linux_x86_64") == \
        "humming_aot-0.1.0+cu130.sm90a-cp311-cp311-linux_x86_64.whl"


def test_write_wheel_is_deterministic_and_recorded(tmp_path):
    source = tmp_path / "lib.so"
    source.write_bytes(b"\x7fELF fake")
    files = {"humming_aot/z.py": b"z = 1\n", "humming_aot/a.py": b"a = 1\n", "humming_aot/_C.so": source}
    first = wheel.write_wheel(files, tmp_path / "one", version="0.1.0+cu130.sm80", tag="cp311-cp311-linux_x86_64")
    second = wheel.write_wheel(dict(reversed(files.items())), tmp_path / "two", version="0.1.0+cu130.sm80",
                               tag="cp311-cp311-linux_x86_64")
    assert first.read_bytes() == second.read_bytes()
    names = _check_record(first)
    dist_info = "humming_aot-0.1.0+cu130.sm80.dist-info"
    assert names == [
        "humming_aot/_C.so", "humming_aot/a.py", "humming_aot/z.py",
        f"{dist_info}/METADATA", f"{dist_info}/WHEEL", f"{dist_info}/entry_points.txt",
        f"{dist_info}/top_level.txt", f"{dist_info}/RECORD",
    ]
    with zipfile.ZipFile(first) as zf:
        assert "Root-Is-Purelib: false" in zf.read(f"{dist_info}/WHEEL").decode()
        assert "Tag: cp311-cp311-linux_x86_64" in zf.read(f"{dist_info}/WHEEL").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        assert "Version: 0.1.0+cu130.sm80" in metadata and "Requires-Dist: torch>=2.4" in metadata
        assert "humming-aot = humming_aot.cli:main" in zf.read(f"{dist_info}/entry_points.txt").decode()
        assert zf.getinfo("humming_aot/_C.so").external_attr >> 16 == 0o100755


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


@pytest.mark.slow
def test_smoke_wheel_installs_into_a_fresh_venv(tmp_path):
    work = tmp_path / "work"  # a cwd outside the checkout
    work.mkdir()
    env = _clean_env()
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from humming_aot.cli import main; sys.exit(main())",
         "build", "--arch", "sm80", "--catalog", "smoke", "-j", "2", "--out", str(tmp_path / "dist")],
        cwd=work, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr + build.stdout
    (path,) = (tmp_path / "dist").glob("*.whl")
    release = re.search(r" with CUDA (\d+)\.(\d+) in ", build.stdout)  # the CUDA release the build compiled with
    assert release, build.stdout
    cuda_tag = f"cu{release.group(1)}{release.group(2)}"
    assert path.name == f"humming_aot-{__version__}+{cuda_tag}.sm80-{wheel.wheel_tag()}.whl"
    assert "built 1 kernel (sm80: 1)" in build.stdout and f"{path.stat().st_size:,} bytes" in build.stdout
    per_arch = re.search(r"^  sm80: 1 kernel, ([\d,]+) bytes of fatbins, ([\d.]+) nvcc-seconds$", build.stdout, re.M)
    assert per_arch, build.stdout
    assert 10_000 < int(per_arch.group(1).replace(",", "")) < path.stat().st_size * 4
    assert float(per_arch.group(2)) > 0
    names = _check_record(path)
    assert "humming_aot/_catalog/manifest.json" in names
    assert any(n.startswith("humming_aot/_C.") and n.endswith(".so") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(path)],
                   check=True, cwd=work, env=env)

    def run(*args: str) -> str:
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stdout

    location = run(str(python), "-c", "import humming_aot, humming_aot._C; print(humming_aot.__file__)")
    assert location.strip().startswith(str(venv))
    listing = run(str(venv / "bin" / "humming-aot"), "list")
    assert "sm80: 1 kernel" in listing
    assert "gemm_dense_sm80_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2_s4" in listing
    # every image in the installed catalog verifies against its manifest
    run(str(python), "-c", "from humming_aot.catalog import installed_catalog as c; "
                           "[c().read_image(n) for n in c().entries]")
