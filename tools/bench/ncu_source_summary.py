"""Where a kernel's warps wait, from ncu's per-instruction source counters.

    ncu --csv --page source --print-source sass --section SourceCounters ... > src.csv
    python3 tools/bench/ncu_source_summary.py src.csv [--top 30]      # (a .gz file is read too)

ncu's source page gives, per SASS instruction of each profiled kernel, its stall samples by
reason and how many times a warp executed it. This prints, per kernel:
- the share of every stall reason over all samples;
- the samples by execution count: instructions executed the same number of times run in the same
  loop (in a persistent warp-specialized kernel a count of consumer warps x tiles is the per-tile
  code, consumer warps x K tiles the K loop, a producer's counts are a few times smaller), so the
  rows tell which part of the kernel the warps wait in;
- the instructions with the most samples, and for each long-scoreboard wait (a warp waiting on a
  global or local load) the load that last wrote one of the registers it reads, searched back
  from it in address order (the usual case: the load a few instructions before its use).

Standard library only (the GPU box's ncu output is read here, on a machine without ncu).
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_STALL = "stall_"
# the loads a long-scoreboard wait is on: global, local and generic ones (shared memory and
# constants are short-scoreboard)
_LONG_LOADS = re.compile(r"^(LDG|LDL|LD|ATOMG|ATOM)$")
_REGISTER = re.compile(r"\bU?R\d+\b")


@dataclass
class Instruction:
    address: str
    sass: str
    samples: int
    executed: int
    stalls: dict[str, int] = field(default_factory=dict)

    def opcode(self) -> str:
        words = self.sass.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0].split(".")[0] if words else ""

    def written(self) -> set[str]:
        """The registers the instruction writes: its first operand (SASS puts the destination first)."""
        words = self.sass.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if len(words) < 2:
            return set()
        first = words[1].rstrip(",")
        return set(_REGISTER.findall(first))

    def read(self) -> set[str]:
        words = self.sass.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        operands = " ".join(words[1:]).split(",")
        # stores read every operand; other instructions all but the destination
        sources = operands if self.opcode().startswith(("ST", "RED", "ATOM")) else operands[1:]
        return {r for part in sources for r in _REGISTER.findall(part)} - {"RZ", "URZ"}


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(text) if text.isdigit() else 0


def read_kernels(text: str) -> dict[str, list[Instruction]]:
    """Each kernel's instructions, from ncu's CSV source page (one "Kernel Name" line, then a header
    row and the instructions' rows, per kernel; lines before the first are ncu's log)."""
    kernels: dict[str, list[Instruction]] = {}
    name = None
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            name, header = row[1], None
            kernels.setdefault(name, [])
            continue
        if name is None:
            continue
        if row[0] == "Address":
            header = row
            continue
        if header is None or len(row) < len(header):
            continue
        cells = dict(zip(header, row))
        stalls = {key[len(_STALL):]: _int(value) for key, value in cells.items()
                  if key.startswith(_STALL) and "Not Issued" not in key}
        kernels[name].append(Instruction(
            address=cells["Address"], sass=cells["Source"].strip(),
            samples=_int(cells.get("Warp Stall Sampling (All Samples)", "0")),
            executed=_int(cells.get("Instructions Executed", "0")), stalls=stalls))
    return kernels


def producing_load(instructions: list[Instruction], index: int, window: int = 200) -> Instruction | None:
    """The global or local load that last wrote one of the registers instruction `index` reads,
    searched back in address order (at most `window` instructions): of each register read, its
    nearest earlier writer; the nearest of those that is such a load, or None."""
    wanted = instructions[index].read()
    for earlier in reversed(instructions[max(0, index - window):index]):
        hit = earlier.written() & wanted
        if hit:
            if _LONG_LOADS.match(earlier.opcode()):
                return earlier
            wanted -= hit
            if not wanted:
                return None
    return None


def summarize(name: str, instructions: list[Instruction], top: int) -> str:
    total = sum(i.samples for i in instructions)
    lines = [f"== {name}", f"samples {total}, instructions {len(instructions)}"]
    if not total:
        return "\n".join(lines + ["(no samples)"])
    reasons = collections.Counter()
    for i in instructions:
        reasons.update(i.stalls)
    lines.append("stall reasons: " + ", ".join(f"{reason} {100 * count / total:.1f} %"
                                               for reason, count in reasons.most_common(10) if count))
    by_count: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for i in instructions:
        by_count[i.executed].update(i.stalls)
    lines.append("samples by execution count (instructions executed as often run in the same loop):")
    ranked = sorted(by_count.items(), key=lambda item: -sum(item[1].values()))
    for executed, counter in ranked[:12]:
        share = sum(counter.values())
        if not share:
            continue
        detail = ", ".join(f"{reason} {100 * count / total:.1f}" for reason, count in counter.most_common(4) if count)
        lines.append(f"  x{executed:>10}: {100 * share / total:5.1f} % ({detail})")
    lines.append(f"top {top} instructions (samples, share, executed, SASS, main reasons; long_sb: its load):")
    order = sorted(range(len(instructions)), key=lambda k: -instructions[k].samples)
    for k in order[:top]:
        i = instructions[k]
        if not i.samples:
            break
        main = ", ".join(f"{reason} {count}" for reason, count in
                         sorted(i.stalls.items(), key=lambda item: -item[1])[:2] if count)
        lines.append(f"  {i.samples:7d} {100 * i.samples / total:5.1f} % x{i.executed:<9} {i.address[-6:]} "
                     f"{i.sass[:64]:64s} {main}")
        if i.stalls.get("long_sb", 0) * 2 >= i.samples:
            load = producing_load(instructions, k)
            if load is not None:
                lines.append(f"           <- {load.address[-6:]} {load.sass[:70]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="ncu --csv --page source output (.gz read too)")
    parser.add_argument("--top", type=int, default=30, help="instructions listed per kernel")
    args = parser.parse_args(argv)
    raw = args.csv.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8", "replace")
    kernels = read_kernels(text)
    if not kernels:
        print(f"{args.csv}: no 'Kernel Name' line: not ncu's CSV source page", file=sys.stderr)
        return 1
    print("\n\n".join(summarize(name, instructions, args.top) for name, instructions in kernels.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
