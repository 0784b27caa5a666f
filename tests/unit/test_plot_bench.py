"""tools/bench/plot_bench.py: merging bench_gemm.py outputs (later files win) and the per-shape
series it plots, from synthetic results (the PNG itself needs matplotlib, not a test dependency)."""
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plot_bench", ROOT / "tools" / "bench" / "plot_bench.py")
plot_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot_bench)


def _row(impl, m, us, n=4096, k=4096, fmt="int4:g128"):
    return {"impl": impl, "fmt": fmt, "m": m, "n": n, "k": k, "us": us}


def test_later_files_replace_the_same_point_and_keep_the_others():
    first = {"results": [_row("humming_aot", 32, 20.0), _row("humming", 32, 12.0), _row("humming_aot", 64, 30.0)]}
    second = {"results": [_row("humming_aot", 32, 11.0), _row("humming_aot", 128, math.nan)]}
    merged = plot_bench.merge_results([first, second])
    assert merged == {
        ("humming_aot", "int4:g128", 4096, 4096, 32): 11.0,  # replaced by the later file
        ("humming", "int4:g128", 4096, 4096, 32): 12.0,
        ("humming_aot", "int4:g128", 4096, 4096, 64): 30.0,
    }  # the NaN point is dropped, not plotted


def test_series_are_per_shape_and_sorted_by_m():
    merged = plot_bench.merge_results([{"results": [
        _row("humming_aot", 128, 3.0), _row("humming_aot", 32, 1.0), _row("humming_aot", 32, 9.0, n=8192),
    ]}])
    assert plot_bench.series(merged) == {
        (4096, 4096): {"humming_aot int4:g128": [(32, 1.0), (128, 3.0)]},
        (8192, 4096): {"humming_aot int4:g128": [(32, 9.0)]},
    }
