"""tools/bench/ncu_counters.py on raw pages written here in ncu's CSV layout: the metric list it
hands ncu, the kernels and metrics it reads back (not the device attributes beside them), the
side-by-side report, and the errors for output that is not a raw page."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("ncu_counters", ROOT / "tools/bench/ncu_counters.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _page(kernels: list[tuple[str, dict[str, str]]]) -> str:
    metrics = sorted({metric for _, values in kernels for metric in values})
    header = ["ID", "Kernel Name", "device__attribute_clock_rate", *metrics]
    out = io.StringIO()
    out.write("==PROF== Connected to process 1\nthe program's own line\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(header)
    writer.writerow(["", "", "kHz", *["" for _ in metrics]])
    for i, (name, values) in enumerate(kernels):
        writer.writerow([str(i), name, "1,980,000", *[values.get(metric, "") for metric in metrics]])
    return out.getvalue()


def test_the_metric_list_is_what_the_report_reads():
    tool = _tool()
    listed = tool.metric_list().split(",")
    assert listed == [metric for metric, _ in tool.METRICS] and len(set(listed)) == len(listed)
    assert "dram__bytes_read.sum" in listed and "launch__grid_size" in listed
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in listed


def test_kernels_reads_the_metrics_of_every_profiled_kernel_and_no_device_attribute():
    tool = _tool()
    page = _page([("gemm_ours", {"gpu__time_duration.sum": "47,552", "launch__grid_size": "396"}),
                  ("gemm_ours", {"gpu__time_duration.sum": "47,712", "launch__grid_size": "396"})])
    found = tool.kernels(page)
    assert [name for name, _ in found] == ["gemm_ours", "gemm_ours"]
    assert found[0][1] == {"gpu__time_duration.sum": "47,552", "launch__grid_size": "396"}
    assert found[1][1]["gpu__time_duration.sum"] == "47,712"


def test_the_report_puts_the_runs_side_by_side(tmp_path, capsys):
    tool = _tool()
    ours = tmp_path / "ours.csv"
    ours.write_text(_page([("gemm_masked_sm90a_wgmma_ws", {"gpu__time_duration.sum": "47,552",
                                                           "dram__bytes_read.sum": "99,779,840"})]))
    theirs = tmp_path / "humming.csv.gz"
    theirs.write_bytes(gzip.compress(_page([("void humming<Mma>", {"gpu__time_duration.sum": "42,464",
                                                                    "sm__inst_executed.sum": "17,443,828"})]).encode()))
    assert tool.main([f"{ours}:ours", f"{theirs}:humming"]) == 0
    text = capsys.readouterr().out
    assert "ours #0: gemm_masked_sm90a_wgmma_ws" in text and "humming #0: void humming<Mma>" in text
    duration = next(line for line in text.splitlines() if line.startswith("duration (ns)"))
    assert duration.split()[-2:] == ["47,552", "42,464"]
    instructions = next(line for line in text.splitlines() if line.startswith("instructions"))
    assert instructions.split()[-2:] == ["-", "17,443,828"]  # a metric one run lacks
    assert not any(line.startswith("grid") for line in text.splitlines())  # no run has it


def test_output_that_is_not_a_raw_page_is_refused_with_what_to_pass(tmp_path):
    tool = _tool()
    with pytest.raises(ValueError, match="ncu --csv --page raw"):
        tool.kernels("==PROF== no kernel was profiled\n")
    with pytest.raises(ValueError, match="not the details or source page"):
        tool.kernels('"Address","Source"\n"0x10","LDG"\n')
    empty = tmp_path / "empty.csv"
    empty.write_text(_page([]))
    with pytest.raises(ValueError, match="no profiled kernel"):
        tool.main([str(empty)])


def test_a_file_of_a_failed_ncu_run_is_named_without_a_traceback(tmp_path, capsys):
    """An ncu run that failed (its program raised) leaves a file without CSV rows: main says which
    file and exits 1, so a device script's log shows that line rather than a traceback."""
    tool = _tool()
    good, failed = tmp_path / "ours.csv", tmp_path / "humming.csv"
    good.write_text(_page([("gemm", {metric: "1" for metric, _ in tool.METRICS})]))
    failed.write_text("==PROF== Connected to process 1\nTraceback (most recent call last):\n")
    assert tool.main([f"{good}:ours", f"{failed}:humming"]) == 1
    err = capsys.readouterr().err
    assert str(failed) in err and "ncu --csv --page raw" in err
