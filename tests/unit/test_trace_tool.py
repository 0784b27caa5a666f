"""tools/trace/apply_trace.py: it instruments a copy of the tree (never a git checkout), its source
anchors still match the kernel, and the instrumented swapped tile compiles (nvcc, sm90a)."""
from __future__ import annotations

from pathlib import Path

from humming_aot.testing import trace_tools

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "trace" / "apply_trace.py"
TRACED_FILES = ("csrc/include/humming_aot/mainloop/swapped_warp_pipeline.cuh",
                "csrc/include/humming_aot/epilogue/swapped_output_writer.cuh", "humming_aot/dispatch.py")
INT1_SWAPPED = "gemm_dense_sm90a_mma_a-bf16_w-s1-g-bf16_o-bf16_8x128x512_w1x2x4_s2"


def _copy(tmp_path: Path) -> Path:
    return trace_tools.copy_tree(ROOT, tmp_path, TRACED_FILES + ("humming_aot/__init__.py",))


def _apply(root: Path):
    return trace_tools.apply(SCRIPT, root)


def test_instruments_a_copy_and_only_a_copy(tmp_path):
    copy = _copy(tmp_path)
    result = _apply(copy)
    assert result.returncode == 0, result.stderr
    kernel = (copy / TRACED_FILES[0]).read_text()
    assert kernel.count("trace::ck()") >= 6 and "tr[13 + it]" in kernel
    assert "stash.p.workspace" in (copy / TRACED_FILES[1]).read_text()
    assert "TRACE_SLOTS" in (copy / TRACED_FILES[2]).read_text()
    # the tree itself is untouched
    assert "trace::ck()" not in (ROOT / TRACED_FILES[0]).read_text()
    assert "TRACE_SLOTS" not in (ROOT / TRACED_FILES[2]).read_text()
    again = _apply(copy)  # the anchors are gone from an instrumented copy: it says which one
    assert again.returncode != 0 and "anchor found" in again.stderr
    (tmp_path / "checkout" / ".git").mkdir(parents=True)
    refused = _apply(tmp_path / "checkout")
    assert refused.returncode != 0 and "not the working tree" in refused.stderr


def test_the_instrumented_swapped_tile_compiles(tmp_path):
    copy = _copy(tmp_path)
    assert _apply(copy).returncode == 0
    result = trace_tools.compile_against(copy / "csrc" / "include", INT1_SWAPPED, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "k.cubin").stat().st_size > 0
