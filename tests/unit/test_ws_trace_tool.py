"""tools/trace/apply_ws_trace.py: it instruments a copy of the tree (never a git checkout), its
source anchors still match the W8A8 / W4A8 driver and launcher, and the instrumented W8A8 and W4A8
kernels compile (nvcc, sm90a)."""
from __future__ import annotations

from pathlib import Path

import pytest

from humming_aot.testing import trace_tools

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "trace" / "apply_ws_trace.py"
DRIVER = "csrc/include/humming_aot/kernel/scaled_ws_driver.cuh"
LAUNCHER = "humming_aot/_w8a8_launch.py"
KERNELS = ("gemm_dense_sm90a_wgmma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-bf16_128x128x128_w1x8_s5",
           "gemm_dense_sm90a_wgmma-w4a8_a-e4m3-k-f32_w-s4-g-f32_o-bf16_192x128x128_w1x8_s5")


def _copy(tmp_path: Path) -> Path:
    return trace_tools.copy_tree(ROOT, tmp_path, (LAUNCHER,))


def _apply(root: Path):
    return trace_tools.apply(SCRIPT, root)


def test_instruments_a_copy_and_only_a_copy(tmp_path):
    copy = _copy(tmp_path)
    result = _apply(copy)
    assert result.returncode == 0, result.stderr
    kernel = (copy / DRIVER).read_text()
    assert kernel.count("wstrace::ck()") >= 7 and "p.w_zero_point" in kernel
    launcher = (copy / LAUNCHER).read_text()
    assert "TRACE = None" in launcher and "TRACE.data_ptr()" in launcher
    assert "wstrace" not in (ROOT / DRIVER).read_text() and "TRACE" not in (ROOT / LAUNCHER).read_text()
    again = _apply(copy)  # the anchors are gone from an instrumented copy: it says which one
    assert again.returncode != 0 and "anchor found" in again.stderr
    (tmp_path / "checkout" / ".git").mkdir(parents=True)
    refused = _apply(tmp_path / "checkout")
    assert refused.returncode != 0 and "not the working tree" in refused.stderr


@pytest.mark.parametrize("name", KERNELS)
def test_the_instrumented_kernels_compile(tmp_path, name):
    copy = _copy(tmp_path)
    assert _apply(copy).returncode == 0
    result = trace_tools.compile_against(copy / "csrc" / "include", name, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "k.cubin").stat().st_size > 0
