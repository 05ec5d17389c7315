"""What a reference loop promises: its verdict on each kind of task, and the task fields it takes.

Every loop file ends with a ``CONTRACT``; ``accumlib.loops`` collects them into one registry,
and the reference table (``accumlib.reference``), the papermill report, the benchmarks and
the tests all read the expected verdicts from there, so a loop's promise is written once,
beside the identity it implements.

A verdict names what ``accumlib.harness.classify`` sees when the loop's steps are compared
with the true large-batch gradient:

- ``exact``: every step matches to float32 rounding;
- ``close (bf16)``: every step matches to bfloat16 rounding (autocast), no closer;
- ``off by ~k``: every step's norm is about the window's micro-batch count times the truth;
- ``not exact``: anything else.

The kinds of task are the built-in tasks' tags: full windows of equal micro-batches (no tag),
a last partial window (``ragged-tail``), micro-batches holding different token counts
(``token-counts``) and BatchNorm (``batchnorm``: per-micro-batch statistics, which no
accumulation loop can merge).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

EXACT, CLOSE, OFF_BY_K, WRONG = "exact", "close (bf16)", "off by ~k", "not exact"
VERDICTS = (EXACT, CLOSE, OFF_BY_K, WRONG)

# A task with several tags takes the verdict of the first of these it has: BatchNorm spoils
# every step, token counts every window, a ragged tail only the last one.
KINDS = ("batchnorm", "token-counts", "ragged-tail", "full-windows")

# The task fields a loop may take by keyword (``Task.count_items``, ``Task.merge``).
TASK_KWARGS = ("count_items", "merge")


@dataclass(frozen=True)
class Contract:
    """A loop's expected verdict per kind of task, and the task fields it takes by keyword.

    ``order`` places the loop in the reference table (``None``: a variant the lessons run,
    kept out of the table because another loop already stands for it).

    >>> c = Contract(full_windows=EXACT, ragged_tail=WRONG, token_counts=WRONG, batchnorm=WRONG, order=2)
    >>> c.expected(("ragged-tail",)), c.expected(())
    ('not exact', 'exact')
    """

    full_windows: str
    ragged_tail: str
    token_counts: str
    batchnorm: str
    order: int | None
    takes: tuple[str, ...] = ()
    low_precision: bool = False  # judged against bfloat16 rounding: the loop runs under autocast

    def __post_init__(self) -> None:
        for kind in KINDS:
            verdict = getattr(self, kind.replace("-", "_"))
            if verdict not in VERDICTS:
                raise ValueError(f"{kind.replace('-', '_')} must be one of {VERDICTS} (got {verdict!r})")
        unknown = sorted(set(self.takes) - set(TASK_KWARGS))
        if unknown:
            raise ValueError(f"takes must name task fields among {TASK_KWARGS} (got {unknown})")

    @property
    def role(self) -> str:
        """What kind of loop the verdicts make it, the role figures style it by: exact even with
        BatchNorm is the large batch itself ("oracle"); exact on every other kind of task "correct";
        close to low-precision rounding "alternative"; off by ~k on full windows "buggy"; anything else
        (exact on full windows only) "other".

        >>> c = Contract(full_windows=EXACT, ragged_tail=EXACT, token_counts=EXACT, batchnorm=WRONG, order=9)
        >>> from dataclasses import replace
        >>> c.role, replace(c, full_windows=OFF_BY_K).role
        ('correct', 'buggy')
        """
        verdicts = {kind: getattr(self, kind.replace("-", "_")) for kind in KINDS}
        if all(v == EXACT for v in verdicts.values()):
            return "oracle"
        if all(v == EXACT for kind, v in verdicts.items() if kind != "batchnorm"):
            return "correct"
        if self.low_precision or self.full_windows == CLOSE:
            return "alternative"
        return "buggy" if self.full_windows == OFF_BY_K else "other"

    def expected(self, tags: Iterable[str]) -> str:
        """The verdict promised on a task with these tags."""
        tags = set(tags)
        kind = next((k for k in KINDS if k in tags), "full-windows")
        return str(getattr(self, kind.replace("-", "_")))

    def kwargs_for(self, task: Any) -> dict[str, Any]:
        """The keyword arguments this loop takes from ``task`` (its item counter, its merge)."""
        return {name: getattr(task, name) for name in self.takes}
