"""The project's documentation as the tests read it: the README (the front door) and the pages of
``docs/`` it leads to. A test that checks what a section says or runs its examples reads ``text()``,
all pages in one string, so it holds wherever the section lives; a test of the README itself reads
``README``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README, then every page of docs/ (its repro scripts and other folders aside)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def text() -> str:
    """Every page, the README first, each starting on a line of its own."""
    return "\n\n".join(p.read_text() for p in pages())


def holding(line_start: str, root: Path = ROOT) -> str:
    """The one page (its path relative to ``root``) with a line that starts with ``line_start``."""
    found = [
        p.relative_to(ROOT).as_posix()
        for p in pages()
        if any(ln.startswith(line_start) for ln in (root / p.relative_to(ROOT)).read_text().splitlines())
    ]
    assert len(found) == 1, f"{line_start!r} starts a line on {found or 'no page'}"
    return found[0]
