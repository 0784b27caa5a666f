"""The W4A8 packed layout as a consumer thread reads it (tests of humming_aot.w4a8 and its weight
elements): each thread's 16-byte load per 64-channel unit and pair of k32 steps, and the rows and
K of the PTX ISA's 8-bit A fragment its registers hold (m64nNk32 and m16n8k32 alike: warp w rows
16 w + g (+ 8), register r: K 4 t .. 4 t + 3 (+ 16))."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

LANES = (0, 5, 18, 31)  # lanes of every lane group g and lane-in-group t between them


@dataclasses.dataclass(frozen=True)
class FragmentStep:
    """One thread's K step kk of K tile k_tile: its two packed words (registers 0 and 1, then 2 and
    3) and the rows of its registers (rows[r & 1]) and their first K (k0(r))."""

    k_tile: int
    kk: int
    lane: int
    rows: tuple[int, int]
    words: tuple[int, int]

    def k0(self, r: int) -> int:
        return self.k_tile * 128 + 32 * self.kk + 16 * (r >> 1) + 4 * (self.lane % 4)


def fragment_steps(w: torch.Tensor, lanes=LANES) -> Iterator[FragmentStep]:
    """Every K tile, unit, warp, lane of `lanes` and K step of packed codes (k_tiles, n / 64, 4096),
    as the kernels load them: the 16 bytes at ((w * 2 + h) * 32 + lane) * 16 of a unit hold steps
    2 h and 2 h + 1, two words each."""
    k_tiles, units, _ = w.shape
    for kt in range(k_tiles):
        for unit in range(units):
            block = bytes(w[kt, unit].tolist())
            for warp in range(4):
                for lane in lanes:
                    g = lane // 4
                    rows = (unit * 64 + 16 * warp + g, unit * 64 + 16 * warp + g + 8)
                    for kk in range(4):
                        h, s = kk // 2, kk % 2
                        base = ((warp * 2 + h) * 32 + lane) * 16
                        words = [int.from_bytes(block[base + 4 * i: base + 4 * i + 4], "little") for i in range(4)]
                        yield FragmentStep(kt, kk, lane, rows, (words[2 * s], words[2 * s + 1]))
