"""Exercises graded by ``accumlib.verify``: feedback that leads to the answer without giving it.

A lesson declares its exercises as ``Exercise`` objects; the notebook's exercise cell holds
the *starting* loop (which fails) and ends with ``EXERCISE.check(train_fn)``. The grade
shows verify's verdict and, for a failing loop, the finding's *message* (what went wrong)
without verify's *fix* (which would be the answer), plus the hint written for the
learner's likely mistake, folded until clicked. Solutions live in ``notebooks/solutions/``;
tests check that every starting cell fails with a hint and every solution passes.

Beside verify's verdict, an exercise can grade what verify leaves to the loop (``_grading``):
the exact epoch loss it reports (``logged_loss``), that it clips every step before the step
(``clip_each_step``), and, always, parameters it froze. Every verdict names its steps. A hint
may come in stages (a nudge, a stronger hint, the solution), each folded under the one before;
``<code>@last`` holds the hint for a finding that concerns only the last step.

>>> ex = Exercise("demo", "a demo", hints={"unscaled-sum": "divide by something"})
>>> ex.hint_for(["unscaled-sum"]), ex.hint_for(["early-step"])[:24]
('divide by something', 'Compare your loop with t')
"""

from __future__ import annotations

import html
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accumlib.checks import check_int

from ._grading import Watch, clip_checks, frozen_check, logged_loss_checks, unexplained_check, where

GENERIC_HINT = (
    "Compare your loop with the identity at the top of the lesson: which items does each micro-batch's loss "
    "average over, and what should every item weigh in the large batch?"
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
    where: tuple[str, ...] = ()  # per code: the steps it concerns, in words ("the last step (step 3)")
    call: str = ""  # the exercise as the notebook cell names it ("why.EXERCISE")

    def __str__(self) -> str:
        if self.error:
            return f"{self.exercise}: your code raised {self.error}\n(hint: {self.hint})"
        if self.ok:
            return (
                f"{self.exercise}: passes. Every optimizer step matched the true large-batch gradient."
                + "".join(f"\nAt a cost: {c}" for c in self.costs)
            )
        found = "\n".join(
            f"  - [{c}]{_at(w)} {m}" for c, m, w in zip(self.codes, self.messages, self._where())
        )
        get = (
            f"grade = {self.call}.check(train_fn)"
            if self.call
            else "put 'grade = ' in front of the check on the cell's last line, run it"
        )
        return (
            f"{self.exercise}: not yet. accumlib.verify found:\n{found}\nIn JupyterLab the hints are folded "
            f"below the verdict. Here: {get}, then print(grade.hint)."
        )

    def _where(self) -> tuple[str, ...]:
        return self.where or ("",) * len(self.codes)

    __repr__ = __str__  # the plain-text form keeps the hint folded too

    def _repr_html_(self) -> str:
        if self.ok:
            return (
                f"<p style='color:#0072B2'><b>&#10004; {html.escape(self.exercise)}: passes.</b> "
                "Every optimizer step matched the true large-batch gradient.</p>"
                + "".join(f"<p>At a cost: {html.escape(c)}</p>" for c in self.costs)
            )
        if self.error:
            head = (
                f"<p><b>&#10008; {html.escape(self.exercise)}: your code raised</b> "
                f"<code>{html.escape(self.error)}</code></p>"
            )
        else:
            items = "".join(
                f"<li><code>{html.escape(c)}</code>{html.escape(_at(w))}: {html.escape(m)}</li>"
                for c, m, w in zip(self.codes, self.messages, self._where())
            )
            head = (
                f"<p><b>&#10008; {html.escape(self.exercise)}: not yet.</b> accumlib.verify found:</p>"
                f"<ul>{items}</ul>"
            )
        stages = self.stages or (self.hint,)
        folded = ""
        for i in range(len(stages), 0, -1):  # each stage folded inside the one before it
            summary = "Hint" if len(stages) == 1 else ("Hint 1" if i == 1 else f"Still stuck? Hint {i}")
            folded = (
                f"<details><summary>{summary}</summary><p>{html.escape(stages[i - 1])}</p>{folded}</details>"
            )
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
    call: str = ""  # how the notebook cell names this exercise, for the plain-text verdict
    # "required" / "if-returned": grade the epoch loss the loop returns against the true mean item loss
    logged_loss: str = ""
    clip_each_step: bool = False  # every step must be clipped, before the step

    def __post_init__(self) -> None:
        # the lesson module's EXERCISE, as a notebook imports it: from accumlib_course.lessons import <module>
        if not self.call:
            # the module whose EXERCISE = Exercise(...) this is
            module = sys._getframe(2).f_globals.get("__name__", "")
            name = module.rpartition(".")[2]
            # a private module is not imported
            public = module.startswith("accumlib_course.lessons.") and not name.startswith("_")
            object.__setattr__(self, "call", f"{name}.EXERCISE" if public else "")
        check_int("accum_steps", self.accum_steps, low=1)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, low=1)

    def hint_for(self, codes: Any, last_only: Any = ()) -> str | tuple[str, ...]:
        """The hint for the first of ``codes`` that has one; ``<code>@last`` for a code in ``last_only``
        (a finding about the last step alone: the tail, not every step)."""
        for code in codes:
            if code in last_only and f"{code}@last" in self.hints:
                return self.hints[f"{code}@last"]
            if code in self.hints:
                return self.hints[code]
        return self.default_hint

    def verify(self, train_fn: Callable[..., Any], watch: Watch | None = None) -> Any:
        if self.run is not None:
            return self.run(train_fn)
        import accumlib

        t = accumlib.get_task(self.task)
        # a scheduler stepped per micro-batch is verify's to name, not torch's to warn of
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            return self._verify(t, watch.wrap(train_fn) if watch else train_fn)

    def _verify(self, t: Any, train_fn: Callable[..., Any]) -> Any:
        import accumlib

        return accumlib.verify(
            train_fn,
            model=self.make_model() if self.make_model else t.make_model(0),
            dataset=self.make_dataset() if self.make_dataset else t.make_dataset(),
            item_losses=t.item_losses,
            accum_steps=self.accum_steps,
            batch_size=self.batch_size or t.batch_size,
            collate_fn=t.collate_fn,
        )

    def check(self, train_fn: Any) -> Grade:
        """Grade the learner's ``train_fn(model, optimizer, loader)``: verify's verdict plus a matched
        hint.
        """
        if not callable(train_fn):
            raise TypeError(
                f"train_fn must be a function train_fn(model, optimizer, loader) (got "
                f"{type(train_fn).__name__})"
            )
        watch = Watch(clip_each_step=self.clip_each_step)
        try:
            report = self.verify(train_fn, watch)
        except Exception as e:  # the learner's code: show the error as feedback, not a traceback wall
            frozen = frozen_check(watch, None) if watch.all_frozen else None
            if frozen is not None:  # a frozen model, not a crash: say what the loop froze
                return self._grade([frozen], False, None, None)
            return self.grade(error=getattr(e, "feedback", "") or f"{type(e).__name__}: {e}")
        return self.grade(report, watch=watch)

    def grade(self, report: Any = None, error: str = "", watch: Watch | None = None) -> Grade:
        """The Grade of a verify ``report`` (with what ``watch`` saw of the loop), or of a loop that raised
        ``error``.
        """
        if error:
            return Grade(
                self.name,
                False,
                (),
                (),
                _text(self.hints.get("error", self.default_hint)),
                None,
                error,
                _stages(self.hints.get("error", self.default_hint)),
                call=self.call,
            )
        bad = [f for f in report.findings if f.severity in ("bug", "limit")]  # a note or a cost leaves it ok
        n_steps = len(getattr(report, "steps", ()) or ()) or None
        if watch is not None and watch.ran:
            codes = {f.code for f in bad}
            frozen = frozen_check(watch, n_steps)
            if frozen is not None and "frozen-inside-window" not in codes:
                bad.append(frozen)
            if self.logged_loss == "required" or (self.logged_loss and watch.returned is not None):
                bad += logged_loss_checks(watch.returned, getattr(report, "true_loss", None), codes)
            if self.clip_each_step:
                bad += clip_checks(watch, n_steps)
        # verify's unexplained, in what the loop did: its size and direction at a step, in plain words
        rows, replaced = getattr(report, "steps", ()) or (), watch.replaced if watch else ()
        bad = [unexplained_check(f, rows, n_steps, replaced) if f.code == "unexplained" else f for f in bad]
        return self._grade(bad, not bad and bool(report.ok), report, n_steps)

    def _grade(self, bad: list[Any], ok: bool, report: Any, n_steps: int | None) -> Grade:
        codes = tuple(f.code for f in bad)
        steps = [tuple(getattr(f, "steps", ()) or ()) for f in bad]
        last_only = {f.code for f, s in zip(bad, steps) if n_steps and n_steps > 1 and s == (n_steps - 1,)}
        hint = "" if ok else self.hint_for(codes, last_only)
        costs = tuple(
            f"[{f.code}] {f.message}" for f in getattr(report, "findings", ()) if f.severity == "cost"
        )
        return Grade(
            self.name,
            ok,
            codes,
            tuple(f.message for f in bad),
            _text(hint),
            report,
            "",
            _stages(hint),
            costs,
            tuple(where(s, n_steps) for s in steps),
            self.call,
        )


def _at(words: str) -> str:
    return f" ({words})" if words else ""


def _stages(hint: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(hint) if isinstance(hint, tuple) else (hint,) if hint else ()


def _text(hint: str | tuple[str, ...]) -> str:
    return "\n".join(f"({i}) {h}" for i, h in enumerate(hint, 1)) if isinstance(hint, tuple) else hint
