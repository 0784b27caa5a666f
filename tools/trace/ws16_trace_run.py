"""Per-unit phases of the 16-bit-activation wgmma-ws body (one launch after three untimed ones),
from a copy of the tree instrumented by tools/trace/apply_ws16_trace.py (its docstring has the
slot layout):

    python3 tools/trace/ws16_trace_run.py NxK M [--tile T [--stream-k S] [--splits S]] [--format F]

F is a symmetric weight format (default int4:g128; the trace buffer rides in the zero-point
pointer). Printed: the clock rate, the kernel's span and the CTAs' start skew, then per kind of
unit (whole tile, a stream-K head that accumulated other parts, a later part that published) the
median / p10 / p90 of: the wait for its first K tile, the rest of its K loop, the fix-up (a
head's also as its wait for the parts' partials and its read of them), the consumers' barrier
and the store (us; the stamps mark where instructions issue, so a load's latency shows up where
its value is first used), then the producer's waits, the heads per SM and the critical CTA.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.packing import pack

SLOTS = 8 + 32 * 8  # per row: the header, then 32 units of 8
CTAS = 8192  # the instrumented kernel's capacity
KINDS = {0: "whole tile", 1: "part published", 2: "head + parts", 4: "whole tile", 6: "head + parts"}


def trace(fmt: str, n: int, k: int, m: int, tile: str | None, stream_k: int | None, splits: int | None) -> np.ndarray:
    """(CTAs that wrote, 3 rows, SLOTS) stamps of one launch."""
    gen = torch.Generator().manual_seed(0)
    qw = humming_aot.quantize(torch.randn(n, k, generator=gen), fmt)
    packed = pack(qw, torch.bfloat16, device="cuda")
    if packed.w_zero_point is not None:
        sys.exit(f"{fmt} has zero points: the trace buffer rides in that pointer; trace a symmetric format")
    a = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
    buf = torch.zeros(CTAS * 3 * SLOTS, dtype=torch.int64, device="cuda")
    dispatch.TRACE = buf

    def call():
        if tile is None:
            return ops.gemm(a, packed)
        return ops.gemm_with_tile(a, packed, tile, splits=splits, stream_k=stream_k)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    buf.zero_()
    call()
    torch.cuda.synchronize()
    t = buf.cpu().numpy().reshape(CTAS, 3, SLOTS)
    written = np.nonzero(t[:, 0, 2])[0]
    if len(written) == 0:
        sys.exit("no stamps: is this copy instrumented, the kernel a wgmma-ws one and HUMMING_AOT_JIT=1 set?")
    return t[: int(written.max()) + 1]


def stats(v: np.ndarray) -> str:
    return f"{np.median(v):8.3f} {np.percentile(v, 10):8.3f} {np.percentile(v, 90):8.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape")
    parser.add_argument("m", type=int)
    parser.add_argument("--tile")
    parser.add_argument("--stream-k", type=int)
    parser.add_argument("--splits", type=int)
    parser.add_argument("--format", default="int4:g128")
    args = parser.parse_args()
    if (args.stream_k is not None or args.splits is not None) and args.tile is None:
        parser.error("--stream-k and --splits force a schedule of a forced tile: give --tile too")
    if not hasattr(dispatch, "TRACE"):
        sys.exit("humming_aot.dispatch has no TRACE: run from a copy instrumented by tools/trace/apply_ws16_trace.py")
    n, k = (int(v) for v in args.shape.split("x"))
    t = trace(args.format, n, k, args.m, args.tile, args.stream_k, args.splits)
    ctas = len(t)
    rows = t[:, 0]
    ns = (rows[:, 3] - rows[:, 1]).astype(float)
    ghz = float(np.median((rows[:, 4] - rows[:, 2]).astype(float) / np.maximum(ns, 1)))
    cyc = ghz * 1e3  # cycles per us
    t0 = rows[:, 1].min()
    span = (rows[:, 3].max() - t0) / 1e3
    skew = (rows[:, 1] - t0) / 1e3
    print(f"{args.format} {n}x{k} M={args.m} tile={args.tile} stream_k={args.stream_k} splits={args.splits}: "
          f"{ctas} CTAs, {ghz:.3f} GHz, kernel span {span:.2f} us, CTA span median {np.median(ns) / 1e3:.2f} us")
    print(f"  CTA start after the first: median {np.median(skew):.2f} us, p90 {np.percentile(skew, 90):.2f}, "
          f"max {skew.max():.2f}; CTA end before the last: median {np.median((rows[:, 3].max() - rows[:, 3]) / 1e3):.2f} us")
    # (kind, ordinal, K tiles, start, fill wait, loop, fixup, barrier, store, cta, the head's wait for
    # its parts, its read of them) cycles
    consumer = []
    for c in range(ctas):
        for wg in (0, 1):
            r = t[c, wg]
            if r[2] == 0:
                continue
            for i in range(min(int(r[5]), 32)):
                u = r[8 + 8 * i: 16 + 8 * i]
                kind = int(u[7])
                end_fix = u[3]
                barrier = u[4] - u[3] if kind & 4 or kind == 2 else 0
                store = u[5] - u[4] if kind & 4 else 0
                waited = r[6] if kind & 3 == 2 and r[6] else end_fix  # (an older copy stamps no wait)
                consumer.append((kind & 3, i, u[6], u[0] - r[2], u[1] - u[0], u[2] - u[1], end_fix - u[2], barrier,
                                 store, c, waited - u[2], end_fix - waited))
    cr = np.array(consumer, dtype=float)
    print("consumer phase, us per unit: median / p10 / p90")
    for kind, name in ((0, "whole tile"), (2, "head + parts"), (1, "part published")):
        sel = cr[cr[:, 0] == kind]
        if not len(sel):
            continue
        print(f" {name}: {len(sel)} units, K tiles median {np.median(sel[:, 2]):.0f}")
        for col, label in ((4, "first tile"), (5, "rest of K"), (6, "fix-up"), (10, " its wait"), (11, " its read"),
                           (7, "barrier"), (8, "store")):
            if (kind == 1 and col > 6) or (kind != 2 and col > 9):
                continue
            print(f"   {label:10s} {stats(sel[:, col] / cyc)}")
        loop_tiles = np.maximum(sel[:, 2] - 1, 1)
        print(f"   ns per K tile after the first: {np.median(sel[:, 5] / loop_tiles) / cyc * 1e3:.1f}")
    prod = []
    for c in range(ctas):
        r = t[c, 2]
        if r[2] == 0:
            continue
        for i in range(min(int(r[5]), 32)):
            u = r[8 + 8 * i: 16 + 8 * i]
            prod.append((i, u[6], u[0] - r[2], u[1] - u[0], u[2] - u[1]))
    if prod:
        pr = np.array(prod, dtype=float)
        print("producer, us per unit: median / p10 / p90")
        print(f"   issue      {stats(pr[:, 3] / cyc)}   (waits for free slots)")
        print(f"   staging    {stats(pr[:, 4] / cyc)}   (waits for the staged store)")
    by_sm: dict[int, list[int]] = {}  # which CTAs shared an SM: the differences of their indices
    for c in range(ctas):
        by_sm.setdefault(int(rows[c, 0]), []).append(c)
    gaps: dict[int, int] = {}
    for members in by_sm.values():
        for a, b in zip(members, members[1:]):
            gaps[b - a] = gaps.get(b - a, 0) + 1
    print("  CTA index gaps between CTAs of one SM (gap: pairs): "
          + ", ".join(f"{g}: {n}" for g, n in sorted(gaps.items(), key=lambda x: -x[1])[:8]))
    heads_per_sm: dict[int, int] = {}  # stream-K head CTAs by their SM (a CTA's warpgroups count once)
    for cta in {int(row[9]) for row in cr[cr[:, 0] == 2]}:
        sm = int(rows[cta, 0])
        heads_per_sm[sm] = heads_per_sm.get(sm, 0) + 1
    if heads_per_sm:
        print("  SMs by heads they ran: " + ", ".join(
            f"{h} heads: {sum(1 for v in heads_per_sm.values() if v == h)}" for h in sorted(set(heads_per_sm.values())))
              + f", none: {len(set(rows[:, 0].tolist())) - len(heads_per_sm)}")
        for h in sorted(set(heads_per_sm.values())):
            sel = np.array([row for row in cr[cr[:, 0] == 2] if heads_per_sm[int(rows[int(row[9]), 0])] == h])
            print(f"   fix-up of a head on an SM of {h} heads: {stats(sel[:, 6] / cyc)}")
    last = int(np.argmax(rows[:, 3]))
    print(f"critical CTA {last} (SM {rows[last, 0]}), start +{skew[last]:.2f} us:")
    for row in cr[(cr[:, 9] == last)]:
        print(f"   wg unit {int(row[1])} ({KINDS[int(row[0])]}, {int(row[2])} K tiles) at {row[3] / cyc:.2f} us: "
              f"first tile {row[4] / cyc:.2f}, rest {row[5] / cyc:.2f}, fix-up {row[6] / cyc:.2f}"
              + (f" (wait {row[10] / cyc:.2f}, read {row[11] / cyc:.2f})" if row[0] == 2 else "") + ", "
              f"barrier {row[7] / cyc:.2f}, store {row[8] / cyc:.2f}")
    busy = cr[:, 5].sum() / cyc
    print(f"  K-loop share of CTA time (rest of K over CTA span x CTAs, per warpgroup row): "
          f"{busy / (np.sum(ns) / 1e3 * (2 if (t[:, 1, 2] > 0).any() else 1)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
