"""Lesson 10, part: the learning-rate schedule counted in optimizer steps, and the exercise that grades it.

A schedule is a function of the *optimizer step*. ``linear_warmup`` is the Transformers formula
(``get_linear_schedule_with_warmup``): lr 0 at step 0, a linear rise over ``warmup_steps`` optimizer
steps, then a linear fall to 0 at ``total_steps``. Two ways to get it wrong, both common:

- the scheduler is stepped once per *micro-batch* while warmup and total are counted in optimizer
  steps: warmup ends k times too early and the lr reaches 0 after 1/k of the run;
- warmup and total are counted in micro-batches (``len(loader)``) while the scheduler is stepped per
  optimizer step: warmup lasts k times too long and the lr never falls below 1 - 1/k of its peak.

``schedules`` runs a real ``torch.optim`` optimizer and scheduler through each loop shape and records the
lr at every ``optimizer.step()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from accumlib.checks import check_float, check_int
from accumlib.text import Table

BASE_LR = 0.1  # the exercise's peak lr (plain SGD, as verify's default optimizer)
WARMUP = 2  # optimizer steps of warmup in the exercise
EXERCISE_ITEMS = 192  # digits: 24 micro-batches of 8, 6 windows of k = 4, nothing left over


def linear_warmup(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Transformers' linear schedule with warmup, counted in whatever ``scheduler.step()`` is called per.

    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> s = linear_warmup(opt, 2, 6); lrs = []
    >>> for _ in range(6): lrs.append(opt.param_groups[0]["lr"]); opt.step(); s.step()
    >>> lrs
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    """
    warmup_steps = check_int("warmup_steps", warmup_steps, low=0)
    total_steps = check_int(
        "total_steps", total_steps, low=max(1, warmup_steps), why="the schedule must end after its warmup"
    )

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def planned_lrs(n_steps: int, *, warmup_steps: int = WARMUP, base_lr: float = BASE_LR) -> list[float]:
    """The lr of each of ``n_steps`` optimizer steps when warmup and total are counted, and stepped, in
    optimizer steps.

    >>> planned_lrs(6, base_lr=1.0)
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    """
    return _run(n_steps, 1, warmup_steps, n_steps, per_micro_batch=False, base_lr=base_lr)


SHAPES = {
    "counted and stepped in optimizer steps": "correct",
    "stepped per micro-batch": "buggy",
    "counted in micro-batches (len(loader))": "other",
}


def _run(
    n_steps: int, k: int, warmup: int, total: int, *, per_micro_batch: bool, base_lr: float
) -> list[float]:
    """The lr each ``optimizer.step()`` sees: a real SGD and LambdaLR over one parameter, k micro-batches a
    step.

    ``per_micro_batch``: ``scheduler.step()`` at the end of every micro-batch (outside the ``if``), the
    common slip.
    """
    import warnings

    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base_lr)
    sched = linear_warmup(opt, warmup, total)
    seen = []
    with warnings.catch_warnings():
        # torch warns when the scheduler steps before the optimizer: that is the bug shown
        warnings.simplefilter("ignore")
        for _ in range(n_steps):
            for j in range(k):
                p.grad = torch.zeros(1)
                if j == k - 1:
                    seen.append(opt.param_groups[0]["lr"])
                    opt.step()
                if per_micro_batch:
                    sched.step()
            if not per_micro_batch:
                sched.step()
    return seen


@dataclass(frozen=True)
class ScheduleResult:
    """The lr at every optimizer step for each loop shape (``SHAPES``), with the settings that made them."""

    n_steps: int
    accum_steps: int
    warmup_steps: int
    base_lr: float
    lrs: dict[str, tuple[float, ...]]

    def peak(self, shape: str) -> tuple[int, float]:
        """The optimizer step with the highest lr, and that lr / the planned peak (warmup is over there)."""
        lrs = self.lrs[shape]
        i = max(range(len(lrs)), key=lambda j: (lrs[j], -j))
        return i, lrs[i] / self.base_lr

    def at_zero(self, shape: str) -> int:
        """Optimizer steps after the first that run at lr 0: the model stops learning there."""
        return sum(1 for i, lr in enumerate(self.lrs[shape]) if i > 0 and lr == 0.0)

    def rows(self) -> list[tuple[Any, ...]]:
        plan = sum(self.lrs[next(iter(SHAPES))])
        return [
            (
                shape,
                self.peak(shape)[0],
                round(self.peak(shape)[1], 3),
                self.at_zero(shape),
                round(self.lrs[shape][-1] / self.base_lr, 3),
                round(sum(self.lrs[shape]) / plan, 3),
            )
            for shape in SHAPES
        ]

    def table(self) -> Table:
        return Table(
            (
                "scheduler",
                "step of highest lr",
                "highest lr / peak",
                "steps at lr 0",
                "last lr / peak",
                "sum of lr / planned",
            ),
            self.rows(),
            caption=f"{self.n_steps} optimizer steps of k = {self.accum_steps} micro-batches, "
            f"warmup {self.warmup_steps} steps, linear decay to 0",
        )


def schedules(
    n_steps: int = 100, accum_steps: int = 4, warmup_steps: int = 10, *, base_lr: float = 1e-3
) -> ScheduleResult:
    """Each loop shape of ``SHAPES`` through a real optimizer and ``linear_warmup``: the lr at each optimizer
    step.

    >>> r = schedules(8, 4, 2, base_lr=1.0)
    >>> [round(lr, 3) for lr in r.lrs["stepped per micro-batch"][:3]], r.at_zero("stepped per micro-batch")
    ([0.833, 0.167, 0.0], 6)
    """
    n_steps = check_int("n_steps", n_steps, low=2)
    accum_steps = check_int("accum_steps", accum_steps, low=1, high=64)
    warmup_steps = check_int(
        "warmup_steps", warmup_steps, low=0, high=n_steps - 1, why="warmup must end before the run does"
    )
    base_lr = check_float("base_lr", base_lr, low=0.0, low_open=True)
    k = accum_steps
    lrs = {
        "counted and stepped in optimizer steps": _run(
            n_steps, k, warmup_steps, n_steps, per_micro_batch=False, base_lr=base_lr
        ),
        "stepped per micro-batch": _run(
            n_steps, k, warmup_steps, n_steps, per_micro_batch=True, base_lr=base_lr
        ),
        "counted in micro-batches (len(loader))": _run(
            n_steps, k, warmup_steps * k, n_steps * k, per_micro_batch=False, base_lr=base_lr
        ),
    }
    return ScheduleResult(n_steps, k, warmup_steps, base_lr, {s: tuple(v) for s, v in lrs.items()})


def plot_schedules(result: ScheduleResult, ax: Any) -> None:
    """The lr per optimizer step of each shape on ``ax`` (markers every few steps, so lines stay readable)."""
    from .. import _style

    every = max(1, result.n_steps // 12)
    for shape, role in SHAPES.items():
        ax.plot(range(result.n_steps), result.lrs[shape], label=shape, markevery=every, **_style.ROLE[role])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"Planned: warmup {result.warmup_steps} steps, then a linear fall to 0")
    ax.set_ylim(0, 1.6 * result.base_lr)  # room for the legend above the curves
    ax.legend(loc="upper right")


# --- the exercise's own check: the lr of every step against the plan


@dataclass(frozen=True)
class LessonFinding:
    """A finding of this lesson's schedule check, shaped like verify's ``Finding`` (code, message, fix,
    steps).
    """

    code: str
    message: str
    fix: str
    steps: tuple[int, ...] = ()
    severity: str = "bug"

    def __str__(self) -> str:
        return f"[{self.code}] (steps {', '.join(map(str, self.steps))}) {self.message}\n    fix: {self.fix}"


class LessonReport:
    """verify's report plus the lesson's schedule finding: ``ok`` only when both pass; every other attribute
    is verify's.
    """

    def __init__(self, report: Any, extra: list[LessonFinding]):
        self.report, self.extra = report, extra
        self.findings = list(report.findings) + extra

    @property
    def ok(self) -> bool:
        return bool(self.report.ok) and not self.extra

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["report"], name)

    def __str__(self) -> str:
        return "\n".join([str(self.report), *map(str, self.extra)])


def schedule_check(
    report: Any, *, warmup_steps: int = WARMUP, base_lr: float = BASE_LR
) -> list[LessonFinding]:
    """The lr verify recorded at each optimizer step against ``planned_lrs``: one finding naming the steps
    off plan.
    """
    seen = [s.lr for s in report.steps]
    if not seen:
        return []
    plan = planned_lrs(len(seen), warmup_steps=warmup_steps, base_lr=base_lr)
    off = tuple(i for i, (a, b) in enumerate(zip(seen, plan)) if abs(a - b) > 1e-6 * base_lr)
    if not off:
        return []
    shown = ", ".join(f"{a:.3g}" for a in seen)
    return [
        LessonFinding(
            "schedule-not-in-optimizer-steps",
            f"the learning rate at the optimizer steps was [{shown}], the plan (warmup {warmup_steps} "
            f"optimizer steps, then a linear fall to 0 at the epoch's last step) is "
            f"[{', '.join(f'{b:.3g}' for b in plan)}]",
            "count warmup and total in optimizer steps (len(loader) / k, rounded up) and call "
            "scheduler.step() once per optimizer step",
            off,
        )
    ]


def exercise_dataset(seed: int = 0) -> Any:
    """192 digits: 24 micro-batches of 8, six full windows of k = 4."""
    from accumlib.data import digits_subset

    return digits_subset(EXERCISE_ITEMS, seed)


def run_exercise(train_fn: Any) -> LessonReport:
    """``accumlib.verify`` on the digits MLP (SGD at ``BASE_LR``), then the lesson's schedule check."""
    import warnings

    import accumlib

    task = accumlib.get_task("mlp-digits")
    # a scheduler stepped per micro-batch is verify's to name, not torch's to warn of
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        report = accumlib.verify(
            train_fn,
            model=task.make_model(0),
            dataset=exercise_dataset(),
            item_losses=task.item_losses,
            accum_steps=4,
            batch_size=8,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=BASE_LR),
        )
    return LessonReport(report, schedule_check(report) if report.ok else [])


def total_steps(n_micro_batches: int, accum_steps: int) -> int:
    """Optimizer steps in an epoch of ``n_micro_batches`` when the last, partial window is stepped too.

    >>> total_steps(25, 4)
    7
    """
    return math.ceil(
        check_int("n_micro_batches", n_micro_batches, low=0) / check_int("accum_steps", accum_steps, low=1)
    )
