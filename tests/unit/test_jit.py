"""The NVRTC fallback on the CPU (NVRTC from the pip package nvidia-cuda-nvrtc; no GPU):

- NVRTC compiles the smoke tile for sm80, sm89, sm90a and sm120 into cubins with the same kernel
  and metadata symbols as the nvcc build of the same key (and, with matching releases, the same SASS);
- the disk cache: a second request is a hit, a corrupted entry is detected and rebuilt, the key
  covers every included header but no absolute path, 16 processes asking for one missing kernel
  compile it once;
- dispatch: catalog -> JIT, JIT preferred over another catalog tile, HUMMING_AOT_JIT=0 -> an error
  naming the key and the `humming-aot build` command.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from humming_aot import codegen, dispatch, heuristics, jit, kernels
from humming_aot.aot import ninja as driver
from humming_aot.catalog import Catalog, CatalogEntry
from humming_aot.enumerate import enumerate_keys
from humming_aot.jit import cache, nvrtc
from humming_aot.jit.cubin import STT_FUNC, STT_OBJECT, read_cubin
from humming_aot.spec import KernelKey, MmaKind, parse_arch

REPO = Path(__file__).resolve().parents[2]
SMOKE_TILE = "16x128x64_w1x2_s4"  # the smoke catalog's tile
JIT_ONLY_TILE = "16x128x64_w1x2_s3"  # in no catalog
ARCHS = ("sm80", "sm89", "sm90a", "sm120")


def bf16_int4_key(arch: str, tile: str = SMOKE_TILE) -> KernelKey:
    return KernelKey.from_name(f"gemm_dense_{arch}_mma_a-bf16_w-s4-g-bf16_o-bf16_{tile}")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """A private cache dir, JIT on, no HUMMING_AOT_* leaking in from the caller."""
    for name in ("HUMMING_AOT_JIT", "HUMMING_AOT_NVRTC", "HUMMING_AOT_CATALOG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path / "jit-cache"))
    yield


@pytest.fixture
def compiles(monkeypatch):
    """Counts NVRTC compiles in this process (a list of kernel names)."""
    names: list[str] = []
    original = nvrtc.Nvrtc.compile_cubin

    def counting(self, source, *, name, options):
        names.append(name)
        return original(self, source, name=name, options=options)

    monkeypatch.setattr(nvrtc.Nvrtc, "compile_cubin", counting)
    return names


# --- NVRTC ------------------------------------------------------------------------------------


def test_nvrtc_is_found_in_the_pip_package():
    found = nvrtc.find_nvrtc()
    assert found.source == "pip", f"expected the nvidia-cuda-nvrtc pip package, found {found}"
    lib = nvrtc.load_nvrtc()
    assert lib.version >= (13, 0)
    assert lib.version_string.startswith(f"{lib.version[0]}.{lib.version[1]}")
    assert {75, 80, 89, 90, 120} <= set(lib.supported_archs())
    ok, reason = jit.jit_available("sm90a")
    assert ok and str(lib.path) in reason


def test_nvrtc_override_accepts_the_file_or_its_directory(monkeypatch):
    path = nvrtc.find_nvrtc().library
    for value in (path, path.parent):
        monkeypatch.setenv("HUMMING_AOT_NVRTC", str(value))
        found = nvrtc.find_nvrtc()
        assert (found.source, found.library.resolve()) == ("HUMMING_AOT_NVRTC", path.resolve())


def test_missing_nvrtc_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(nvrtc, "_pip_nvidia_dirs", lambda: [])
    monkeypatch.setattr(nvrtc, "SYSTEM_CUDA_ROOTS", (tmp_path,))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    with pytest.raises(nvrtc.NvrtcNotFoundError) as error:
        nvrtc.find_nvrtc()
    assert "pip install nvidia-cuda-nvrtc" in str(error.value) and "CUDA_HOME" in str(error.value)
    assert str(tmp_path / "cuda" / "lib64") in str(error.value)
    ok, reason = jit.jit_available()
    assert not ok and "pip install nvidia-cuda-nvrtc" in reason
    monkeypatch.setenv("HUMMING_AOT_NVRTC", str(tmp_path / "nothing.so"))
    with pytest.raises(nvrtc.NvrtcNotFoundError, match="HUMMING_AOT_NVRTC=.*nothing.so"):
        nvrtc.find_nvrtc()


def test_compile_error_names_the_kernel_and_shows_the_log():
    lib = nvrtc.load_nvrtc()
    with pytest.raises(nvrtc.NvrtcCompileError) as error:
        lib.compile_cubin('#error "boom from the test"\n', name="gemm_broken", options=nvrtc.compile_options("sm80"))
    text = str(error.value)
    assert "gemm_broken" in text and "boom from the test" in text and "--gpu-architecture=sm_80" in text
    assert "boom from the test" in error.value.log


def test_a_broken_header_fails_with_the_key_name_and_publishes_nothing(tmp_path, compiles):
    include = tmp_path / "include"
    shutil.copytree(driver.find_include_dir(), include)
    types = include / "humming_aot" / "numerics" / "types.cuh"
    types.write_text(types.read_text() + "\nthis is not C++;\n")
    key = bf16_int4_key("sm80")
    with pytest.raises(nvrtc.NvrtcCompileError) as error:
        cache.obtain(key, include_dir=include, nvrtc_lib=nvrtc.load_nvrtc())
    assert key.name in str(error.value) and "types.cuh" in str(error.value)
    assert not list((tmp_path / "jit-cache").rglob("*.cubin"))


# --- NVRTC vs nvcc ------------------------------------------------------------------------------


def _nvcc_cubin(key: KernelKey, out: Path) -> bytes:
    """The nvcc build of ``key`` (the flags of build/ninja.py, -cubin instead of -fatbin)."""
    source = out / f"{key.name}.cu"
    source.write_text(codegen.kernel_source(key))
    flags = ["-cubin" if flag == "-fatbin" else flag for flag in driver.NVCC_FLAGS]
    cubin = out / f"{key.name}.cubin"
    subprocess.run(
        [str(driver.find_nvcc()), *flags, "-I", str(driver.find_include_dir()), *driver.nvcc_gencode(key.arch),
         "-o", str(cubin), str(source)],
        check=True, capture_output=True, text=True,
    )
    return cubin.read_bytes()


def _symbols(data: bytes, kind: int) -> set[str]:
    return {s.name for s in read_cubin(data).symbols.values() if s.type == kind}


def _nvcc_missing() -> bool:
    try:
        driver.find_nvcc()
    except driver.NvccNotFoundError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.skipif(_nvcc_missing(), reason="nvcc not found (set HUMMING_AOT_NVCC)")
@pytest.mark.parametrize(
    "key",
    [bf16_int4_key(arch) for arch in ARCHS]
    + [KernelKey.from_name("gemm_dense_sm90a_wgmma_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5"),
       KernelKey.from_name("gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5"),
       KernelKey.from_name("gemm_dense_sm89_mma_a-f16_w-e4m3-g-f16_o-f16_16x128x64_w1x2_s4"),
       KernelKey.from_name("gemm_dense_sm90a_mma_a-bf16_w-u4-g-bf16-zpf_o-bf16_16x128x256_w1x2_s2"),
       KernelKey.from_name("gemm_dense_sm90a_mma_a-bf16_w-s2-g-bf16_o-bf16_8x128x256_w1x2x4_s2"),
       KernelKey.from_name("gemm_dense_sm90a_mma-sw_a-bf16_w-s4-g-bf16_o-bf16_16x128x256_w1x2x4_s2"),
       KernelKey.from_name("gemm_masked_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2"),
       KernelKey.from_name("gemm_masked_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_176x256x64_w1x8_s3"),
       KernelKey.from_name("gemm_grouped_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2"),
       KernelKey.from_name("gemm_dense_sm80_simt_a-bf16_w-u4-g-bf16-zpi_o-bf16_8x64x16_w1x1_s1")],
    ids=str,
)
def test_nvrtc_cubin_matches_the_nvcc_build(key, tmp_path):
    arch = key.arch
    start = time.monotonic()
    result = jit.obtain_cubin(key)
    print(f"NVRTC compile of {key.name}: {time.monotonic() - start:.2f} s")
    assert result.compiled
    ours, theirs = read_cubin(result.data), read_cubin(_nvcc_cubin(key, tmp_path))
    number, _ = parse_arch(arch)
    assert ours.sm == theirs.sm == number  # e_flags; sm_90a / sm_120 as sm_90 / sm_120
    assert _symbols(result.data, STT_FUNC) == _symbols(theirs.data, STT_FUNC) == {key.symbol}
    assert key.metadata_symbol in _symbols(result.data, STT_OBJECT) & _symbols(theirs.data, STT_OBJECT)
    metadata = ours.symbol_bytes(key.metadata_symbol)
    assert metadata == theirs.symbol_bytes(key.metadata_symbol)
    assert kernels.parse_kernel_metadata(metadata, kernel=key.name).name == key.name
    # Same compiler release: an mma.sync kernel with one K warp has byte-identical SASS (so the GPU
    # output is too). The wgmma kernel, and mma.sync kernels whose K warps share the epilogue, are
    # scheduled differently by NVRTC and nvcc 13.0.88 (the same code, other instruction choices);
    # tests/gpu/test_jit_gpu.py compares the two builds' outputs bitwise on the GPU.
    lib, toolkit = nvrtc.load_nvrtc(), driver.nvcc_info().toolkit
    if lib.release and f"V{lib.release}" in toolkit and key.tile.mma is MmaKind.MMA_SYNC and key.tile.warps_k == 1:
        text = f".text.{key.symbol}"
        assert ours.section_bytes(text) == theirs.section_bytes(text), f"SASS differs from {toolkit}"


# --- the disk cache -------------------------------------------------------------------------------


def test_second_request_is_a_cache_hit(compiles):
    key = bf16_int4_key("sm89")
    first = jit.obtain_cubin(key)
    second = jit.obtain_cubin(key)
    assert (first.compiled, second.compiled) == (True, False)
    assert compiles == [key.name]
    assert first.data == second.data == jit.compile_kernel(key) == first.path.read_bytes()
    assert first.path.parent == Path(os.environ["HUMMING_AOT_CACHE_DIR"]) / "kernels" / "sm89"
    sidecar = json.loads(first.path.with_suffix(".json").read_text())
    assert sidecar["sha256"] == hashlib.sha256(first.data).hexdigest() and sidecar["name"] == key.name
    assert compiles == [key.name]
    assert not list((first.path.parents[2] / "tmp").iterdir())  # private dirs are cleaned up


def _corrupt(kind: str, path: Path) -> None:
    sidecar = path.with_suffix(".json")
    data = bytearray(path.read_bytes())
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "flipped byte":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif kind == "garbage sidecar":
        sidecar.write_text("{not json")
    elif kind == "cubin missing":
        path.unlink()
    elif kind == "another kernel, consistent sidecar":
        other = jit.compile_kernel(bf16_int4_key("sm80", "32x128x64_w1x2_s6"))
        path.write_bytes(other)
        meta = json.loads(sidecar.read_text())
        meta.update(size=len(other), sha256=hashlib.sha256(other).hexdigest())
        sidecar.write_text(json.dumps(meta))
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["truncated", "flipped byte", "garbage sidecar", "cubin missing", "another kernel, consistent sidecar"]
)
def test_corrupted_cache_entry_is_detected_and_rebuilt(kind, compiles, caplog):
    key = bf16_int4_key("sm80")
    first = jit.obtain_cubin(key)
    _corrupt(kind, first.path)
    compiles.clear()
    with caplog.at_level(logging.WARNING, logger="humming_aot.jit"):
        again = jit.obtain_cubin(key)
    assert again.compiled and compiles == [key.name]
    assert again.data == again.path.read_bytes()
    jit.check_cubin(again.data, key)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "is bad" in warnings[0] and key.name in warnings[0], warnings
    assert jit.obtain_cubin(key).compiled is False


def test_cache_key_covers_headers_options_and_version_but_no_paths(tmp_path):
    key = bf16_int4_key("sm90a")
    source = codegen.kernel_source(key)
    copies = []
    for name in ("a", "b"):
        shutil.copytree(driver.find_include_dir(), tmp_path / name)
        copies.append(tmp_path / name)
    headers = cache.include_closure(source, copies[0])
    paths = [path for path, _ in headers]
    assert "humming_aot/kernel/dense_mma_sync.cuh" in paths and "humming_aot/numerics/types.cuh" in paths
    assert cache.include_closure(source, copies[1]) == headers

    def digest(include=copies[0], options=nvrtc.compile_options("sm90a"), version="13.0 (13.0.88)"):
        return cache.cache_key(name=key.name, source=source, headers=cache.include_closure(source, include),
                               options=options, nvrtc_version=version)

    base = digest()
    assert digest(include=copies[1]) == base  # another absolute path, same content
    deep = copies[1] / "humming_aot" / "numerics" / "types.cuh"  # reached only through other headers
    deep.write_text(deep.read_text() + "// edited\n")
    assert digest(include=copies[1]) != base
    assert digest(options=nvrtc.compile_options("sm89")) != base
    assert digest(version="13.0 (13.0.48)") != base


def test_cache_dir_inside_the_package_is_refused(monkeypatch):
    package = Path(jit.__file__).resolve().parent.parent
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(package / "jit_cache"))
    with pytest.raises(cache.CacheDirError, match="inside the installed humming_aot package"):
        jit.compile_kernel(bf16_int4_key("sm80"))


_WORKER = """
import hashlib, json, logging, os, sys, time
logging.basicConfig(level=logging.INFO, format="%(process)d %(name)s: %(message)s")
from humming_aot import jit
from humming_aot.spec import KernelKey
key = KernelKey.from_name(sys.argv[1])
open(sys.argv[2], "w").close()  # ready
while not os.path.exists(sys.argv[3]):  # go
    time.sleep(0.002)
result = jit.obtain_cubin(key)
jit.check_cubin(result.data, key)  # what a load checks, without a GPU
print(json.dumps({"sha256": hashlib.sha256(result.data).hexdigest(), "compiled": result.compiled}))
"""


@pytest.mark.slow
def test_sixteen_processes_compile_a_missing_kernel_once(tmp_path):
    key = bf16_int4_key("sm90a", JIT_ONLY_TILE)
    processes = 16
    flags = tmp_path / "flags"
    flags.mkdir()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, key.name, str(flags / f"ready{i}"), str(flags / "go")],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(processes)
    ]
    deadline = time.monotonic() + 120
    while len(list(flags.glob("ready*"))) < processes and time.monotonic() < deadline:
        time.sleep(0.01)
    (flags / "go").touch()  # every worker is past its imports: they ask at the same moment
    outputs = [worker.communicate(timeout=120) for worker in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    logs = "".join(err for _, err in outputs)
    compiled_lines = [line for line in logs.splitlines() if f"compiled {key.name} in" in line]
    print(f"{processes} processes: {sum(r['compiled'] for r in results)} compiled, "
          f"{logs.count('waiting for another process')} waited on the lock; {compiled_lines}")
    assert sum(r["compiled"] for r in results) == 1 and len(compiled_lines) == 1, logs
    assert logs.count(f"humming_aot.jit: compiling {key.name}") == 1
    (cubin,) = (tmp_path / "jit-cache" / "kernels" / "sm90a").glob("*.cubin")
    assert {r["sha256"] for r in results} == {hashlib.sha256(cubin.read_bytes()).hexdigest()}


# --- dispatch -------------------------------------------------------------------------------------

FAKE_H200 = dispatch.DeviceInfo(
    index=0, name="Fake H200", capability=(9, 0), num_sms=132, smem_per_sm=233472, arches=("sm90a", "sm90")
)


def _catalog_of(keys: list[KernelKey], tmp_path: Path) -> Catalog:
    entries = {}
    for key in keys:
        entries[key.name] = CatalogEntry(
            name=key.name, path=tmp_path / f"{key.name}.fatbin", sha256="0" * 64, arch=key.arch,
            toolkit="Cuda compilation tools, release 13.0, V13.0.88", cuda_version="13.0",
            smem_bytes=codegen.kernel_smem_bytes(key), threads=key.tile.threads,
            params_version=codegen.PARAMS_VERSION,
        )
    return Catalog((), entries)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """dispatch on a fake H200 whose installed catalog holds only the table's decode tile (M = 1);
    loads are recorded."""
    smoke = bf16_int4_key("sm90a", heuristics.select_tile("sm90a", 1).field)
    catalog = _catalog_of([smoke], tmp_path)
    monkeypatch.setattr(dispatch, "device_info", lambda index: FAKE_H200)
    monkeypatch.setattr("humming_aot.catalog.installed_catalog", lambda: catalog)
    monkeypatch.setattr(dispatch, "_selected", {})
    kernels.clear_loaded_kernels()
    loads = []

    def fake_load(image, *, name, expected, device, image_digest=None):
        image = image() if callable(image) else image  # (the catalog hands a reader of its file)
        loads.append({"image": image, "name": name, "expected": expected, "device": device, "digest": image_digest})
        return kernels.LoadedKernel(name=name, library=0, kernel=0, threads=expected["threads"] if isinstance(
            expected, dict) else expected.threads, smem_bytes=0, params_bytes=104, device=device)

    monkeypatch.setattr(kernels, "load_kernel_image", fake_load)
    yield smoke, loads
    kernels.clear_loaded_kernels()


def _spec():
    return bf16_int4_key("sm90a").spec


def test_jit_serves_a_kernel_the_catalog_lacks(fake_gpu, compiles):
    smoke, loads = fake_gpu
    key, loaded = dispatch.obtain(_spec(), 0, 300)  # the table's tile for M=300 is not in the catalog
    # JIT preferred over the smoke tile
    assert key.tile == heuristics.select_tile("sm90a", 300) != smoke.tile and key.arch == "sm90a"
    assert compiles == [key.name] and loaded.name == key.name
    (load,) = loads
    jit.check_cubin(load["image"], key)
    assert load["expected"]["threads"] == key.tile.threads
    assert load["expected"]["smem_bytes"] == codegen.kernel_smem_bytes(key)
    assert dispatch.obtain(_spec(), 0, 300) == (key, loaded) and len(loads) == 1  # in-memory from now on


def test_catalog_kernel_is_used_without_compiling(fake_gpu, compiles, monkeypatch):
    smoke, loads = fake_gpu
    monkeypatch.setattr("humming_aot.catalog.Catalog.read_image", lambda self, name: b"fatbin of " + name.encode())
    key, _ = dispatch.obtain(_spec(), 0, 1)
    assert key == smoke and compiles == []
    assert loads[0]["image"] == b"fatbin of " + smoke.name.encode()
    from humming_aot.catalog import installed_catalog  # (the manifest's sha256 keys the shared library)

    assert loads[0]["digest"] == installed_catalog().lookup(smoke.name).sha256


def test_jit_off_falls_back_to_a_catalog_tile(fake_gpu, compiles, monkeypatch):
    smoke, _ = fake_gpu
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    monkeypatch.setattr("humming_aot.catalog.Catalog.read_image", lambda self, name: b"fatbin")
    key, _ = dispatch.obtain(_spec(), 0, 100)
    assert key == smoke and compiles == []


def test_jit_off_names_the_missing_key_and_the_default_build_command(fake_gpu, monkeypatch):
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    # in the default catalog (the table's tile for M = 100), not in the installed one
    key = KernelKey(arch="sm90a", spec=_spec(), tile=heuristics.select_tile("sm90a", 100))
    with pytest.raises(dispatch.KernelNotAvailableError) as error:
        dispatch.obtain(_spec(), 0, 100, tile=key.tile)
    text = str(error.value)
    assert key.name in text and "Fake H200" in text and "HUMMING_AOT_JIT=0" in text
    assert "`humming-aot build --arch sm90a --catalog default`" in text


def test_jit_off_outside_the_default_catalog_says_how_to_add_the_tile(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    key = bf16_int4_key("sm90a", JIT_ONLY_TILE)
    with pytest.raises(dispatch.KernelNotAvailableError) as error:
        dispatch.obtain(_spec(), 0, 1, tile=key.tile)
    text = str(error.value)
    assert key.name in text and "HUMMING_AOT_JIT=0" in text
    assert "humming-aot build --arch sm90a --catalog my_kernels.toml" in text
    # the catalog lines in the message build exactly this key
    lines = [line.strip() for line in text.splitlines() if line.startswith("    ")]
    catalog_file = tmp_path / "my_kernels.toml"
    catalog_file.write_text("\n".join(lines) + "\n")
    assert enumerate_keys(str(catalog_file), ["sm90a"]) == [key]


def test_no_catalog_and_no_nvrtc_is_one_clear_error(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr("humming_aot.catalog.installed_catalog", lambda: None)
    monkeypatch.setenv("HUMMING_AOT_NVRTC", str(tmp_path / "missing"))
    with pytest.raises(dispatch.KernelNotAvailableError) as error:
        dispatch.obtain(_spec(), 0, 1)
    text = str(error.value)
    assert "no kernel catalog is installed" in text and "HUMMING_AOT_NVRTC" in text
    assert "humming-aot build --arch sm90a --catalog default" in text
