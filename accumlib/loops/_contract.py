"""What a reference loop promises: verify's verdict on each kind of task, and the task fields it takes.

Every loop file ends with a ``CONTRACT``; ``accumlib.loops`` collects them into one registry,
and the reference table (``accumlib.reference``), the papermill report, the benchmarks and
the tests all read the expected verdicts from there, so a loop's promise is written once,
beside the identity it implements.

A verdict is what ``accumlib.verify`` says of one epoch of the loop (``accumlib.harness.trace_loop``):
the codes of its findings (``accumlib.CODES``), sorted, and ``()`` for a run it passes with nothing to
say. The reference loops speak the vocabulary users' loops are judged in: ``naive`` is
``unscaled-sum``, ``normalized`` on a ragged tail ``tail-misscaled``. A loop under autocast
(``low_precision``) is judged as verify judges any such loop: against a replay of its windows in
its own autocast dtype, so ``()`` there means "exact to that dtype's rounding".

The kinds of task are the built-in tasks' tags: full windows of equal micro-batches (no tag),
a last partial window whose last micro-batch is smaller too (``ragged-tail``), micro-batches
holding different token counts (``token-counts``) and BatchNorm (``batchnorm``: per-micro-batch
statistics, which no accumulation loop can merge).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._verify import CODES

# A task with several tags takes the verdict of the first of these it has: BatchNorm spoils
# every step, token counts every window, a ragged tail only the last one.
KINDS = ("batchnorm", "token-counts", "ragged-tail", "full-windows")

# The task fields a loop may take by keyword (``Task.count_items``, ``Task.merge``).
TASK_KWARGS = ("count_items", "merge")


Verdict = tuple[str, ...]  # verify's codes for a run, sorted; () for a run it passes with nothing to say


@dataclass(frozen=True)
class Contract:
    """A loop's expected verdict per kind of task, and the task fields it takes by keyword.

    ``order`` places the loop in the reference table (``None``: a variant the lessons run,
    kept out of the table because another loop already stands for it). Each verdict is a tuple of
    codes of ``accumlib.CODES``, kept sorted as ``trace_loop`` gives them.

    >>> c = Contract(full_windows=(), ragged_tail=("tail-misscaled", "mean-of-means"),
    ...              token_counts=("mean-of-means",), batchnorm=("batchnorm",), order=2)
    >>> c.expected(("ragged-tail",)), c.expected(())
    (('mean-of-means', 'tail-misscaled'), ())
    """

    full_windows: Verdict
    ragged_tail: Verdict
    token_counts: Verdict
    batchnorm: Verdict
    order: int | None
    takes: tuple[str, ...] = ()
    # the loop runs under autocast: verify judges it against a replay in its autocast dtype
    low_precision: bool = False

    def __post_init__(self) -> None:
        for kind in KINDS:
            name = kind.replace("-", "_")
            verdict = getattr(self, name)
            if not isinstance(verdict, tuple) or not all(isinstance(c, str) for c in verdict):
                raise TypeError(
                    f"{name} must be a tuple of verify's codes, () for a run verify passes (got {verdict!r})"
                )
            unknown = sorted(set(verdict) - set(CODES))
            if unknown:
                raise ValueError(f"{name} must hold codes of accumlib.CODES (got {unknown})")
            object.__setattr__(self, name, tuple(sorted(set(verdict))))  # compared with a sorted verdict
        unknown = sorted(set(self.takes) - set(TASK_KWARGS))
        if unknown:
            raise ValueError(f"takes must name task fields among {TASK_KWARGS} (got {unknown})")

    @property
    def role(self) -> str:
        """What kind of loop the verdicts make it, the role figures style it by: run under autocast
        "alternative" (passed against its own dtype's replay); passed even with BatchNorm the large batch
        itself ("oracle"); passed on every other kind of task "correct"; a bug on full windows "buggy";
        anything else (right on full windows only) "other".

        >>> c = Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm=("batchnorm",), order=9)
        >>> from dataclasses import replace
        >>> c.role, replace(c, full_windows=("unscaled-sum",)).role
        ('correct', 'buggy')
        """
        verdicts = {kind: getattr(self, kind.replace("-", "_")) for kind in KINDS}
        if self.low_precision:  # passed against its own dtype's replay: close to the oracle, not it
            return "alternative"
        if not any(verdicts.values()):
            return "oracle"
        if not any(v for kind, v in verdicts.items() if kind != "batchnorm"):
            return "correct"
        return "buggy" if any(CODES[c].kind == "bug" for c in self.full_windows) else "other"

    def expected(self, tags: Iterable[str]) -> Verdict:
        """The verdict promised on a task with these tags."""
        tags = set(tags)
        kind = next((k for k in KINDS if k in tags), "full-windows")
        return getattr(self, kind.replace("-", "_"))

    def kwargs_for(self, task: Any) -> dict[str, Any]:
        """The keyword arguments this loop takes from ``task`` (its item counter, its merge)."""
        return {name: getattr(task, name) for name in self.takes}
