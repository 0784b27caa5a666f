"""The portable 8-bit-activation bodies on the host: W8A8's mma-ss (kernel/dense_mma_ss.cuh,
humming_aot/bodies/mma_ss.py) and W4A8's mma-w4a8 (kernel/dense_mma_w4a8.cuh, bodies/mma_w4a8.py):
which tiles and keys they take and why not, their catalog families, the generated source, and
(with nvcc) that each arch's build compiles and runs the mma it should: s8 IMMA from sm80, e4m3
QMMA natively on sm89 and sm120 (the GPU runs: tests/gpu/test_w8a8_mma_ss_gpu.py,
tests/gpu/test_w4a8_mma_gpu.py)."""
from __future__ import annotations

import io
import shutil
import subprocess

import pytest
import torch

from humming_aot import codegen, w4a8, w8a8
from humming_aot.aot import ninja as driver
from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.spec import KernelKey
from humming_aot.testing.nvcc import needs_nvcc


def test_the_table_tiles_are_mma_ss_ones_for_every_m():
    labels = [w8a8.select_sync_tile(m).label for m in (1, 16, 17, 32, 33, 64, 65, 8192)]
    assert labels == ["mma-ss:16x128x128_w1x4_s4"] * 2 + ["mma-ss:32x128x128_w1x4_s4"] * 2 + \
        ["mma-ss:64x128x128_w2x2_s4"] * 2 + ["mma-ss:128x128x128_w2x4_s3"] * 2
    for _, label in w8a8._SYNC_TILES:  # every ring fits the 99 KB a block takes on sm86 / sm89 / sm120
        tile = parse_tile_field(label)
        assert tile.body.smem_bytes(tile, 8, False) <= 101376 - 1024


@pytest.mark.parametrize("label,message", [
    ("mma-ss:16x128x64_w1x4_s4", "stages 128 K"),
    ("mma-ss:16x128x128_w2x4_s4", "multiple of 16 \\* warps_m"),
    ("mma-ss:16x96x128_w1x4_s4", "pairs of n8"),
    ("mma-ss:16x128x128_w1x4x2_s4", "not K"),
    ("mma-ss:16x128x128_w1x4_s1", "at least 2"),
    ("mma-ss:256x256x128_w2x2_s2", "accumulators per thread"),
])
def test_tiles_it_cannot_run_say_why(label, message):
    with pytest.raises(ValueError, match=message):
        parse_tile_field(label)


def test_keys_name_the_arch_each_element_needs():
    tile = parse_tile_field("mma-ss:64x128x128_w2x2_s4")
    for arch in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120"):
        assert w8a8.kernel_key(arch, torch.bfloat16, tile, False, "int8").arch == arch
    with pytest.raises(ValueError, match="float8e4m3 codes needs sm89 or later, not sm86"):
        w8a8.kernel_key("sm86", torch.bfloat16, tile, False, "float8e4m3")
    # DeepSeek-V3's block scales: float8 only, a warp's channels inside one 128-channel block
    assert w8a8.kernel_key("sm89", torch.bfloat16, tile, True, "float8e4m3").spec.w_scale.value == "b"
    with pytest.raises(ValueError, match="inside one 128-channel block"):
        w8a8.kernel_key("sm89", torch.bfloat16, parse_tile_field("mma-ss:32x192x128_w1x4_s2"), True)
    # e4m3 holds its K tile's sums apart from the fp32 accumulators: twice the registers of s8
    wide = parse_tile_field("mma-ss:128x128x128_w2x2_s2")
    assert w8a8.kernel_key("sm80", torch.bfloat16, wide, False, "int8")
    with pytest.raises(ValueError, match="float8e4m3 accumulators per thread"):
        w8a8.kernel_key("sm89", torch.bfloat16, wide, False, "float8e4m3")


def test_the_default_catalog_holds_the_table_per_arch_and_element():
    table = {label for _, label in w8a8._SYNC_TILES}
    names = {"s8": "int8", "e4m3": "float8e4m3", "s4": "int4"}  # (s4: W4A4 on every arch from sm80)
    for arch, elements in (("sm80", {"s8", "s4"}), ("sm86", {"s8", "s4"}), ("sm89", {"s8", "e4m3", "s4"}),
                           ("sm120", {"s8", "e4m3", "s4"}), ("sm100", {"s8", "e4m3", "s4"}),
                           ("sm110", {"s8", "e4m3", "s4"}), ("sm90a", {"s4"}), ("sm75", set())):
        keys = [k for k in enumerate_keys("default", [arch])
                if k.tile.mma.value == "mma-ss" and k.spec.gemm_type.value == "dense"]
        assert {k.spec.a_dtype for k in keys} == {names[e] for e in elements}, arch
        assert {k.tile.label for k in keys} == (table if elements else set()), arch
        scalings = len(elements) + ("e4m3" in elements)  # (float8 in two scalings: channel, blocks)
        assert len(keys) == len(table) * scalings * 2, arch  # both output dtypes


def test_the_generated_source_names_the_sync_codes_and_the_scaled_params():
    key = KernelKey.from_name("gemm_dense_sm89_mma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-f16_32x128x128_w1x4_s4")
    source = codegen.kernel_source(key)
    assert "DenseMmaSs<" in source and "humming_aot::mma::E4m3SyncCodes" in source
    assert "ScaledTmaGemmParams params" in source and f"Kernel::kSmemBytes == {4 * 160 * 128}" in source
    assert KernelKey.from_name(key.name) == key


def test_the_w4a8_table_and_its_tiles():
    labels = [w4a8.select_sync_tile(m).label for m in (1, 16, 17, 32, 33, 64, 65, 8192)]
    assert labels == ["mma-w4a8:16x128x128_w1x4_s4"] * 2 + ["mma-w4a8:32x128x128_w1x4_s4"] * 2 + \
        ["mma-w4a8:64x128x128_w2x4_s4"] * 2 + ["mma-w4a8:128x64x128_w4x2_s4"] * 2
    for _, label in w4a8._SYNC_TILES:
        tile = parse_tile_field(label)
        assert tile.body.smem_bytes(tile, 4, False) <= 101376 - 1024
    for label, message in (("mma-w4a8:16x96x128_w1x2_s4", "whole 64-channel units"),
                           ("mma-w4a8:64x128x128_w2x2_s4", "at most 32 tokens x 32 channels"),
                           ("mma-w4a8:8x128x128_w1x4_s4", "pairs of n8"),
                           ("mma-w4a8:16x128x64_w1x4_s4", "one packed K tile")):
        with pytest.raises(ValueError, match=message):
            parse_tile_field(label)


def test_w4a8_keys_take_int8_from_sm80_and_float8_from_sm89():
    tile = parse_tile_field("mma-w4a8:32x128x128_w1x4_s4")
    for arch in ("sm80", "sm86", "sm89", "sm90a", "sm120"):
        assert w4a8.kernel_key(arch, torch.bfloat16, tile, "int8").arch == arch
    assert w4a8.kernel_key("sm89", torch.float16, tile).spec.a_dtype == "float8e4m3"
    with pytest.raises(ValueError, match="float8e4m3 codes needs sm89 or later, not sm86"):
        w4a8.kernel_key("sm86", torch.bfloat16, tile)
    key = w4a8.kernel_key("sm80", torch.bfloat16, tile, "int8")
    source = codegen.kernel_source(key)
    assert "DenseMmaW4a8<" in source and "humming_aot::mma::S8SyncCodes" in source
    assert KernelKey.from_name(key.name) == key
    # the default catalog: int8 activations from sm80 (sm90a too), float8 ones where wgmma is not,
    # with int4 and uint4 (zero points) weights and (float8 activations) MXFP4 ones
    int8 = {("int8", "int4"), ("int8", "uint4")}
    float8 = {("float8e4m3", "int4"), ("float8e4m3", "uint4"), ("float8e4m3", "float4e2m1")}
    for arch, pairs in (("sm80", int8), ("sm90a", int8), ("sm75", set()), ("sm89", int8 | float8),
                        ("sm120", int8 | float8)):
        keys = [k for k in enumerate_keys("default", [arch])
                if k.tile.mma.value == "mma-w4a8" and k.spec.gemm_type.value == "dense"]
        assert {(k.spec.a_dtype, k.spec.w_dtype) for k in keys} == pairs, arch
        assert len(keys) == len(w4a8._SYNC_TILES) * len(pairs) * 2, arch


_SASS = {  # key -> the mma its SASS must hold
    "gemm_dense_sm80_mma-ss_a-s8-k-f32_w-s8-g-f32_o-bf16_64x128x128_w2x2_s4": "IMMA.16832.S8.S8",
    "gemm_dense_sm89_mma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-bf16_16x128x128_w1x4_s4": "QMMA.16832.F32.E4M3.E4M3",
    "gemm_dense_sm120_mma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-f16_128x128x128_w2x4_s3": "QMMA.16832.F32.E4M3.E4M3",
    "gemm_dense_sm120_mma-ss_a-s8-k-f32_w-s8-g-f32_o-bf16_32x128x128_w1x4_s4": "IMMA.16832.S8.S8",
    "gemm_dense_sm89_mma-ss_a-e4m3-g-f32_w-e4m3-b-f32_o-bf16_64x128x128_w2x2_s4": "QMMA.16832.F32.E4M3.E4M3",
    "gemm_dense_sm80_mma-w4a8_a-s8-k-f32_w-s4-g-f32_o-bf16_64x128x128_w2x4_s4": "IMMA.16832.S8.S8",
    "gemm_dense_sm89_mma-w4a8_a-e4m3-k-f32_w-s4-g-f32_o-f16_16x128x128_w1x4_s4": "QMMA.16832.F32.E4M3.E4M3",
    "gemm_dense_sm120_mma-w4a8_a-e4m3-k-f32_w-s4-g-f32_o-bf16_128x64x128_w4x2_s4": "QMMA.16832.F32.E4M3.E4M3",
    "gemm_dense_sm89_mma-w4a8_a-e4m3-k-f32_w-e2m1-g-ue8m0_o-bf16_32x128x128_w1x4_s4": "QMMA.16832.F32.E4M3.E4M3",
    # W4A4 (int4 x int4 on mma-ss): m16n8k64 s4, native on sm80-sm89
    "gemm_dense_sm80_mma-ss_a-s4-k-f32_w-s4-g-f32_o-bf16_64x128x128_w2x2_s4": "IMMA.16864.S4.S4",
    "gemm_dense_sm89_mma-ss_a-s4-k-f32_w-s4-g-f32_o-f16_128x128x128_w2x4_s3": "IMMA.16864.S4.S4",
    "gemm_dense_sm120_mma-w4a8_a-e4m3-k-f32_w-e2m1-g-ue8m0_o-f16_128x64x128_w4x2_s4": "QMMA.16832.F32.E4M3.E4M3",
}


@pytest.fixture(scope="module")
def _compiled(tmp_path_factory):
    keys = [KernelKey.from_name(name) for name in _SASS]
    out = tmp_path_factory.mktemp("portable_8bit")
    return keys, driver.compile_keys(keys, out, jobs=2, stream=io.StringIO())


@pytest.mark.slow
@needs_nvcc
def test_each_arch_builds_its_fatbin(_compiled):
    keys, result = _compiled
    for key in keys:
        (entry,) = driver.read_fatbin(result.fatbins[key.name].read_bytes())
        assert entry.kind == driver.KIND_ELF and entry.elf_sm == int(key.arch[2:])


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(shutil.which("cuobjdump") is None or shutil.which("nvdisasm") is None,
                    reason="cuobjdump and nvdisasm are not on PATH: the SASS of the fatbins cannot be read")
def test_each_arch_runs_its_native_mma(_compiled):
    keys, result = _compiled
    for key in keys:
        sass = subprocess.run(["cuobjdump", "-sass", "-fun", key.symbol, str(result.fatbins[key.name])], capture_output=True, text=True,
                              check=True).stdout
        assert _SASS[key.name] in sass, key.name
        assert "HMMA" not in sass, f"{key.name}: an emulated mma (HMMA) where the arch has its own"
