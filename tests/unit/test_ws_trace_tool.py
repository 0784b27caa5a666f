"""tools/trace/apply_ws_trace.py (the W8A8 / W4A8 driver) and apply_ws16_trace.py (the 16-bit
wgmma-ws body): each instruments a copy of the tree (never a git checkout), its source anchors
still match the kernel and launcher it patches, and the instrumented kernels compile (nvcc, sm90a)."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from humming_aot.testing import trace_tools

ROOT = Path(__file__).resolve().parents[2]


class Tool(NamedTuple):
    script: str
    kernel: str  # the source file it instruments
    launcher: str  # the Python file that passes its buffer
    marker: str  # its clock helper, once per stamp
    stamps: int  # at least this many
    buffer: str  # the pointer the buffer rides in
    keys: tuple[str, ...]


TOOLS = {
    "w8a8-w4a8": Tool("apply_ws_trace.py", "csrc/include/humming_aot/kernel/scaled_ws_driver.cuh",
                      "humming_aot/_w8a8_launch.py", "wstrace::ck()", 7, "p.w_zero_point",
                      ("gemm_dense_sm90a_wgmma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-bf16_128x128x128_w1x8_s5",
                       "gemm_dense_sm90a_wgmma-w4a8_a-e4m3-k-f32_w-s4-g-f32_o-bf16_192x128x128_w1x8_s5")),
    "16-bit": Tool("apply_ws16_trace.py", "csrc/include/humming_aot/kernel/dense_wgmma_ws.cuh",
                   "humming_aot/dispatch.py", "ws16trace::ck()", 10, "p.w_zero_point, 2",
                   ("gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_64x128x64_w1x4_s6",
                    "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5")),
}


def _apply(tool: Tool, root: Path):
    return trace_tools.apply(ROOT / "tools" / "trace" / tool.script, root)


@pytest.mark.parametrize("name", TOOLS)
def test_instruments_a_copy_and_only_a_copy(tmp_path, name):
    tool = TOOLS[name]
    copy = trace_tools.copy_tree(ROOT, tmp_path, (tool.launcher,))
    result = _apply(tool, copy)
    assert result.returncode == 0, result.stderr
    kernel = (copy / tool.kernel).read_text()
    assert kernel.count(tool.marker) >= tool.stamps and tool.buffer in kernel
    launcher = (copy / tool.launcher).read_text()
    assert "TRACE = None" in launcher and "TRACE.data_ptr()" in launcher
    assert tool.marker not in (ROOT / tool.kernel).read_text() and "TRACE" not in (ROOT / tool.launcher).read_text()
    again = _apply(tool, copy)  # the anchors are gone from an instrumented copy: it says which one
    assert again.returncode != 0 and "anchor found" in again.stderr
    (tmp_path / "checkout" / ".git").mkdir(parents=True)
    refused = _apply(tool, tmp_path / "checkout")
    assert refused.returncode != 0 and "not the working tree" in refused.stderr


@pytest.mark.parametrize("name,key", [(name, key) for name, tool in TOOLS.items() for key in tool.keys])
def test_the_instrumented_kernels_compile(tmp_path, name, key):
    tool = TOOLS[name]
    copy = trace_tools.copy_tree(ROOT, tmp_path, (tool.launcher,))
    assert _apply(tool, copy).returncode == 0
    result = trace_tools.compile_against(copy / "csrc" / "include", key, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "k.cubin").stat().st_size > 0
