"""tools/bench/mma_throughput.cu (a standalone tensor-pipe microbenchmark run on the GPU box)
compiles for sm_90a with the command its header gives (it uses the library's wgmma helpers), and issues both instructions it compares."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from humming_aot.aot import ninja as driver

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tools" / "bench" / "mma_throughput.cu"
INCLUDE = ROOT / "csrc" / "include"


def test_compiles_for_sm90a_with_both_mma_kinds(tmp_path):
    try:
        nvcc = driver.find_nvcc()
    except driver.NvccNotFoundError:
        pytest.fail("nvcc not found: the CI machine has nvcc 13.0 (set HUMMING_AOT_NVCC)")
    assert "-gencode arch=compute_90a,code=sm_90a" in SOURCE.read_text()  # sm_90 (no a) has no wgmma
    cubin = tmp_path / "mma_throughput.cubin"
    result = subprocess.run([str(nvcc), "-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a",
                             "-I", str(INCLUDE), "-o", str(cubin), str(SOURCE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    ptx = subprocess.run([str(nvcc), "-ptx", "-std=c++17", "-arch=compute_90a", "-I", str(INCLUDE), "-o", "-",
                          str(SOURCE)],
                         capture_output=True, text=True)
    assert ptx.returncode == 0, ptx.stderr[-2000:]
    assert "mma.sync.aligned.m16n8k16" in ptx.stdout and "wgmma.mma_async.sync.aligned.m64n8k16" in ptx.stdout
