"""The one table renderer: plain text for terminals and logs, HTML for notebooks.

>>> print("\\n".join(text_table(("loop", "k"), [("naive", "4")])))
loop   k
-----  -
naive  4
"""

from __future__ import annotations

import html
from collections.abc import Sequence


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, a rule under the header; one string per line."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(head), line(tuple("-" * w for w in widths))] + [line(r) for r in rows]


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    """The same table as HTML, every cell escaped."""
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
