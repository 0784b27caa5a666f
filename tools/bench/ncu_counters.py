"""Per-kernel counters of two or more ncu runs side by side (ours against Humming, say).

    M=$(python3 tools/bench/ncu_counters.py --metric-list)
    ncu --csv --page raw --metrics "$M" ... > ours.csv        # one run per implementation
    ncu --csv --page raw --metrics "$M" ... > humming.csv
    python3 tools/bench/ncu_counters.py ours.csv:ours humming.csv:humming     # (.gz read too)

--metric-list prints the comma list of METRICS for ncu's --metrics: what a kernel's launch is
(grid, threads, registers, dynamic shared memory), what it moved (DRAM bytes read and the share
of DRAM peak, L2 bytes), how much it executed (instructions, issue-active share, active warps),
and where its warps waited (stall cycles per issued instruction, by reason). The report prints
one column per profiled kernel (each file's label and the kernel's position in it, every
profiled call of every kernel in the file), one row per metric, in METRICS order, so that two
implementations of one GEMM compare at a glance. ncu's raw page reports every device attribute
beside the metrics asked for: only METRICS are read.

Standard library only (the GPU box's ncu output is read here, on a machine without ncu).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from pathlib import Path

_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALL_REASONS = ("long_scoreboard", "wait", "barrier", "short_scoreboard", "math_pipe_throttle", "mio_throttle",
                 "lg_throttle", "dispatch_stall", "no_instruction", "not_selected", "selected", "branch_resolving",
                 "membar", "sleeping")
# (metric, row label) in report order
METRICS = (
    ("gpu__time_duration.sum", "duration (ns)"),
    ("launch__grid_size", "grid"),
    ("launch__block_size", "threads per CTA"),
    ("launch__registers_per_thread", "registers per thread"),
    ("launch__shared_mem_per_block_dynamic", "dynamic shared memory (B)"),
    ("dram__bytes_read.sum", "DRAM read (B)"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % of peak"),
    ("lts__t_bytes.sum", "L2 bytes"),
    ("sm__inst_executed.sum", "instructions"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active %"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps active %"),
) + tuple((_STALL.format(reason), f"stall {reason.replace('_', ' ')} / issue") for reason in STALL_REASONS)


def metric_list() -> str:
    """The comma list for ncu's --metrics."""
    return ",".join(metric for metric, _ in METRICS)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    return gzip.decompress(data).decode() if data[:2] == b"\x1f\x8b" else data.decode()


def kernels(text: str) -> list[tuple[str, dict[str, str]]]:
    """(kernel name, {metric: value}) of every profiled kernel in ncu's --csv --page raw output:
    its header row, its units row, then one row per profiled kernel (lines before the header,
    the profiled program's own output, are skipped)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ValueError("no ncu CSV rows: expected the output of ncu --csv --page raw")
    header = rows[0]
    if "Kernel Name" not in header:
        raise ValueError("no 'Kernel Name' column: expected ncu --csv --page raw, not the details or source page")
    found = []
    for row in rows[2:]:  # rows[1]: the units
        values = dict(zip(header, row))
        found.append((values["Kernel Name"], {metric: values[metric] for metric, _ in METRICS if metric in values}))
    return found


def report(labelled: list[tuple[str, str]], name_width: int = 48) -> str:
    """The side-by-side table of (label, ncu CSV text) pairs: a header of the columns (label #i:
    kernel name, cut to name_width), then one row per metric any column has."""
    columns = []
    for label, text in labelled:
        for i, (name, values) in enumerate(kernels(text)):
            columns.append((f"{label} #{i}", name[:name_width], values))
    if not columns:
        raise ValueError("no profiled kernel in the files: did the NVTX range or the kernel filter match?")
    out = [f"{'':<34}" + "".join(f"{column:>22}" for column, _, _ in columns)]
    out += [f"  {column}: {name}" for column, name, _ in columns]
    for metric, label in METRICS:
        if any(metric in values for _, _, values in columns):
            out.append(f"{label:<34}" + "".join(f"{values.get(metric, '-'):>22}" for _, _, values in columns))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="FILE[:LABEL] of ncu --csv --page raw output (LABEL: the file's name)")
    parser.add_argument("--metric-list", action="store_true", help="print the --metrics list for ncu and stop")
    args = parser.parse_args(argv)
    if args.metric_list:
        print(metric_list())
        return 0
    if not args.files:
        parser.error("name at least one ncu CSV file, or --metric-list")
    labelled = []
    for spec in args.files:
        path, _, label = spec.partition(":")
        text = _read_text(Path(path))
        try:
            kernels(text)
        except ValueError as exc:  # an ncu run that failed leaves no rows: say which file
            print(f"ncu_counters.py: {path}: {exc} (did that ncu run fail? its stderr says why)", file=sys.stderr)
            return 1
        labelled.append((label or Path(path).name, text))
    print(report(labelled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
