"""Write docs/performance/current.md, the one table of current figures, from bench_gemm.py,
bench_w8a8.py, bench_w4a8.py and bench_moe.py JSON: per pairing (a weight format with 16-bit
activations, or a W8A8 / W4A8 pairing), per layer (N x K) and M, ours / Humming / a baseline in us
(cuBLAS bf16 F.linear for the 16-bit pairings, torch._scaled_mm or torch._int_mm with its scales
for W8A8, our own W4A16 of the same weights for W4A8), and a summary against each (geometric mean,
points below 0.95x). MoE rows (bench_moe.py's, 16-bit activations: the table's own tiles, not
forced ones) make a table per weight format, layout and routing (experts, top-k), per GEMM (N x K)
and token count, against torch._grouped_mm on bf16 weights.

    python3 tools/bench/current_table.py docs/performance/data/h200-run5.json \\
        docs/performance/data/h200-run6.json --out docs/performance/current.md

Files are merged in order (tools/bench/plot_bench.py's rule: a later file's point replaces an
earlier one's), so a run of ours alone can update a table whose Humming and cuBLAS figures come
from an earlier run on the same machine; the table names every input file. A session's combined
data file (``{"runs": {name: {"results": ...}}}``) is named with its run, ``FILE:RUN``.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

OURS, HUMMING, CUBLAS = "humming_aot", "humming", "torch_bf16"
# bench_w8a8.py's pairings (its rows carry "blocks" and "int8" rather than "fmt") and the cuBLAS
# implementation each is compared with (None: no cuBLAS kernel for it)
W8A8_CHANNEL = "W8A8 float8e4m3:channel x float8e4m3:token"
W8A8_BLOCKS = "W8A8 float8e4m3:b128x128 x float8e4m3:g128"
W8A8_INT8 = "W8A8 int8:channel x int8:token"
# bench_w4a8.py's rows carry "w4a8"; its baseline is our W4A16 of the same weights ("w4a16")
W4A8_INT4 = "W4A8 int4:g128 x float8e4m3:token"
W4A8_MXFP4 = "W4A8 mxfp4 x float8e4m3:token"  # (rows with "weights": "mxfp4")
_BASELINES = {W8A8_CHANNEL: ("scaled_mm", "torch._scaled_mm"), W8A8_INT8: ("int_mm", "torch._int_mm + scales"),
              W8A8_BLOCKS: (None, None), W4A8_INT4: ("w4a16", "our W4A16 (bf16 activations)"),
              W4A8_MXFP4: ("w4a16", "our W4A16 (bf16 activations)")}


# bench_moe.py's rows carry "experts"; their baseline is torch._grouped_mm on bf16 weights
MOE_BASELINE = ("torch_grouped_mm", "torch._grouped_mm bf16")


def row_format(row: dict) -> str:
    """The table a result row belongs to: its weight format (bench_gemm.py), its W8A8 pairing, or
    its MoE format, layout and routing (bench_moe.py)."""
    if "experts" in row:
        return f"MoE {row['format']}, {row.get('layout', 'contiguous')}, {row['experts']} experts, top-{row['top_k']}"
    if "fmt" in row:
        return row["fmt"]
    if row.get("w4a8"):
        return W4A8_MXFP4 if row.get("weights") == "mxfp4" else W4A8_INT4
    if row.get("int8"):
        return W8A8_INT8
    return W8A8_BLOCKS if row.get("blocks") else W8A8_CHANNEL


def merge(payloads: list[dict]) -> dict:
    """{(impl, fmt, n, k, m): median us} over the payloads' results, later ones winning."""
    merged = {}
    for payload in payloads:
        for row in payload.get("results", []):
            if row.get("us") is None or not math.isfinite(row["us"]):
                continue
            m = row.get("m")
            if "experts" in row:  # the 16-bit MoE impls through their table (a forced tile or split is a sweep)
                note = row.get("note", "")
                if row["impl"] not in (OURS, HUMMING, MOE_BASELINE[0]) or note.startswith(("tile ", "splits ")):
                    continue
                m = row["tokens"]
            merged[(row["impl"], row_format(row), int(row["n"]), int(row["k"]), int(m))] = float(row["us"])
    return merged


def load(source: str) -> dict:
    """A payload: a bench JSON file, or FILE:RUN for one run of a session's combined data file."""
    path, _, run = source.partition(".json:")
    path = path + ".json" if run else source
    payload = json.loads(Path(path).read_text())
    if run:
        if run not in payload.get("runs", {}):
            raise SystemExit(f"{path} has no run {run!r}; it has {', '.join(payload.get('runs', {}))}")
        return {"device": payload.get("device", "?"), "results": payload["runs"][run]["results"]}
    return payload


def _summary(name: str, ratios: list[float]) -> list[str]:
    if not ratios:
        return []
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    below = sum(r < 0.95 for r in ratios)
    return [f"Against {name}: geometric mean {geomean:.2f}x its speed over {len(ratios)} points; "
            f"{below} below 0.95x, {sum(r >= 1.0 for r in ratios)} at or above 1.0x.", ""]


def table(points: dict, sources: list[str], device: str, note: str = "") -> str:
    """The Markdown text of current.md for merged points {(impl, fmt, n, k, m): us}."""
    formats = sorted({fmt for impl, fmt, *_ in points if impl == OURS},
                     key=lambda f: (f.startswith("MoE"), f[:4] in ("W8A8", "W4A8"), f))
    lines = ["# Current figures", "",
             "Generated by `tools/bench/current_table.py` from " + ", ".join(f"`{s}`" for s in sources)
             + f" ({device}; CUDA-graph us, cold L2). Do not edit: rerun the benchmark and the tool.", ""]
    if note:
        lines += [note, ""]
    for fmt in formats:
        shapes = sorted({(n, k) for impl, f, n, k, m in points if impl == OURS and f == fmt})
        ms = sorted({m for impl, f, n, k, m in points if impl == OURS and f == fmt})
        moe = fmt.startswith("MoE")
        baseline, baseline_name = MOE_BASELINE if moe else _BASELINES.get(fmt, (CUBLAS, "cuBLAS bf16"))
        baseline_fmt = "bfloat16" if baseline == CUBLAS else fmt
        lines += [f"## {fmt}: ours / Humming" + (f" / {baseline_name}" if baseline else ""), "",
                  "| N x K | " + " | ".join(f"{'tokens' if moe else 'M'} = {m}" for m in ms) + " |",
                  "|---|" + "---|" * len(ms)]
        ratios, baseline_ratios = [], []
        for n, k in shapes:
            cells = []
            for m in ms:
                ours = points.get((OURS, fmt, n, k, m))
                humming = points.get((HUMMING, fmt, n, k, m))
                cublas = points.get((baseline, baseline_fmt, n, k, m)) if baseline else None
                if ours is None:
                    cells.append("-")
                    continue
                if humming is not None:
                    ratios.append(humming / ours)
                if cublas is not None and baseline != CUBLAS:
                    baseline_ratios.append(cublas / ours)
                values = (ours, humming, cublas) if baseline else (ours, humming)
                cells.append(" / ".join("-" if v is None else f"{v:.1f}" for v in values))
            lines.append(f"| {n} x {k} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += _summary("Humming", ratios) + _summary(baseline_name, baseline_ratios)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_gemm.py / bench_w8a8.py / bench_w4a8.py / bench_moe.py --json "
                        "files (or FILE:RUN of a session's combined data file), merged in order")
    parser.add_argument("--out", required=True)
    parser.add_argument("--note", default="", help="a paragraph under the header (what the inputs' runs had in common)")
    args = parser.parse_args(argv)
    payloads = [load(source) for source in args.json]
    devices = sorted({p.get("device", "?") for p in payloads})
    text = table(merge(payloads), args.json, ", ".join(devices), args.note)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
