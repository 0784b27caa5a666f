"""How the build stores each kernel's fatbin (humming-aot build --fatbin-compression, aot.ninja's
FATBIN_COMPRESSION): compressed or as nvcc writes it, per kernel under auto."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from test_build_nvcc import smoke_keys, write_stand_in

from humming_aot.aot import ninja as driver
from humming_aot.enumerate import enumerate_keys
from humming_aot.spec import GemmType
from humming_aot.testing.nvcc import needs_nvcc


@needs_nvcc
def test_size_compression_stores_compressed_cubins_and_rebuilds_on_change(tmp_path):
    """--fatbin-compression size: every fatbin holds its arch's cubin compressed (the target check
    still passes), the same bytes twice; going back to none rebuilds every fatbin (ninja keeps
    each output's command)."""
    include = write_stand_in(tmp_path / "include")
    keys = smoke_keys(["sm80", "sm90a"])
    out = tmp_path / "out"
    runs = [driver.compile_keys(keys, d, jobs=2, include_dir=include, stream=io.StringIO(), compression="size")
            for d in (out, tmp_path / "again")]
    assert "--compress-mode=size" in (out / "build.ninja").read_text()
    for key in keys:
        data = runs[0].fatbins[key.name].read_bytes()
        (entry,) = driver.read_fatbin(data)
        assert entry.compressed and entry.elf_sm is None and entry.arch == key.arch
        assert data == runs[1].fatbins[key.name].read_bytes()
    log = io.StringIO()
    plain = driver.compile_keys(keys, out, jobs=2, include_dir=include, stream=log, compression="none")
    assert "[2/2]" in log.getvalue() and "--compress-mode" not in (out / "build.ninja").read_text()
    assert not any(e.compressed for k in keys for e in driver.read_fatbin(plain.fatbins[k.name].read_bytes()))


def test_compression_flags_refuse_unknown_modes_and_old_nvcc():
    assert driver.compression_flags("none", "11.8") == ()
    assert driver.compression_flags("size", "13.0") == ("--compress-mode=size",)
    assert driver.compression_flags("size", "12.8") == ("--compress-mode=size",)
    with pytest.raises(ValueError, match="needs nvcc's --compress-mode .CUDA 12.8 or later.; this nvcc is CUDA 12.6"):
        driver.compression_flags("size", "12.6")
    with pytest.raises(ValueError, match="fatbin compression 'zstd': choose one of none, size, auto"):
        driver.compression_flags("zstd", "13.0")
    assert driver.compression_flags("auto", "13.0") == ("--compress-mode=size",)
    assert driver.compression_flags("auto", "12.6") == ()  # auto compresses nothing there, and says nothing


def test_auto_compression_stores_the_grouped_and_uncommon_format_kernels_compressed(tmp_path):
    """--fatbin-compression auto (the default): the grouped row-expert form's kernels and those of
    weight formats outside PLAIN_W_DTYPES (int1, 5-7-bit codes, the other small floats) get nvcc's
    --compress-mode=size on their own build lines; every other kernel's command is what "none"
    writes, so that switching a build directory between the two recompiles only the compressed ones."""
    keys = enumerate_keys("default", ["sm80"])
    plain = [k for k in keys if k.spec.w_dtype in driver.PLAIN_W_DTYPES]
    packed = [k for k in plain if k.spec.gemm_type is GemmType.GROUPED][:1]
    packed += [k for k in keys if k.spec.w_dtype == "float5e2m2" and k.spec.gemm_type is not GemmType.GROUPED][:1]
    others = [k for k in plain if k.spec.gemm_type is not GemmType.GROUPED][:3]
    assert len(packed) == 2 and len(others) == 3
    assert {k.spec.w_dtype for k in keys} > driver.PLAIN_W_DTYPES  # every plain format is a real one
    assert {driver.key_compression(k, "auto") for k in packed} == {"size"}
    assert {driver.key_compression(k, "auto") for k in others} == {"none"}
    for key in packed + others:  # the other two choices treat every kernel alike
        assert (driver.key_compression(key, "none"), driver.key_compression(key, "size")) == ("none", "size")
    texts = {}
    units = driver.plan_units(packed + others)  # (the same under every choice)
    unit_of = {key.name: f"kernels/{unit.name}.fatbin" for unit in units for key in unit.keys}
    assert len({unit_of[k.name] for k in packed} & {unit_of[k.name] for k in others}) == 0
    for mode in ("none", "auto"):
        flags = driver.compression_flags(mode, "13.0")
        compressed = frozenset(k.name for k in packed + others if driver.key_compression(k, mode) == "size")
        path = driver.write_build_files(units, tmp_path / mode, nvcc=Path("/usr/bin/nvcc"),
                                        include_dir=tmp_path, extra_flags=flags, compressed=compressed)
        texts[mode] = path.read_text().replace(str(tmp_path / mode), "")
    blocks = {mode: {block.split(":", 1)[0]: block for block in text.split("\nbuild ")[1:]} for mode, text in texts.items()}
    for key in others:
        block = blocks["auto"][unit_of[key.name]]
        assert "compress-mode" not in block and block == blocks["none"][unit_of[key.name]]
    for key in packed:
        assert "  nvcc_flags = -fatbin -O3 -std=c++17 --expt-relaxed-constexpr --compress-mode=size" in \
            blocks["auto"][unit_of[key.name]]
    packed_units = len({unit_of[k.name] for k in packed})
    assert texts["none"].count("compress-mode") == 0 and texts["auto"].count("compress-mode") == packed_units
    with pytest.raises(ValueError, match="mixes compressed and plain kernels"):
        driver.write_build_files([driver.BuildUnit(name="u", keys=(packed[0], others[0]))], tmp_path / "mixed",
                                 nvcc=Path("/usr/bin/nvcc"), include_dir=tmp_path, extra_flags=flags,
                                 compressed=frozenset({packed[0].name}))
