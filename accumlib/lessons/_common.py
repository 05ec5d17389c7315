"""What every lesson shares: argument checks, tables that render as HTML, the digits cache, error formatting.

Checks name the argument, the rule and the value, like the loops' own checks, and run
before any work starts.

>>> check_int("accum_steps", 0, low=1)
Traceback (most recent call last):
...
ValueError: accum_steps must be an integer >= 1 (got 0)
>>> check_choice("norm", "layer", ("batch", "group"))
Traceback (most recent call last):
...
ValueError: norm must be one of 'batch', 'group' (got 'layer')
>>> print(Table(("k", "ratio"), [(1, 1.0), (16, 16.0)]))
k   ratio
--  -----
1   1.0
16  16.0
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence
from typing import Any

from .._text import html_table, text_table
from ..tolerances import FLOAT32_RTOL

N_DIGITS = 1797  # scikit-learn's digits


def check_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None, why: str = ""
) -> int:
    """``value`` must be an integer (not a bool) within ``low..high``; ``why`` says where a bound comes from."""
    rule = (
        "an integer"
        + (f" >= {low}" if low is not None and high is None else "")
        + (f" between {low} and {high}" if low is not None and high is not None else "")
        + (f" <= {high}" if high is not None and low is None else "")
    )
    suffix = f"; {why}" if why else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {rule}{suffix} (got {value!r} of type {type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {rule}{suffix} (got {value!r})")
    return int(value)


def check_float(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False
) -> float:
    """``value`` must be a real number within the bounds (``low_open``: strictly above ``low``)."""
    op = ">" if low_open else ">="
    rule = (
        "a number"
        + (f" {op} {low}" if low is not None else "")
        + (f" and <= {high}" if high is not None else "")
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise ValueError(f"{name} must be {rule} (got {value!r})")
    if low is not None and (value <= low if low_open else value < low) or high is not None and value > high:
        raise ValueError(f"{name} must be {rule} (got {value!r})")
    return float(value)


def check_ints(
    name: str, values: Any, *, low: int | None = None, high: int | None = None, why: str = ""
) -> tuple[int, ...]:
    """A non-empty sequence of integers, each checked like ``check_int``; sorted, duplicates dropped."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of integers (got {values!r})")
    return tuple(
        sorted({check_int(f"{name}[{i}]", v, low=low, high=high, why=why) for i, v in enumerate(values)})
    )


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)} (got {value!r})")
    return value


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


# --- data and numbers every lesson uses ---------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _all_digits(seed: int) -> Any:
    from ..data import digits

    return digits(seed=seed)


def digits_subset(n: int | None = None, seed: int = 0) -> Any:
    """``accumlib.data.digits(n, seed=seed)`` (the same items in the same order), read from disk once per seed."""
    from torch.utils.data import Subset

    data = _all_digits(seed)
    if n is None:
        return data
    check_int("n", n, low=1, high=len(data), why="digits holds that many images")
    return Subset(data, range(n))


def fmt_error(rel_error: float) -> str:
    """A relative error as printed in the lessons: float32 rounding shows as a bound, stable across machines.

    >>> fmt_error(3e-8), fmt_error(0.51296)
    ('<= 1e-04 (float32 rounding)', '0.513')
    """
    if rel_error <= FLOAT32_RTOL:
        return f"<= {FLOAT32_RTOL:.0e} (float32 rounding)"
    return f"{rel_error:.3g}"


# --- the seed loops of the gallery, verified ----------------------------------------------------------------


def gallery_rows(names: list[str]) -> list[tuple[str, str, str, bool]]:
    """Verify ``accumlib.gallery.GALLERY[name]`` on its own dataset: (name, what it is, codes found, codes as expected)."""
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
