"""The docs' table of finding codes, written from the codes table (``accumlib.CODES``): one row per code,
its kind and its ``meaning``, in the table's order.

    python tools/codes_table.py            rewrites the table in docs/verify.md ("### Findings")
    python tools/codes_table.py --check    exits 1 when the page's table is not the codes table's

A new finding code is one entry in ``accumlib/_verify/codes.py`` (its ``meaning`` included); this tool then
writes its row (CONTRIBUTING.md's map; tests/test_readme.py checks the page against ``rows()``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accumlib import CODES

PAGE = Path(__file__).resolve().parents[1] / "docs" / "verify.md"
HEADER = ["| code | kind | meaning |", "|---|---|---|"]


def rows() -> list[str]:
    """The table's lines: its header, then a row per code."""
    return HEADER + [f"| `{name}` | {code.kind} | {code.meaning} |" for name, code in CODES.items()]


def table_span(lines: list[str]) -> tuple[int, int]:
    """Where the page's table of codes is: from its header to its last row (end exclusive)."""
    start = lines.index(HEADER[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page's table differs")
    args = parser.parse_args(argv)
    lines = PAGE.read_text().split("\n")
    start, end = table_span(lines)
    if args.check:
        same = lines[start:end] == rows()
        print(
            "the table of codes in docs/verify.md is the codes table's" if same else "docs/verify.md: stale"
        )
        return 0 if same else 1
    PAGE.write_text("\n".join(lines[:start] + rows() + lines[end:]))
    print(f"wrote {len(CODES)} codes into {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
