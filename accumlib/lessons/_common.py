"""What the lessons share beyond the library: the gallery's seed loops, verified, as a table.

Argument checks live in ``accumlib._checks``, tables in ``accumlib._text``, the digits cache in
``accumlib.data``: the report and the benchmarks use them too, and the library never imports a lesson.
"""

from __future__ import annotations

from .._text import Table

# --- the seed loops of the gallery, verified ----------------------------------------------------------------


def gallery_rows(names: list[str]) -> list[tuple[str, str, str, bool]]:
    """Verify ``accumlib.gallery.GALLERY[name]`` on its own dataset: (name, what it is, codes found, codes as
    expected).
    """
    from ..gallery import GALLERY

    rows = []
    for name in names:
        entry = GALLERY[name]
        codes = sorted(entry.run().codes)
        rows.append(
            (
                name,
                entry.source_note,
                ", ".join(codes) or "none (ok)",
                set(codes) == set(entry.expected_codes),
            )
        )
    return rows


def gallery_table(names: list[str]) -> Table:
    """``gallery_rows`` as a table."""
    return Table(
        ("gallery loop", "what it is", "verify finds", "as the gallery expects"), gallery_rows(names)
    )
