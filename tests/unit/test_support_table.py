"""The README's support table is generated from catalog/support.toml (tools/gen_support_table.py):
the committed table must be what the generator writes now, so the two cannot drift apart."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_support_table", REPO / "tools" / "gen_support_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_the_generated_one():
    assert _generator().main(["--check", str(REPO / "README.md")]) == 0, (
        "README.md's support table is stale: run `python tools/gen_support_table.py` and commit README.md"
    )


def test_a_stale_table_is_caught(tmp_path):
    readme = tmp_path / "README.md"
    shutil.copyfile(REPO / "README.md", readme)
    text = readme.read_text()
    start = text.index("<!-- support-matrix:start -->")
    readme.write_text(text[:start] + text[start:].replace("| `wna16_int_symmetric` |", "| `wna16_int_symmetric_x` |", 1))
    assert _generator().main(["--check", str(readme)]) != 0
