"""Lesson 10: accumulation in your own project. What to write, and what a user sees when it is right or wrong.

The loss curve is what a user looks at. Train the same model on the same items in the same order with
windows of 32 items, cut as 32 x 1, 8 x 4 or 4 x 8: if every item weighs 1/N of its window
(``accumlib.ragged``, the reference loop to copy), the three runs take the same optimizer steps and
their curves coincide up to float32 rounding. The naive sum (``accumlib.naive``) takes steps k times
too long; per-micro-batch means divided by k (``accumlib.normalized``) weigh tokens by the size of
the micro-batch that holds them, so on sequences of different lengths every step is a little off and
the curves drift apart.

The parts of the lesson live beside this module: ``_your_own_project_plain`` (the plain loops to copy,
each graded by verify), ``_your_own_project_schedule`` (the learning-rate
schedule in optimizer steps, the exercise's check), ``_your_own_project_memory`` (activation checkpointing
against accumulation, measured), ``_your_own_project_frameworks`` (the settings of Transformers,
Accelerate, Lightning, TRL and PEFT, each run under verify), ``_your_own_project_gpt`` (a small GPT
trained by the correct loop and each common bug; its figure in ``_your_own_project_gpt_figure``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from accumlib import get_task, naive, normalized, ragged
from accumlib.checks import check_choice, check_float, check_int, resolve_device
from accumlib.data import TokenSequences
from accumlib.loops import CONTRACTS
from accumlib.text import Table
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from ._exercise import Exercise
from ._explorer import Explorer
from ._your_own_project_cost import CostResult, accumulation_cost, cost_alt_text, plot_cost
from ._your_own_project_frameworks import RUNS, FrameworkResult, frameworks
from ._your_own_project_gpt import GPTResult, small_gpt
from ._your_own_project_gpt_figure import plot_gpt
from ._your_own_project_memory import MemoryResult, checkpointing
from ._your_own_project_plain import PLAIN, PlainLoop, grade_plain
from ._your_own_project_schedule import (
    BASE_LR,
    WARMUP,
    LessonFinding,
    LessonReport,
    ScheduleResult,
    exercise_dataset,
    linear_warmup,
    planned_lrs,
    plot_schedules,
    run_exercise,
    schedule_check,
    schedules,
    total_steps,
)

TASK = "lm-tokens"
WINDOW = 32  # items (sequences) per optimizer step in every setting of the figure
SETTINGS = ((8, 4), (4, 8))  # micro-batch x k: windows of 32 sequences, like the reference 32 x 1
N_SEQUENCES = 64  # two windows an epoch
LENGTHS = (2, 40)  # tokens per sequence: very unequal, so micro-batches hold very different token counts

LOOPS: dict[str, Callable[..., list[float]]] = {
    "ragged": ragged,  # every token weighs 1/N of its window: the loop to copy
    # mean per micro-batch / k: exact only when every micro-batch holds as many tokens
    "normalized": normalized,
    "naive": naive,  # mean per micro-batch, summed: k times the gradient
}
LABELS = {
    "ragged": "sum / N tokens (accumlib.ragged)",
    "normalized": "mean / k (accumlib.normalized)",
    "naive": "naive sum (accumlib.naive)",
}


@dataclass(frozen=True)
class Curve:
    """One run: the loop, its micro-batch and k, the true mean token loss of every optimizer step's window."""

    loop: str
    batch_size: int
    accum_steps: int
    losses: tuple[float, ...]
    diverged_at: int | None = None  # the epoch in which the loss became inf or nan (the run stops there)

    @property
    def label(self) -> str:
        return f"{self.batch_size} x {self.accum_steps}, {self.loop}"


@dataclass(frozen=True)
class CurveResult:
    """The reference run (32 x 1) and every other run, on one model, data set, order and learning rate."""

    reference: Curve
    curves: tuple[Curve, ...]
    epochs: int
    lr: float

    def gap(self, curve: Curve) -> float:
        """The largest relative difference of ``curve``'s losses from the reference's over the steps both
        took.
        """
        pairs = list(zip(curve.losses, self.reference.losses))
        return max(abs(a - b) / abs(b) for a, b in pairs) if pairs else float("nan")

    def find(self, loop: str, batch_size: int, accum_steps: int) -> Curve:
        for c in self.curves:
            if (c.loop, c.batch_size, c.accum_steps) == (loop, batch_size, accum_steps):
                return c
        raise ValueError(f"curve must be one computed (got {loop!r} at {batch_size} x {accum_steps})")

    def rows(self) -> list[tuple[Any, ...]]:
        return [
            (
                c.label,
                len(c.losses),
                f"{self.gap(c):.1e}",
                "yes" if self.gap(c) <= FLOAT32_RTOL else "no",
                "-" if c.diverged_at is None else f"epoch {c.diverged_at}",
            )
            for c in self.curves
        ]

    def table(self) -> Table:
        return Table(
            ("run", "optimizer steps", "largest gap to 32 x 1", "within float32 rounding", "diverged"),
            self.rows(),
            caption=f"{self.epochs} epochs of {N_SEQUENCES} sequences, SGD lr {self.lr:g}",
        )


def _check_setting(batch_size: Any, accum_steps: Any) -> tuple[int, int]:
    batch_size = check_int("batch_size", batch_size, low=1, high=N_SEQUENCES)
    # a window larger than the data is the whole epoch in one step: another large batch, drawn as such
    accum_steps = check_int("accum_steps", accum_steps, low=1, high=N_SEQUENCES)
    return batch_size, accum_steps


@functools.lru_cache(maxsize=256)
def _curve(
    loop: str, batch_size: int, accum_steps: int, epochs: int, lr: float, seed: int, device: str
) -> Curve:
    task = get_task(TASK)
    dev = torch.device(device)
    model = task.make_model(seed).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = TokenSequences(N_SEQUENCES, min_len=LENGTHS[0], max_len=LENGTHS[1], seed=seed)
    order = torch.Generator().manual_seed(seed)  # one permutation per epoch, whatever the micro-batch size
    loader = DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=order, collate_fn=task.collate_fn
    )
    takes = {"count_items": task.count_items} if loop == "ragged" else {}
    losses: list[float] = []
    for epoch in range(epochs):
        try:
            losses += LOOPS[loop](
                model, optimizer, loader, task.item_losses, accum_steps=accum_steps, device=dev, **takes
            )
        except ValueError as err:  # the loops refuse a non-finite loss: the run diverged in this epoch
            if "finite" not in str(err):
                raise
            return Curve(loop, batch_size, accum_steps, tuple(losses), epoch)
    return Curve(loop, batch_size, accum_steps, tuple(losses))


def compute(
    settings: Any = SETTINGS,
    loops: Any = tuple(LOOPS),
    *,
    epochs: int = 6,
    lr: float = 0.2,
    seed: int = 0,
    device: Any = "auto",
) -> CurveResult:
    """Every loop of ``loops`` at every (micro-batch, k) of ``settings``, against ``ragged`` at 32 x 1.

    Each run starts from the same model and draws the same order of sequences every epoch, so a
    correct loop at 8 x 4 takes the optimizer steps of 32 x 1. Runs are cached.

    >>> compute(settings=[(8, 0)])
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer between 1 and 64 (got 0)
    """
    if isinstance(settings, (str, bytes)) or not hasattr(settings, "__iter__"):
        raise ValueError(f"settings must be a sequence of (batch_size, accum_steps) pairs (got {settings!r})")
    pairs = []
    for s in settings:
        if not (isinstance(s, (tuple, list)) and len(s) == 2):
            raise ValueError(f"settings must hold (batch_size, accum_steps) pairs (got {s!r})")
        pairs.append(_check_setting(*s))
    if not pairs:
        raise ValueError("settings must hold at least one (batch_size, accum_steps) pair (got none)")
    if isinstance(loops, str):
        loops = (loops,)
    loops = tuple(check_choice("loops", name, tuple(LOOPS)) for name in loops)
    epochs = check_int("epochs", epochs, low=1, high=50)
    lr = check_float("lr", lr, low=0.0, low_open=True, high=10.0)
    seed = check_int("seed", seed, low=0)
    dev = str(resolve_device(device))
    reference = _curve("ragged", WINDOW, 1, epochs, lr, seed, dev)
    curves = tuple(_curve(name, b, k, epochs, lr, seed, dev) for name in loops for b, k in pairs)
    return CurveResult(reference, curves, epochs, lr)


def _shown(result: CurveResult) -> list[Curve]:
    return [c for c in result.curves if (c.loop, c.batch_size, c.accum_steps) != ("ragged", WINDOW, 1)]


@_style.styled
def plot(result: CurveResult) -> Figure:
    """Left: the loss of every optimizer step per run. Right: each run's gap to 32 x 1, on a log scale."""
    windows = sorted({min(c.batch_size * c.accum_steps, N_SEQUENCES) for c in _shown(result)})
    title = (
        f"Windows of {WINDOW} sequences cut into micro-batches"
        if windows in ([WINDOW], [])
        else f"Windows of {', '.join(map(str, windows))} sequences against {WINDOW} x 1: "
        "another large batch, another curve"
    )
    fig, (ax, bx) = _style.figure(2, width=13.0, height=6.5, title=title)
    steps = range(1, len(result.reference.losses) + 1)
    ax.plot(steps, result.reference.losses, label="32 x 1 (the large batch)", **_style.ROLE["oracle"], lw=2.5)
    fills = ("full", "none", "left", "right")
    seen: dict[str, int] = {}
    for c in _shown(result):
        i = seen[c.loop] = seen.get(c.loop, -1) + 1
        role = _style.ROLE[CONTRACTS[c.loop].role]  # the look the report gives the same loop
        kw = dict(
            color=role["color"],
            linestyle=role["linestyle"],
            marker=role["marker"],
            fillstyle=fills[i % len(fills)],
            label=f"{c.batch_size} x {c.accum_steps}: {LABELS[c.loop]}",
        )
        ax.plot(range(1, len(c.losses) + 1), c.losses, **kw)
        gaps = [max(abs(a - b) / abs(b), 1e-9) for a, b in zip(c.losses, result.reference.losses)]
        bx.plot(range(1, len(gaps) + 1), gaps, **kw)
        if c.diverged_at is not None:
            ax.annotate("diverged", (len(c.losses), c.losses[-1] if c.losses else 0), color=role["color"])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean token loss of the window")
    ax.set_title("The loss curve")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    bound = bx.axhline(
        FLOAT32_RTOL, label="float32 rounding bound", **{**_style.ROLE["oracle"], "marker": ""}
    )
    bx.set_yscale("log")
    bx.set_xlabel("optimizer step")
    bx.set_ylabel("relative gap (0 drawn at 1e-9)")
    bx.set_title("Gap to 32 x 1 at each step")
    bx.legend(handles=[bound], loc="center right")
    return fig


def alt_text(result: CurveResult) -> str:
    """The figure's alt text, built from its numbers."""
    parts = [
        f"{c.label}: largest gap {result.gap(c):.1e}" + ("" if c.diverged_at is None else ", diverged")
        for c in _shown(result)
    ]
    return (
        f"Loss per optimizer step over {result.epochs} epochs against 32 x 1; "
        + "; ".join(parts)
        + f"; float32 rounding bound {FLOAT32_RTOL:.0e}."
    )


@_style.styled
def plot_schedule(result: ScheduleResult) -> Figure:
    """The lr at every optimizer step for each way of counting and stepping the scheduler."""
    fig, ax = _style.figure(
        1,
        width=10.0,
        height=5.0,
        title=(
            f"One schedule, three loops: {result.n_steps} optimizer steps of k = {result.accum_steps} "
            f"micro-batches"
        ),
    )
    plot_schedules(result, ax)
    return fig


def widget(
    batch_size: int = 8,
    accum_steps: int = 4,
    loop: str = "ragged",
    *,
    device: Any = "auto",
    initial: CurveResult | None = None,
) -> Explorer:
    """Pick a micro-batch size, k and a loop: the run is drawn against 32 x 1 (cached per choice).

    A window of batch x k other than 32 is another large batch: its curve should not match.
    """
    import ipywidgets as w

    _check_setting(batch_size, accum_steps)
    check_choice("loop", loop, tuple(LOOPS))

    def run(batch_size: int, accum_steps: int, loop: str) -> CurveResult:
        return compute([(batch_size, accum_steps)], (loop,), device=device)

    start = None
    if initial is not None:
        c = initial.find(loop, batch_size, accum_steps)
        start = CurveResult(initial.reference, (c,), initial.epochs, initial.lr)
    return Explorer(
        run,
        plot,
        initial=start,
        batch_size=w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=batch_size, description="micro-batch"),
        accum_steps=w.IntSlider(value=accum_steps, min=1, max=16, description="k"),
        loop=w.Dropdown(options=[(LABELS[n], n) for n in LOOPS], value=loop, description="loop"),
    )


EXERCISE = Exercise(
    "10-schedule-in-optimizer-steps",
    "Warm up and decay the learning rate in optimizer steps",
    accum_steps=4,
    batch_size=8,
    make_dataset=exercise_dataset,
    run=run_exercise,
    call="your_project.EXERCISE",
    hints={
        "scheduler-per-micro-batch": (
            "The learning rate changes inside a window: scheduler.step() runs between a window's first "
            "micro-batch and its optimizer.step(), once per micro-batch or just before the step.",
            "A schedule is a function of the optimizer step. Call scheduler.step() where optimizer.step() "
            "is called, once per window.",
            "Move scheduler.step() into the `if (i + 1) % k == 0:` block, right after optimizer.step(), and "
            "give linear_warmup the number of optimizer steps: total = math.ceil(len(loader) / k).",
        ),
        "schedule-not-in-optimizer-steps": (
            "Every step's gradient is right, and the scheduler moves once per step, but the learning rate "
            "does not follow the plan: compare the two lists in the verdict.",
            "Warmup and total are counts of scheduler.step() calls, which now happen once per optimizer "
            "step. len(loader) counts micro-batches.",
            f"warmup_steps={WARMUP} and total_steps=math.ceil(len(loader) / k): the number of optimizer "
            f"steps in the epoch.",
        ),
        "early-step": "The optimizer steps more often than once every k micro-batches: keep optimizer.step() "
        "inside the `if`.",
        "tail-dropped": "Some micro-batches never reach an optimizer step: every window of k must end in a "
        "step.",
        "zero-grad-inside-window": "zero_grad() belongs right after optimizer.step(), inside the same `if`.",
        "unscaled-sum": "The gradient is k times too long: keep the division by k of every micro-batch's "
        "mean.",
        "no-zero-grad": "The gradient of one window leaks into the next: keep optimizer.zero_grad() after "
        "the step.",
    },
)


__all__ = [
    "BASE_LR",
    "CostResult",
    "Curve",
    "CurveResult",
    "EXERCISE",
    "FrameworkResult",
    "GPTResult",
    "MemoryResult",
    "PLAIN",
    "PlainLoop",
    "RUNS",
    "accumulation_cost",
    "checkpointing",
    "cost_alt_text",
    "frameworks",
    "plot_cost",
    "plot_gpt",
    "small_gpt",
    "grade_plain",
    "plot_schedule",
    "LABELS",
    "LOOPS",
    "LessonFinding",
    "LessonReport",
    "SETTINGS",
    "ScheduleResult",
    "WARMUP",
    "alt_text",
    "compute",
    "exercise_dataset",
    "linear_warmup",
    "planned_lrs",
    "plot",
    "plot_schedules",
    "run_exercise",
    "schedule_check",
    "schedules",
    "total_steps",
    "widget",
]
