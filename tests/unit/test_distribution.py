"""The distributions end to end (slow: nvcc, the launcher build, pip installs into fresh venvs).

- `humming-aot build --index DIR` for sm89 and sm90a: pip, given `humming_aot[sm89]`, installs the
  sm89 catalog and not the sm90a one; `humming_aot[sm89,sm90a]` gets both; two builds of the same
  catalog (and the core) give byte-identical wheels.
- An sdist of the core installs into a fresh venv, and `humming-aot build` run from that install
  makes an installable catalog package.
- tools/quickstart.sh passes in a venv (the demo takes the CPU path without a GPU).

Every venv sees the test interpreter's packages (torch, pip, setuptools, pybind11) and nothing
else: pip runs with no configuration file, and the only index is the one the build wrote.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from humming_aot._version import __version__
from humming_aot.aot import wheel

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMOKE_SM89 = "gemm_dense_sm89_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2_s4"


def _env() -> dict[str, str]:
    """Child environment: nothing pointing at the checkout, and pip without site configuration."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HUMMING_AOT_", "PIP_")) and k != "PYTHONPATH"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(*args, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env or _env(), capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _venv(path: Path) -> Path:
    """A fresh venv that sees this interpreter's packages (pip, torch, setuptools, pybind11) after its
    own; returns its python. Not --system-site-packages: made from a venv's interpreter (CI's
    /opt/py311), that would show the base interpreter's packages instead of this one's."""
    _run(sys.executable, "-m", "venv", "--without-pip", path, cwd=path.parent)
    python = path / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=path).strip())
    ours = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    (purelib / "_outer_site_packages.pth").write_text("".join(f"{d}\n" for d in ours))
    return python


def _build_from_checkout(work: Path, *args) -> str:
    return _run(sys.executable, "-m", "humming_aot", "build", "--catalog", "smoke", "-j", "2", *args,
                cwd=work, env={**_env(), "PYTHONPATH": str(REPO)})


def _installed_catalogs(python: Path) -> list[str]:
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=python.parent))
    root = Path(str(site).strip()) / "humming_aot_kernels"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_index_lets_pip_pick_the_catalog_and_builds_are_reproducible(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    index = tmp_path / "index"
    out = _build_from_checkout(work, "--arch", "sm89", "--arch", "sm90a", "--out", tmp_path / "dist",
                               "--build-dir", tmp_path / "build", "--index", index)
    assert f"index: {index} (pip install --index-url file://{index} 'humming_aot[sm89,sm90a]')" in out
    names = {p.name for p in index.glob("*/*.whl")}
    assert names == {f"humming_aot_kernels_sm89_cu13-{__version__}-py3-none-any.whl",
                     f"humming_aot_kernels_sm90a_cu13-{__version__}-py3-none-any.whl",
                     f"humming_aot-{__version__}-{wheel.wheel_tag()}.whl"}

    # the same catalog again, from nothing (the launcher too): the same bytes
    _build_from_checkout(work, "--arch", "sm89", "--arch", "sm90a", "--out", tmp_path / "again",
                         "--build-dir", tmp_path / "build_again", "--index", tmp_path / "index_again")
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "dist" / name).read_bytes(), name

    for extras, wanted in (("sm89", ["sm89_cu13"]), ("sm89,sm90a", ["sm89_cu13", "sm90a_cu13"])):
        python = _venv(tmp_path / f"venv_{extras.replace(',', '_')}")
        pip = [python, "-m", "pip", "install", "-q", "--index-url", index.as_uri()]
        # The core from the index into the venv, over the base interpreter's own humming_aot (an
        # editable checkout in CI) that pip would otherwise count as installed.
        _run(*pip, "--no-deps", "--force-reinstall", "humming_aot", cwd=work)
        _run(*pip, f"humming_aot[{extras}]", cwd=work)
        assert _installed_catalogs(python) == wanted
        location = _run(python, "-c", "import humming_aot, humming_aot._C; print(humming_aot.__file__)", cwd=work)
        assert location.startswith(str(python.parent.parent))
        listing = _run(python.parent / "humming-aot", "list", cwd=work)
        assert f"package humming-aot-kernels-sm89-cu13: catalog 'smoke' for sm89 in {python.parent.parent}" in listing
        assert f"sm89: 1 kernel\n  {SMOKE_SM89}\n" in listing
        assert ("sm90a: 1 kernel" in listing) == ("sm90a" in extras)
        info = _run(python.parent / "humming-aot", "info", cwd=work)
        assert "  8.9: sm89, humming-aot-kernels-sm89-cu13: installed" in info
        # every image verifies against its manifest
        _run(python, "-c", "from humming_aot.catalog import installed_catalog as c; "
                           "[c().read_image(n) for n in c().entries]", cwd=work)


def test_sdist_installs_and_builds_a_catalog_package(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    sdist_dir = tmp_path / "sdist"
    # python -m build --sdist --no-isolation, without the `build` package: the same PEP 517 hook
    name = _run(sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(sdist_dir)!r}))",
                cwd=REPO).strip().splitlines()[-1]
    sdist = sdist_dir / name
    assert sdist.name == f"humming_aot-{__version__}.tar.gz"
    python = _venv(tmp_path / "venv")
    _run(python, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", "--no-deps", sdist, cwd=work)
    humming_aot = python.parent / "humming-aot"
    out = _run(humming_aot, "build", "--arch", "sm89", "--catalog", "smoke", "-j", "2", "--out", tmp_path / "dist",
               "--build-dir", tmp_path / "build", cwd=work)
    assert "built 1 kernel (sm89: 1)" in out
    (package,) = (tmp_path / "dist").glob("*.whl")
    assert package.name == f"humming_aot_kernels_sm89_cu13-{__version__}-py3-none-any.whl"
    _run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", package, cwd=work)
    listing = _run(humming_aot, "list", cwd=work)
    assert f"package humming-aot-kernels-sm89-cu13: catalog 'smoke' for sm89 in {tmp_path / 'venv'}" in listing
    assert f"  {SMOKE_SM89}\n" in listing
    location = _run(python, "-c", "import humming_aot.aot.ninja as n; print(n.find_include_dir())", cwd=work)
    assert location.startswith(str(tmp_path / "venv"))  # the build compiled the installed headers


def test_quickstart_passes_in_a_venv(tmp_path):
    python = _venv(tmp_path / "venv")
    out = _run("bash", REPO / "tools" / "quickstart.sh", "sm90a", cwd=tmp_path,
               env={**_env(), "PYTHON": str(python), "QUICKSTART_DIR": str(tmp_path / "quickstart")})
    assert _installed_catalogs(python) == ["sm90a_cu13"]
    assert f"package humming-aot-kernels-sm90a-cu13: catalog 'smoke' for sm90a in {tmp_path / 'venv'}" in out
    assert "matches float64 reference" in out
