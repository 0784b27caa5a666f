"""Per-warp timeline of the swapped 8-row tile in steady-state CUDA-graph replay. Run it from a copy
of the tree instrumented by tools/trace/apply_trace.py (whose docstring has the slot layout):

    python3 tools/trace/trace_run.py OUT.npz int1:g128@1 int4:g128@1      # FORMAT@M, N = K = 8192

Each format gets a graph of 2 passes over enough weight copies to defeat the L2 (as the benchmark
rotates them), one trace buffer per call. Printed per format: the traced time per call; the
grid-to-grid handover (the last warp's end of a call to the next call's first prologue done); the
phases of one warp (percentiles over the warps of a middle call); the CTAs' K tiles by their start
order on their SM; the critical chain of the last cluster to finish. OUT.npz keeps the raw rows of
three middle calls (key FORMAT@M#call; each row the 20 slots and, last, the row index).
"""
from __future__ import annotations

import statistics
import sys

import numpy as np
import torch

import humming_aot
from humming_aot import dispatch, ops

SLOTS = 20
N = K = 8192


def trace(fmt: str, m: int, sets: int = 14, passes: int = 2) -> tuple[float, list[np.ndarray]]:
    """(us per call, one array of rows per call) for FORMAT at M."""
    if not hasattr(dispatch, "TRACE_SLOTS"):
        sys.exit("humming_aot.dispatch has no TRACE_SLOTS: run from a copy instrumented by tools/trace/apply_trace.py")
    gen = torch.Generator().manual_seed(0)
    qw = humming_aot.quantize(torch.randn(N, K, generator=gen) * 0.02, fmt)
    packs = [humming_aot.pack(qw, act_dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    acts = [torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    calls = sets * passes
    buf = torch.zeros(calls, 4096 * SLOTS, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            for i in range(sets):
                ops.gemm(acts[i], packs[i])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in range(calls):
            dispatch.TRACE_SLOTS.append(buf[call])
            ops.gemm(acts[call % sets], packs[call % sets])
    if dispatch.TRACE_SLOTS:
        sys.exit(f"{fmt} at M = {m}: the launches were not clustered (no trace taken); "
                 "pick a format and M whose tile splits K in a cluster")
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    raw = buf.cpu().view(calls, -1, SLOTS).numpy()
    rows = []
    for call in range(calls):
        index = np.nonzero(raw[call][:, 1])[0]
        rows.append(np.concatenate([raw[call][index], index[:, None]], axis=1))
    return statistics.median(times), rows


def report(fmt: str, m: int, us: float, rows: list[np.ndarray]) -> None:
    mid = len(rows) // 2
    r, prev = rows[mid], rows[mid - 1]
    ghz = float(np.median((r[:, 8] - r[:, 3]) / np.maximum(r[:, 2] - r[:, 1], 1)))
    g0 = r[:, 1].min()
    start = r[:, 1] - g0

    def at(slot: int) -> np.ndarray:  # ns from the call's first start, on the globaltimer's scale
        return start + (r[:, slot] - r[:, 3]) / ghz

    def span(a: int, b: int) -> np.ndarray:
        return (r[:, a] - r[:, b]) / ghz

    print(f"== {fmt} M={m}: {us:.2f} us per call (traced), clock {ghz:.2f} GHz, {len(r)} warps on {len(set(r[:, 0]))} SMs")
    prev_end = (prev[:, 2] - g0).max()
    print(f"  previous call's last warp ends at {prev_end:.0f} ns; first prologue done {at(4).min():.0f} "
          f"(handover {at(4).min() - prev_end:.0f} ns); first stage landed p50 {np.median(at(5)):.0f}; "
          f"last warp ends {(r[:, 2] - g0).max():.0f}")
    owners = r[:, 11] != 0
    phases = [("start -> prologue done", span(4, 3), None), ("-> first stage landed", span(5, 4), None),
              ("-> K loop done", span(6, 5), None), ("-> shares gathered", span(7, 6), None),
              ("-> pushed", span(10, 7), None), ("owners: -> data in", span(11, 10), owners),
              ("owners: -> summed", span(12, 11), owners), ("owners: -> end", span(8, 12), owners),
              ("others: pushed -> end", span(8, 10), ~owners)]
    for name, v, mask in phases:
        v = v if mask is None else v[mask]
        if len(v):
            p10, p50, p90 = np.percentile(v, [10, 50, 90])
            print(f"  {name:24s} p10 {p10:6.0f} p50 {p50:6.0f} p90 {p90:6.0f} max {v.max():6.0f} ns")
    # CTAs by start order on their SM: the first one's warps get the issue slots first
    cta = r[:, -1] // 8
    order = np.zeros(len(r), dtype=int)
    for sm in np.unique(r[:, 0]):
        on_sm = r[:, 0] == sm
        for rank, b in enumerate(sorted(set(cta[on_sm]), key=lambda b: start[cta == b].min())):
            order[cta == b] = rank
    ends = [at(5)] + [at(13 + i) for i in range(4)]
    for o in range(order.max() + 1):
        sel = order == o
        durations = [int(np.median((ends[i + 1] - ends[i])[sel])) for i in range(4)]
        print(f"  CTA {o} on its SM: {sel.sum()} warps, start p50 {np.median(start[sel]):.0f}, K tile durations p50 {durations} ns, "
              f"end p50 {np.median(r[sel, 2] - g0):.0f}")
    last = np.argmax(r[:, 2])
    print(f"  last warp: SM {r[last, 0]}, CTA order {order[last]}, loop done {at(6)[last]:.0f}, ends {r[last, 2] - g0:.0f} ns")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    saved = {}
    for spec in sys.argv[2:]:
        fmt, m = spec.split("@")
        us, rows = trace(fmt, int(m))
        report(fmt, int(m), us, rows)
        for call in range(len(rows) // 2 - 1, len(rows) // 2 + 2):
            saved[f"{spec}#{call}"] = rows[call]
    np.savez_compressed(sys.argv[1], **saved)


if __name__ == "__main__":
    main()
