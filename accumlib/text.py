"""The one table renderer: plain text for terminals and logs, HTML for notebooks.

>>> print("\\n".join(text_table(("loop", "k"), [("naive", "4")])))
loop   k
-----  -
naive  4
>>> print(Table(("k", "ratio"), [(1, 1.0), (16, 16.0)]))
k   ratio
--  -----
1   1.0
16  16.0
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from .tolerances import FLOAT32_RTOL


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


class Table:
    """Rows shown as an HTML table in JupyterLab and as fixed-width text everywhere else.

    ``str(table)`` is the text form (papermill logs, the terminal, tests); notebooks display
    the object, and JupyterLab picks ``_repr_html_``, which never wraps like long text does.
    """

    def __init__(self, header: Sequence[Any], rows: Sequence[Sequence[Any]], caption: str = ""):
        self.header = tuple(str(h) for h in header)
        self.rows = [tuple(str(c) for c in r) for r in rows]
        self.caption = caption
        bad = [r for r in self.rows if len(r) != len(self.header)]
        if bad:
            raise ValueError(
                f"rows must have {len(self.header)} cells like the header (got {len(bad[0])}: {bad[0]!r})"
            )

    def __str__(self) -> str:
        return "\n".join(([self.caption] if self.caption else []) + text_table(self.header, self.rows))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_table(self.header, self.rows, self.caption)


def fmt_error(rel_error: float, tolerance: float = FLOAT32_RTOL, rounding: str = "float32 rounding") -> str:
    """A relative error as printed in the lessons: rounding (at most ``tolerance``) shows as a bound, stable
    across machines; larger errors with 3 digits.

    >>> fmt_error(3e-8), fmt_error(0.51296), fmt_error(1.7e-3, 1e-2, "autocast rounding")
    ('<= 1e-04 (float32 rounding)', '0.513', '<= 1e-02 (autocast rounding)')
    """
    if rel_error <= tolerance:
        return f"<= {tolerance:.0e} ({rounding})"
    return f"{rel_error:.3g}"
