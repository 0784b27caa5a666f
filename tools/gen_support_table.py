"""Print the support matrix as Markdown, or rewrite the README section that holds it.

    python tools/gen_support_table.py                  # print the table
    python tools/gen_support_table.py --write README.md  # rewrite between the support-matrix markers
    python tools/gen_support_table.py --check README.md  # exit 1 when the README is out of date (CI)

The table comes from catalog/support.toml through humming_aot.support, so the README never restates
a rule by hand.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from humming_aot.support import render_support_markdown, replace_support_section  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="README", help="rewrite the marked section in place")
    group.add_argument("--check", type=Path, metavar="README", help="fail when the marked section is stale")
    args = parser.parse_args(argv)
    if args.write is None and args.check is None:
        sys.stdout.write(render_support_markdown())
        return 0
    path = args.write or args.check
    text = path.read_text()
    try:
        updated = replace_support_section(text)
    except ValueError as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if updated != text:
            print(f"{path}: the support table is out of date: run python tools/gen_support_table.py --write {path}",
                  file=sys.stderr)
            return 1
        return 0
    if updated != text:
        path.write_text(updated)
        print(f"{path}: support table updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
