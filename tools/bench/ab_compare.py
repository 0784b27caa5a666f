"""Side-by-side timings of two builds: the base tree and the current one, benchmarked in turns.

    python3 tools/bench/ab_compare.py ab.json            # the table of an A/B run
    python3 tools/bench/ab_compare.py --merge ab.json --rev SHA --base b1.json b2.json \\
        --current c1.json c2.json                          # how tools/device_check.sh's ab step writes it

ab.json: {"base": {"rev": ..., "rounds": [bench JSON, ...]}, "current": {"rev": ..., "rounds": [...]}},
each round one tools/bench/bench_gemm.py --json output, bench_w8a8.py's or bench_w4a8.py's (their
pairing as the format, as in current_table.py), or bench_moe.py's (its tokens as M, its model and
GEMM telling apart shapes of the same N and K). The table has one row per point (impl,
format, M, N, K): the median over the rounds of each side (each round is itself a median of
graph replays), the change in us and in percent, and the spread of the rounds (max - min over
both sides), the size below which a change is not told apart from run-to-run noise.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
from pathlib import Path

Point = tuple[str, str, int, int, int]


@functools.cache
def _row_format():
    """current_table.row_format (a row's weight format, or its W8A8 / W4A8 pairing), loaded from
    the file beside this one (no package import: this tool needs only the standard library)."""
    spec = importlib.util.spec_from_file_location("_current_table", Path(__file__).with_name("current_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.row_format


def _times(rounds: list[dict]) -> dict[Point, list[float]]:
    """Every round's time of each point, in round order."""
    times: dict[Point, list[float]] = {}
    for run in rounds:
        for r in run.get("results", []):
            if r.get("us") is None:  # a point an implementation failed (bench_moe records those)
                continue
            if "tokens" in r:  # bench_moe.py: the MoE GEMM of a model (E x top-k) at a token count
                impl = f"{r['impl']} {r['model']} {r['gemm']} {r.get('layout', '')}".rstrip()
                key = (impl, r["format"], int(r["tokens"]), int(r["n"]), int(r["k"]))
            else:
                key = (r["impl"], _row_format()(r), int(r["m"]), int(r["n"]), int(r["k"]))
            times.setdefault(key, []).append(float(r["us"]))
    return times


def compare(ab: dict) -> list[dict]:
    """Rows for the points both sides measured, in (impl, format, N, K, M) order."""
    base, current = _times(ab["base"]["rounds"]), _times(ab["current"]["rounds"])
    rows = []
    for key in sorted(base.keys() & current.keys(), key=lambda p: (p[0], p[1], p[3], p[4], p[2])):
        b, c = statistics.median(base[key]), statistics.median(current[key])
        both = base[key] + current[key]
        rows.append({
            "impl": key[0], "fmt": key[1], "m": key[2], "n": key[3], "k": key[4],
            "base_us": b, "current_us": c, "delta_us": c - b, "delta_pct": 100.0 * (c - b) / b,
            "spread_us": max(both) - min(both), "rounds": (len(base[key]), len(current[key])),
        })
    return rows


def only_one_side(ab: dict) -> list[Point]:
    """Points that one side measured and the other did not (a kernel missing from one build)."""
    base, current = _times(ab["base"]["rounds"]), _times(ab["current"]["rounds"])
    return sorted(base.keys() ^ current.keys())


def format_table(ab: dict) -> str:
    lines = [f"base {ab['base'].get('rev', '?')}  current {ab['current'].get('rev', '?')}",
             f"{'impl':12s} {'format':18s} {'M':>5s} {'N':>6s} {'K':>6s} {'base':>9s} {'current':>9s} "
             f"{'change':>8s} {'%':>7s} {'spread':>7s}"]
    for r in compare(ab):
        lines.append(f"{r['impl']:12s} {r['fmt']:18s} {r['m']:5d} {r['n']:6d} {r['k']:6d} {r['base_us']:9.2f} "
                     f"{r['current_us']:9.2f} {r['delta_us']:+8.2f} {r['delta_pct']:+6.1f}% {r['spread_us']:7.2f}")
    for point in only_one_side(ab):
        lines.append(f"measured on one side only: {point}")
    return "\n".join(lines)


def merge(rev: str, base_files: list[Path], current_files: list[Path], current_rev: str = "working tree") -> dict:
    load = lambda files: [json.loads(Path(f).read_text()) for f in files]  # noqa: E731
    return {"base": {"rev": rev, "rounds": load(base_files)}, "current": {"rev": current_rev, "rounds": load(current_files)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ab_json", type=Path, help="the A/B file to read (or, with --merge, to write)")
    parser.add_argument("--merge", action="store_true", help="write ab_json from --base and --current round files")
    parser.add_argument("--rev", default="?", help="the base tree's revision (with --merge)")
    parser.add_argument("--current-rev", default="working tree", help="the current tree's revision (with --merge)")
    parser.add_argument("--base", type=Path, nargs="*", default=[], help="bench JSON of each base round")
    parser.add_argument("--current", type=Path, nargs="*", default=[], help="bench JSON of each current round")
    args = parser.parse_args(argv)
    if args.merge:
        if not args.base or not args.current:
            parser.error("--merge needs --base and --current round files")
        ab = merge(args.rev, args.base, args.current, args.current_rev)
        args.ab_json.write_text(json.dumps(ab))
    else:
        ab = json.loads(args.ab_json.read_text())
    print(format_table(ab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
