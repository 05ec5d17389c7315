"""Exercises graded by ``accumlib.verify``: feedback that leads to the answer without giving it.

A lesson declares its exercises as ``Exercise`` objects; the notebook's exercise cell holds
the *starting* loop (which fails) and ends with ``EXERCISE.check(train_fn)``. The grade
shows verify's verdict and, for a failing loop, the finding's *message* (what went wrong)
without verify's *fix* (which would be the answer), plus the hint written for the
learner's likely mistake, folded until clicked. Solutions live in ``notebooks/solutions/``;
tests check that every starting cell fails with a hint and every solution passes.

>>> ex = Exercise("demo", "a demo", hints={"unscaled-sum": "divide by something"})
>>> ex.hint_for(["unscaled-sum"]), ex.hint_for(["early-step"])[:24]
('divide by something', 'Compare your loop with t')
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._common import check_int

GENERIC_HINT = (
    "Compare your loop with the identity at the top of the lesson: which items does each "
    "micro-batch's loss average over, and what should every item weigh in the large batch?"
)


@dataclass(frozen=True, repr=False)
class Grade:
    """What ``Exercise.check`` hands back: the verdict, the codes verify found, and the hint."""

    exercise: str
    ok: bool
    codes: tuple[str, ...]
    messages: tuple[str, ...]
    hint: str
    report: Any = field(repr=False, default=None)
    error: str = ""
    stages: tuple[str, ...] = ()  # the hint in stages, each folded under the one before (one stage: the hint)
    costs: tuple[str, ...] = ()  # findings of kind cost: right, but paid for

    def __str__(self) -> str:
        if self.error:
            return f"{self.exercise}: your code raised {self.error}\n(hint: {self.hint})"
        if self.ok:
            return f"{self.exercise}: passes. Every optimizer step matched the true large-batch gradient." + "".join(
                f"\nAt a cost: {c}" for c in self.costs)
        found = "\n".join(f"  - [{c}] {m}" for c, m in zip(self.codes, self.messages))
        return f"{self.exercise}: not yet. accumlib.verify found:\n{found}\nA hint is folded below the verdict in JupyterLab; print(grade.hint) shows it here."

    __repr__ = __str__  # the plain-text form keeps the hint folded too

    def _repr_html_(self) -> str:
        if self.ok:
            return (f"<p style='color:#0072B2'><b>&#10004; {html.escape(self.exercise)}: passes.</b> "
                    "Every optimizer step matched the true large-batch gradient.</p>"
                    + "".join(f"<p>At a cost: {html.escape(c)}</p>" for c in self.costs))
        if self.error:
            head = f"<p><b>&#10008; {html.escape(self.exercise)}: your code raised</b> <code>{html.escape(self.error)}</code></p>"
        else:
            items = "".join(f"<li><code>{html.escape(c)}</code>: {html.escape(m)}</li>" for c, m in zip(self.codes, self.messages))
            head = f"<p><b>&#10008; {html.escape(self.exercise)}: not yet.</b> accumlib.verify found:</p><ul>{items}</ul>"
        stages = self.stages or (self.hint,)
        folded = ""
        for i in range(len(stages), 0, -1):  # each stage folded inside the one before it
            summary = "Hint" if len(stages) == 1 else ("Hint 1" if i == 1 else f"Still stuck? Hint {i}")
            folded = f"<details><summary>{summary}</summary><p>{html.escape(stages[i - 1])}</p>{folded}</details>"
        return head + folded


@dataclass(frozen=True)
class Exercise:
    """One exercise: which task its loop runs on, and a hint per finding code.

    The learner's loop runs under ``accumlib.verify`` on ``task``'s model, data and losses,
    with ``accum_steps`` and ``batch_size``; ``make_model``/``make_dataset`` replace the task's
    own (a calibrated model, a dataset sized so the windows come out as the lesson needs).
    ``run(train_fn)`` replaces the whole call for loops of another shape (a GAN's two models).
    """

    name: str
    title: str
    task: str = "mlp-digits"
    accum_steps: int = 4
    batch_size: int | None = None
    hints: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)  # a tuple: hints in stages
    default_hint: str = GENERIC_HINT
    make_model: Callable[[], Any] | None = None
    make_dataset: Callable[[], Any] | None = None
    run: Callable[[Callable[..., Any]], Any] | None = None

    def __post_init__(self) -> None:
        check_int("accum_steps", self.accum_steps, low=1)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, low=1)

    def hint_for(self, codes: Any) -> str | tuple[str, ...]:
        for code in codes:
            if code in self.hints:
                return self.hints[code]
        return self.default_hint

    def verify(self, train_fn: Callable[..., Any]) -> Any:
        if self.run is not None:
            return self.run(train_fn)
        import accumlib

        t = accumlib.get_task(self.task)
        return accumlib.verify(
            train_fn, model=self.make_model() if self.make_model else t.make_model(0),
            dataset=self.make_dataset() if self.make_dataset else t.make_dataset(), item_losses=t.item_losses,
            accum_steps=self.accum_steps, batch_size=self.batch_size or t.batch_size, collate_fn=t.collate_fn,
        )

    def check(self, train_fn: Any) -> Grade:
        """Grade the learner's ``train_fn(model, optimizer, loader)``: verify's verdict plus a matched hint."""
        if not callable(train_fn):
            raise TypeError(f"train_fn must be a function train_fn(model, optimizer, loader) (got {type(train_fn).__name__})")
        try:
            report = self.verify(train_fn)
        except Exception as e:  # the learner's code: show the error as feedback, not a traceback wall
            return self.grade(error=getattr(e, "feedback", "") or f"{type(e).__name__}: {e}")
        return self.grade(report)

    def grade(self, report: Any = None, error: str = "") -> Grade:
        """The Grade of a verify ``report``, or of a loop that raised ``error`` (``type: message``)."""
        if error:
            return Grade(self.name, False, (), (), _text(self.hints.get("error", self.default_hint)), None, error,
                         _stages(self.hints.get("error", self.default_hint)))
        bad = [f for f in report.findings if f.severity in ("bug", "limit")]  # a note or a cost leaves it ok
        codes = tuple(f.code for f in bad)
        hint = "" if report.ok else self.hint_for(codes)
        costs = tuple(f"[{f.code}] {f.message}" for f in report.findings if f.severity == "cost")
        return Grade(self.name, bool(report.ok), codes, tuple(f.message for f in bad), _text(hint), report, "",
                     _stages(hint), costs)


def _stages(hint: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(hint) if isinstance(hint, tuple) else (hint,) if hint else ()


def _text(hint: str | tuple[str, ...]) -> str:
    return "\n".join(f"({i}) {h}" for i, h in enumerate(hint, 1)) if isinstance(hint, tuple) else hint
