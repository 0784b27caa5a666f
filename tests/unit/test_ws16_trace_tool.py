"""tools/trace/apply_ws16_trace.py: it instruments a copy of the tree (never a git checkout), its
source anchors still match the 16-bit wgmma-ws body and the launcher, and the instrumented kernels
compile (nvcc, sm90a)."""
from __future__ import annotations

from pathlib import Path

import pytest

from humming_aot.testing import trace_tools

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "trace" / "apply_ws16_trace.py"
BODY = "csrc/include/humming_aot/kernel/dense_wgmma_ws.cuh"
LAUNCHER = "humming_aot/dispatch.py"
KERNELS = ("gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_64x128x64_w1x4_s6",
           "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5")


def _copy(tmp_path: Path) -> Path:
    return trace_tools.copy_tree(ROOT, tmp_path, (LAUNCHER,))


def _apply(root: Path):
    return trace_tools.apply(SCRIPT, root)


def test_instruments_a_copy_and_only_a_copy(tmp_path):
    copy = _copy(tmp_path)
    result = _apply(copy)
    assert result.returncode == 0, result.stderr
    body = (copy / BODY).read_text()
    assert body.count("ws16trace::ck()") >= 10 and "p.w_zero_point, 2" in body
    launcher = (copy / LAUNCHER).read_text()
    assert "TRACE = None" in launcher and "TRACE.data_ptr()" in launcher
    assert "ws16trace" not in (ROOT / BODY).read_text() and "TRACE" not in (ROOT / LAUNCHER).read_text()
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
