"""tools/bench/ncu_source_summary.py on a small source page written here in ncu's CSV layout: the
stall shares, the samples by execution count, and the load a long-scoreboard wait is on (the
register's last writer, a shared load not taken for a global one)."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("ncu_source_summary", ROOT / "tools/bench/ncu_source_summary.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_long_sb", "stall_short_sb", "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [  # address, SASS, samples, executed, long_sb, short_sb, wait
    ("0x10", "LDG.E R7, desc[UR4][R2.64]", 2, 800, 0, 0, 2),
    ("0x20", "LDS R9, [R3]", 1, 800, 0, 0, 1),
    ("0x30", "IADD3 R11, R5, 0x1, RZ", 0, 800, 0, 0, 0),
    ("0x40", "FMUL R9, R7, R9", 60, 800, 58, 0, 2),  # waits on 0x10's R7, not 0x20's R9
    ("0x50", "FFMA R12, R9, R11, R12", 10, 800, 0, 10, 0),
    ("0x60", "LDL R13, [R1+0x4]", 0, 100, 0, 0, 0),
    ("0x70", "@!P0 IMAD R14, R13, 0x4, RZ", 27, 100, 25, 0, 2),  # a spill's reload
]


def _page(kernel: str = "gemm_test_kernel") -> str:
    out = io.StringIO()
    out.write("==PROF== Connected to process 1\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["Kernel Name", kernel])
    writer.writerow(HEADER)
    for address, sass, samples, executed, long_sb, short_sb, wait in ROWS:
        writer.writerow([address, f"      {sass}", samples, samples - 1, f"{executed:,}", long_sb, short_sb, wait, 0])
    return out.getvalue()


def test_reads_the_page_and_finds_the_loads_waited_on(tmp_path, capsys):
    tool = _tool()
    kernels = tool.read_kernels(_page())
    (instructions,) = kernels.values()
    assert [i.samples for i in instructions] == [2, 1, 0, 60, 10, 0, 27]
    assert instructions[3].executed == 800 and instructions[3].stalls == {"long_sb": 58, "short_sb": 0, "wait": 2}
    assert tool.producing_load(instructions, 3).address == "0x10"
    assert tool.producing_load(instructions, 6).sass == "LDL R13, [R1+0x4]"
    assert tool.producing_load(instructions, 4) is None  # its R9 comes from FMUL, R11 from IADD3

    path = tmp_path / "src.csv.gz"
    path.write_bytes(gzip.compress(_page().encode()))
    assert tool.main([str(path), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "samples 100, instructions 7" in text
    assert "long_sb 83.0 %" in text and "short_sb 10.0 %" in text
    assert "x       800:  73.0 %" in text and "x       100:  27.0 %" in text
    assert "<- 0x10 LDG.E R7" in text and "<- 0x60 LDL R13" in text


def test_refuses_what_is_not_a_source_page(tmp_path, capsys):
    path = tmp_path / "raw.csv"
    path.write_text('"ID","Kernel Name","Metric Name"\n"0","k","dram__bytes_read.sum"\n')
    assert _tool().main([str(path)]) == 1
    assert "not ncu's CSV source page" in capsys.readouterr().err
