"""Plot time against M per layer shape from tools/bench/bench_gemm.py's JSON output: one panel per
N x K, one line per implementation (and weight format), log-log axes.

    python3 tools/bench/plot_bench.py bench.json --out docs/bench.png
    python3 tools/bench/plot_bench.py theirs.json ours.json --title "H200, int4:g128"

Several files are merged in order; a later file's point replaces an earlier file's point of the
same (implementation, format, N, K, M). bench_gemm.py --plot PATH calls plot() on its own results.
Needs matplotlib (not a dependency of humming_aot: pip install matplotlib).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

Point = tuple[str, str, int, int, int]  # impl, fmt, n, k, m


def merge_results(payloads: list[dict]) -> dict[Point, float]:
    """{(impl, fmt, n, k, m): median us} over bench_gemm.py payloads, later ones winning."""
    merged: dict[Point, float] = {}
    for payload in payloads:
        for row in payload.get("results", []):
            if row.get("us") is None or not math.isfinite(row["us"]):
                continue
            merged[(row["impl"], row["fmt"], int(row["n"]), int(row["k"]), int(row["m"]))] = float(row["us"])
    return merged


def series(points: dict[Point, float]) -> dict[tuple[int, int], dict[str, list[tuple[int, float]]]]:
    """{(n, k): {"impl fmt": [(m, us), ...] sorted by m}} for plotting."""
    out: dict[tuple[int, int], dict[str, list[tuple[int, float]]]] = {}
    for (impl, fmt, n, k, m), us in points.items():
        out.setdefault((n, k), {}).setdefault(f"{impl} {fmt}", []).append((m, us))
    for lines in out.values():
        for values in lines.values():
            values.sort()
    return dict(sorted(out.items()))


def plot(points: dict[Point, float], out: str | Path, title: str = "") -> Path:
    """Write the PNG of `points` to `out`; raises ImportError with the install hint without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("plotting needs matplotlib, which humming_aot does not depend on: pip install matplotlib") from error
    panels = series(points)
    if not panels:
        raise ValueError("no finite results to plot")
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, ((n, k), lines) in zip(axes.flat, panels.items()):
        for label, values in sorted(lines.items()):
            ms, us = zip(*values)
            ax.plot(ms, us, marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={n} K={k}", fontsize=9)
        ax.set_xlabel("M")
        ax.set_ylabel("us (CUDA graph)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_gemm.py --json files, merged in order")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--impls", default=None, help="comma list of implementations to keep (default all)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    points = merge_results([json.loads(Path(path).read_text()) for path in args.json])
    if args.impls:
        keep = set(args.impls.split(","))
        points = {point: us for point, us in points.items() if point[0] in keep}
    print(f"wrote {plot(points, args.out, args.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
