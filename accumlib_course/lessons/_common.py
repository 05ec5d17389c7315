"""What the lessons share beyond the library: the gallery's seed loops, verified, as a table; the
framework runs made without a full garbage collection per run.

Argument checks live in ``accumlib.checks``, tables in ``accumlib.text``, the digits cache in
``accumlib.data``: the report and the benchmarks use them too, and the library never imports a lesson.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from accumlib.text import Table

# --- the seed loops of the gallery, verified ----------------------------------------------------------------


def gallery_rows(names: list[str]) -> list[tuple[str, str, str, bool]]:
    """Verify ``accumlib_course.gallery.GALLERY[name]`` on its own dataset: (name, what it is, codes found,
    codes as expected).
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


# --- framework runs without a full collection each --------------------------------------------------------


@contextlib.contextmanager
def long_lived_objects_frozen() -> Iterator[None]:
    """Run the block with every object alive now out of the garbage collector's sight (``gc.freeze``),
    and back in it afterwards (``gc.unfreeze``).

    Why: every ``Trainer.train()`` starts with Accelerate's ``free_memory``, a full ``gc.collect()``. With
    torch and Transformers imported, the kernel holds a few million objects; that collection took 0.33 to
    0.52 s per run on 2 cores (lesson 9 makes 11 runs, lesson 10's framework table 7). The lessons' models
    are tiny and on the CPU: the collection frees nothing that matters, and what the block itself makes
    is still collected. A caller that froze objects itself keeps its state (the block does nothing then).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
