"""Per-unit phases of the W8A8 / W4A8 bodies (one launch after three untimed ones), from a copy of
the tree instrumented by tools/trace/apply_ws_trace.py (whose docstring has the slot layout):

    python3 tools/trace/ws_trace_run.py w8a8|w4a8 NxK M [TILE]

Printed: the clock rate, the per-CTA span, and per unit the median / p10 / p90 of its K loop, the
wait at the consumers' barrier, scale_sums, the staging tile's store and the step to the next
unit (all in us; the stamps mark where instructions issue, so a load's latency shows up where its
value is first used). w8a8 is float8e4m3:channel x float8e4m3:token, w4a8 int4:g128 x
float8e4m3:token.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from humming_aot import _w8a8_launch, ops, quant, w4a8, w8a8

SLOTS = 8 + 64 * 6  # per consumer warpgroup: the header, then 64 units of 6
CTAS = 8192  # the instrumented kernel's capacity


def trace(kind: str, n: int, k: int, m: int, tile: str | None) -> np.ndarray:
    """(CTAs that wrote, 2 warpgroups, SLOTS) stamps of one launch."""
    gen = torch.Generator().manual_seed(0)
    weights = "int4:g128" if kind == "w4a8" else "float8e4m3:channel"
    module = w4a8 if kind == "w4a8" else w8a8
    packed = module.pack(quant.quantize(torch.randn(n, k, generator=gen), weights)).to("cuda")
    qa = ops.quantize_activation(torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16), "float8e4m3:token")
    buf = torch.zeros(CTAS * 2 * SLOTS, dtype=torch.int64, device="cuda")
    _w8a8_launch.TRACE = buf
    for _ in range(3):
        module.gemm(qa, packed, tile=tile)
    torch.cuda.synchronize()
    buf.zero_()
    module.gemm(qa, packed, tile=tile)
    torch.cuda.synchronize()
    t = buf.cpu().numpy().reshape(CTAS, 2, SLOTS)
    return t[: int(np.nonzero(t[:, 0, 2])[0].max()) + 1]


def main() -> int:
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("w8a8", "w4a8"):
        sys.exit(__doc__)
    if not hasattr(_w8a8_launch, "TRACE"):
        sys.exit("humming_aot._w8a8_launch has no TRACE: run from a copy instrumented by tools/trace/apply_ws_trace.py")
    kind, m = sys.argv[1], int(sys.argv[3])
    n, k = (int(v) for v in sys.argv[2].split("x"))
    tile = sys.argv[4] if len(sys.argv) == 5 else None
    t = trace(kind, n, k, m, tile)
    ctas = len(t)
    ns = (t[:, 0, 3] - t[:, 0, 1]).astype(float)
    ghz = float(np.median((t[:, 0, 4] - t[:, 0, 2]).astype(float) / ns))
    print(f"{kind} {n}x{k} M={m} tile={tile}: {ctas} CTAs, {ghz:.3f} GHz, "
          f"span per CTA median {np.median(ns) / 1e3:.1f} us, max {ns.max() / 1e3:.1f}")
    units = t[:, :, 8:].reshape(ctas, 2, 64, 6)
    rows = []  # (unit ordinal, K tiles, loop, barrier, scales, store, to next) in cycles
    for c in range(ctas):
        for wg in range(2):
            if t[c, wg, 2] == 0:
                continue
            count = min(int(t[c, wg, 5]), 64)
            for i in range(count):
                u = units[c, wg, i]
                after = units[c, wg, i + 1][0] if i + 1 < count else t[c, wg, 4]
                rows.append((i, u[5], u[1] - u[0], u[2] - u[1], u[3] - u[2], u[4] - u[3], after - u[4]))
    r = np.array(rows, dtype=float)
    cycles_per_us = ghz * 1e3
    print("phase, us per unit: median / p10 / p90")
    for name, col in (("K loop", 2), ("barrier", 3), ("scales", 4), ("store", 5), ("to next", 6)):
        v = r[:, col] / cycles_per_us
        print(f"  {name:8s} {np.median(v):8.3f} {np.percentile(v, 10):8.3f} {np.percentile(v, 90):8.3f}")
    later = r[r[:, 0] > 0]
    if len(later):  # the first unit's loop also fills the ring
        per_k = np.median(later[:, 2] / later[:, 1]) / cycles_per_us * 1e3
        epilogue = np.median(later[:, 3:7].sum(axis=1)) / cycles_per_us
        print(f"  later units: {per_k:.1f} ns per K tile, epilogue (barrier to next unit) {epilogue:.3f} us")
    print(f"  units per CTA: {int(t[:, 0, 5].min())} to {int(t[:, 0, 5].max())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
