"""The steps the instrumenting scripts share (apply_trace.py, apply_ws_trace.py,
apply_ws16_trace.py): take the copy of the tree named on the command line, never a git checkout,
and replace anchored source text, failing with the anchor's text when the source has moved on."""
import pathlib
import sys


def copy_root(script: str) -> pathlib.Path:
    """The tree to instrument, from sys.argv; exits on a wrong command line or a git checkout."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: {script} COPY_OF_THE_TREE")
    root = pathlib.Path(sys.argv[1])
    if (root / ".git").exists():
        sys.exit(f"{root} is a git checkout: instrument a copy of the tree, not the working tree")
    return root


def patch(root: pathlib.Path, path: str, pairs, script: str) -> None:
    """Replace each anchor a by b in root / path; (a, b, n): the anchor occurs n times, each replaced."""
    p = root / path
    s = p.read_text()
    for a, b, *times in pairs:
        n = times[0] if times else 1
        if s.count(a) != n:
            sys.exit(f"{path}: anchor found {s.count(a)} times, expected {n} (update tools/trace/{script}):\n{a}")
        s = s.replace(a, b)
    p.write_text(s)
