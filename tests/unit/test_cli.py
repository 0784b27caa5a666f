"""`humming-aot` argument and user errors (one line, exit 2), list/info output, and env.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from humming_aot import cli, env
from humming_aot.aot import ninja as driver
from humming_aot.catalog import installed_catalog
from humming_aot.enumerate import enumerate_keys
from humming_aot.manifest import MANIFEST_NAME, build_manifest, write_manifest


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    for name in env.VARIABLES:
        if name.startswith("HUMMING_AOT_"):
            monkeypatch.delenv(name, raising=False)
    installed_catalog.cache_clear()
    monkeypatch.setattr("humming_aot.catalog.PACKAGE_CATALOG_DIR", Path("/nonexistent/_catalog"))
    monkeypatch.setattr("humming_aot.catalog.kernel_package_roots", lambda: [])
    yield
    installed_catalog.cache_clear()


def run_cli(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "argv,fragments",
    [
        ([], ["required: command"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'"]),
        (["build"], ["humming-aot build: error", "--arch"]),
        (["build", "--arch", "sm91"], ["arch 'sm91' is not a target", "sm90a"]),
        (["build", "--arch", "hopper"], ["'hopper' is not a CUDA target name"]),
        (["build", "--arch", "sm70"], ["arch 'sm70' is not a target"]),
        (["build", "--arch", "sm80", "--catalog", "tiny"], ["unknown catalog 'tiny'"]),
        (["build", "--arch", "sm80", "-j", "0"], ["-j '0' is not a positive number"]),
        (["build", "--arch", "sm80", "-j", "many"], ["-j 'many'"]),
        (["list", "--verbose"], ["unrecognized arguments: --verbose"]),
        (["build", "--arch", "sm80", "--inplace", "--index", "idx"], ["--inplace writes no wheels", "--index"]),
        (["build", "--arch", "sm80", "--fatbin-compression", "zstd"], ["--fatbin-compression", "invalid choice"]),
    ],
)
def test_argument_errors(capsys, argv, fragments):
    code, out, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *fragments)


def test_nvcc_missing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(driver, "DEFAULT_CUDA_ROOTS", ())
    code, out, err = run_cli(capsys, "build", "--arch", "sm80", "--catalog", "smoke", "--out", str(tmp_path))
    assert_one_line_error(code, err, "nvcc not found", "HUMMING_AOT_NVCC")


def test_nvcc_override_not_executable(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_AOT_NVCC", str(tmp_path / "no-nvcc"))
    code, out, err = run_cli(capsys, "build", "--arch", "sm80", "--catalog", "smoke", "--out", str(tmp_path))
    assert_one_line_error(code, err, f"HUMMING_AOT_NVCC={tmp_path / 'no-nvcc'} is not an executable file")


def test_compile_failure_exits_1_with_nvcc_output(capsys, monkeypatch):
    def failing_build(**kwargs):
        raise driver.CompileError("nvcc failed for gemm_x:\nsrc/gemm_x.cu(1): error: boom")

    monkeypatch.setattr("humming_aot.aot.wheel.build", failing_build)
    code, out, err = run_cli(capsys, "build", "--arch", "sm80")
    assert code == 1
    assert "nvcc failed for gemm_x" in err and "error: boom" in err and "Traceback" not in err


def test_build_passes_the_fatbin_compression(capsys, monkeypatch):
    seen = []

    def recorded_build(**kwargs):
        seen.append(kwargs["compression"])
        raise driver.CompileError("stop here")

    monkeypatch.setattr("humming_aot.aot.wheel.build", recorded_build)
    run_cli(capsys, "build", "--arch", "sm90a", "--fatbin-compression", "size")
    run_cli(capsys, "build", "--arch", "sm90a", "--fatbin-compression", "none")
    run_cli(capsys, "build", "--arch", "sm90a")
    assert seen == ["size", "none", "auto"]


def test_bad_env_values(capsys, monkeypatch):
    monkeypatch.setenv("HUMMING_AOT_JIT", "yes")
    code, out, err = run_cli(capsys, "info")
    assert_one_line_error(code, err, "HUMMING_AOT_JIT='yes' is not '0' or '1'")
    monkeypatch.setenv("HUMMING_AOT_LOG_LEVEL", "LOUD")
    code, out, err = run_cli(capsys, "list")
    assert_one_line_error(code, err, "HUMMING_AOT_LOG_LEVEL='LOUD' is not a log level")


def test_list_without_catalog(capsys):
    code, out, err = run_cli(capsys, "list")
    assert code == 0 and "no kernel catalog is installed" in out
    code, out, err = run_cli(capsys, "list", "--json")
    assert code == 0 and json.loads(out) == {"archs": {}, "catalogs": []}


@pytest.fixture
def catalog_dir(tmp_path, monkeypatch):
    keys = enumerate_keys("smoke", ["sm80", "sm90a"])
    (tmp_path / "kernels").mkdir()
    fatbins = {}
    for key in keys:
        fatbins[key.name] = tmp_path / "kernels" / f"{key.name}.fatbin"
        fatbins[key.name].write_bytes(key.name.encode())
    manifest = build_manifest(keys=keys, fatbins=fatbins, cuda_version="13.0", toolkit="Cuda compilation tools, "
                              "release 13.0, V13.0.88", catalog="smoke", archs=["sm80", "sm90a"])
    write_manifest(manifest, tmp_path / MANIFEST_NAME)
    monkeypatch.setenv("HUMMING_AOT_CATALOG_DIR", str(tmp_path))
    return keys


def test_list_with_catalog(capsys, catalog_dir):
    code, out, err = run_cli(capsys, "list")
    assert code == 0
    assert "catalog 'smoke'" in out and "2 kernels, CUDA 13.0" in out
    assert "sm80: 1 kernel\n" in out and "sm90a: 1 kernel\n" in out
    for key in catalog_dir:
        assert f"  {key.name}\n" in out
    code, out, err = run_cli(capsys, "list", "--json")
    data = json.loads(out)
    assert data["archs"] == {key.arch: [key.name] for key in catalog_dir}
    assert data["catalogs"][0]["cuda_version"] == "13.0"


def test_info_without_gpu(capsys, catalog_dir):
    code, out, err = run_cli(capsys, "info")
    assert code == 0
    assert "catalog: 2 kernels for sm80, sm90a (CUDA 13.0)" in out
    import torch

    if not torch.cuda.is_available():
        assert "GPU: no CUDA GPU visible" in out
    assert "JIT: enabled" in out


def test_list_and_info_name_installed_catalog_packages(capsys, monkeypatch, tmp_path):
    """Catalog packages on sys.path (humming_aot_kernels/<arch>_cu<major>/) are found side by side."""
    for arch in ("sm89", "sm120"):
        directory = tmp_path / "humming_aot_kernels" / f"{arch}_cu13"
        keys = enumerate_keys("smoke", [arch])
        (directory / "kernels").mkdir(parents=True)
        fatbins = {k.name: directory / "kernels" / f"{k.name}.fatbin" for k in keys}
        for key in keys:
            fatbins[key.name].write_bytes(key.name.encode())
        write_manifest(build_manifest(keys=keys, fatbins=fatbins, cuda_version="13.0", toolkit="t", catalog="smoke",
                                      archs=[arch]), directory / MANIFEST_NAME)
    (tmp_path / "humming_aot_kernels" / "__pycache__").mkdir()  # not a catalog
    monkeypatch.undo()  # drop the autouse fixture's empty kernel_package_roots
    for name in env.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("humming_aot.catalog.PACKAGE_CATALOG_DIR", Path("/nonexistent/_catalog"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path), *sys.path])
    installed_catalog.cache_clear()
    code, out, err = run_cli(capsys, "list")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("package humming-aot-kernels-sm89-cu13: catalog 'smoke' for sm89 in ")
    assert lines[1].startswith("package humming-aot-kernels-sm120-cu13: catalog 'smoke' for sm120 in ")
    assert "sm89: 1 kernel" in out and "sm120: 1 kernel" in out
    code, out, err = run_cli(capsys, "info")
    assert "  humming-aot-kernels-sm89-cu13: sm89, 1 kernel" in out
    assert "  8.9: sm89, humming-aot-kernels-sm89-cu13: installed" in out
    assert "  12.1: sm120 (sm120 SASS runs on 12.1), humming-aot-kernels-sm120-cu13: installed" in out
    assert ("  10.3: sm100 (sm100 SASS runs on 10.3), humming-aot-kernels-sm100-cu13: not installed: "
            "pip install 'humming_aot[sm100]'") in out
    assert "  9.0: sm90a, humming-aot-kernels-sm90a-cu13: not installed" in out


def test_python_dash_m(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "humming_aot", "--version"], cwd=repo,
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("humming_aot ")


# --- env.py ------------------------------------------------------------------------------------


def test_env_defaults():
    assert env.jit_enabled() is True
    assert env.cache_dir() == Path("~/.cache/humming_aot").expanduser()
    assert env.catalog_dirs() == []
    assert env.nvcc_override() is None
    assert env.log_level() == 30
    assert env.pdl_enabled() is True


def test_env_values(monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HUMMING_AOT_CATALOG_DIR", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.setenv("HUMMING_AOT_LOG_LEVEL", "debug")
    assert env.jit_enabled() is False
    assert env.cache_dir() == tmp_path / "cache"
    assert env.catalog_dirs() == [tmp_path / "a", tmp_path / "b"]
    assert env.log_level() == 10
    monkeypatch.setenv("HUMMING_AOT_JIT", "")  # empty means unset
    assert env.jit_enabled() is True


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("1", True), ("true", True), ("on", True), ("On", True), ("", True),
     ("0", False), ("false", False), ("off", False), ("OFF", False)],
)
def test_env_pdl_switch(monkeypatch, value, enabled):
    monkeypatch.setenv("HUMMING_AOT_PDL", value)
    assert env.pdl_enabled() is enabled


@pytest.mark.parametrize("value", ["yes", "2", "disable", " 0"])
def test_env_pdl_refuses_other_values(monkeypatch, value):
    monkeypatch.setenv("HUMMING_AOT_PDL", value)
    with pytest.raises(ValueError, match=f"HUMMING_AOT_PDL={value!r} is not one of 0/false/off or 1/true/on") as caught:
        env.pdl_enabled()
    assert "set it to '0'" in str(caught.value)  # says what to do


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("", True), ("ON", True), ("0", False), ("off", False)])
def test_env_clusters_switch(monkeypatch, value, enabled):
    monkeypatch.setenv("HUMMING_AOT_CLUSTERS", value)
    assert env.clusters_enabled() is enabled


def test_env_clusters_refuses_other_values(monkeypatch):
    monkeypatch.setenv("HUMMING_AOT_CLUSTERS", "2")
    with pytest.raises(ValueError, match="HUMMING_AOT_CLUSTERS='2' is not one of 0/false/off or 1/true/on") as caught:
        env.clusters_enabled()
    assert "set it to '0'" in str(caught.value)


def test_every_variable_is_documented():
    for name, value, is_set, doc in env.describe():
        assert name.startswith("HUMMING_AOT_") or name == "CUDA_HOME"
        assert len(doc) > 40
    assert {"HUMMING_AOT_CATALOG_DIR", "HUMMING_AOT_JIT", "HUMMING_AOT_CACHE_DIR", "HUMMING_AOT_NVCC",
            "HUMMING_AOT_LOG_LEVEL", "HUMMING_AOT_PDL", "HUMMING_AOT_CLUSTERS"} <= set(env.VARIABLES)


def test_only_env_reads_os_environ():
    package = Path(cli.__file__).resolve().parent
    readers = sorted(
        str(p.relative_to(package)) for p in package.rglob("*.py")
        if "os.environ" in p.read_text() or "os.getenv" in p.read_text()
    )
    assert readers == ["env.py"]


# --- doctor ------------------------------------------------------------------------------------


def test_doctor_reports_nvrtc_headers_cache_and_jit(capsys, monkeypatch, tmp_path):
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(cache_dir))
    code, out, err = run_cli(capsys, "doctor")
    assert code == 0, err
    assert "NVRTC: 13." in out and "libnvrtc.so" in out and "(from pip;" in out
    assert f"headers: {driver.find_include_dir()} (" in out
    assert f"JIT cache: {cache_dir} (not created yet" in out
    assert "JIT: allowed (HUMMING_AOT_JIT=1) and ready" in out
    assert "catalog: none installed" in out
    import torch

    if not torch.cuda.is_available():
        assert "GPU: no CUDA GPU visible" in out
    (cache_dir / "kernels" / "sm80").mkdir(parents=True)
    (cache_dir / "kernels" / "sm80" / "k.cubin").write_bytes(b"\0" * 2048)
    code, out, err = run_cli(capsys, "doctor")
    assert f"JIT cache: {cache_dir} (1 kernel, 2.0 KiB;" in out


def test_doctor_reports_problems_and_still_exits_0(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_AOT_NVRTC", str(tmp_path / "no_nvrtc"))
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    code, out, err = run_cli(capsys, "doctor")
    assert code == 0, err
    assert "NVRTC: not found: HUMMING_AOT_NVRTC=" in out
    assert "JIT: off (HUMMING_AOT_JIT=0)" in out
    monkeypatch.setenv("HUMMING_AOT_JIT", "maybe")
    code, out, err = run_cli(capsys, "doctor")
    assert code == 0 and "JIT: HUMMING_AOT_JIT='maybe' is not '0' or '1'" in out
