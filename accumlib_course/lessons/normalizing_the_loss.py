"""Lesson 2: normalizing the loss. Naive vs ``loss / k`` vs dividing the gradients afterwards.

For k micro-batches of equal size, two forms give the true large-batch gradient
(the seed post "Gradient Accumulation in PyTorch, GANs and other Nightmares"):

    sum_j grad( mean_j / k )          divide each micro-batch loss   (accumlib.normalized)
    (1/k) * sum_j grad( mean_j )      divide .grad once, after the window   (accumlib.grad_divided)

and the naive loop (accumlib.naive) computes k times the true gradient. The BERT-style
loop of another seed ("How Gradient accumulation is implemented") divides correctly but
then logs the *divided* loss, so its reported epoch loss is off by k; ``bert_train_one_epoch``
is that loop, ported to the digits MLP, and ``bert_train_one_epoch_fixed`` the fix.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from accumlib import get_task, grad_divided, naive, normalized
from accumlib.checks import check_int, resolve_device
from accumlib.data import N_DIGITS, digits_subset
from accumlib.harness import trace_loop
from accumlib.text import Table, fmt_error

from .. import _style
from ..gallery import bert_train_one_epoch  # the seed's loop, ported once
from ._exercise import Exercise
from ._explorer import Explorer
from ._normalizing_the_loss_bert import (  # noqa: F401 (the notebook and tests read them here)
    N_WINDOWS,
    TASK,
    BertRun,
    bert_epoch,
    bert_train_fn,
    bert_train_one_epoch_fixed,
    make_optimizer,
    make_scheduler,
)
from .why_accumulate import TrainResult, train

LOOPS: dict[str, Callable[..., list[float]]] = {
    "naive (accumlib.naive)": naive,
    "loss / k (accumlib.normalized)": normalized,
    "grad / k after the window": grad_divided,  # accumlib.grad_divided
}


# --- error vs k ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorResult:
    """Worst relative error and norm ratio against the oracle, per loop, for every k."""

    ks: tuple[int, ...]
    batch_size: int
    rel_error: dict[str, tuple[float, ...]]
    norm_ratio: dict[str, tuple[float, ...]]
    reported_ratio: tuple[float, ...]  # the BERT loop's reported epoch loss / the true one, per k

    def rows(self) -> list[tuple[Any, ...]]:
        """(k, then per loop the rounded norm ratio, then the BERT loop's reported/true loss)."""
        return [
            (k, *(round(self.norm_ratio[name][i], 3) for name in LOOPS), round(self.reported_ratio[i], 3))
            for i, k in enumerate(self.ks)
        ]

    def table(self) -> Table:
        return Table(
            ("k", "naive", "loss / k", "grad / k after", "BERT loop: reported / true loss"),
            self.rows(),
            caption=f"|gradient at the step| / |large-batch gradient|, micro-batches of {self.batch_size}",
        )

    def error_table(self) -> Table:
        return Table(
            ("loop", "worst relative error over all k"),
            [(name, fmt_error(max(errs))) for name, errs in self.rel_error.items()],
        )


def _task(accum_steps: int, batch_size: int, seed: int):
    n = N_WINDOWS * accum_steps * batch_size
    return dataclasses.replace(
        get_task(TASK),
        make_dataset=functools.partial(digits_subset, n, seed),
        batch_size=batch_size,
        accum_steps=accum_steps,
    )


def _check(max_k: Any, batch_size: Any, seed: Any) -> tuple[int, int, int]:
    max_k = check_int("max_k", max_k, low=1, high=N_DIGITS // N_WINDOWS)
    batch_size = check_int(
        "batch_size",
        batch_size,
        low=1,
        high=N_DIGITS // (N_WINDOWS * max_k),
        why=f"{N_WINDOWS} windows of max_k x batch_size digits must exist ({N_DIGITS} in all)",
    )
    return max_k, batch_size, check_int("seed", seed, low=0)


@functools.lru_cache(maxsize=512)
def _point(
    k: int, batch_size: int, seed: int, device: str
) -> tuple[dict[str, float], dict[str, float], float]:
    """At one k: each loop's worst relative error and norm ratio, and the BERT loop's reported / true loss."""
    dev = torch.device(device)
    task = _task(k, batch_size, seed)
    rel, ratio = {}, {}
    for name, loop in LOOPS.items():
        trace = trace_loop(loop, task, seed=seed, device=dev)
        rel[name] = max(c.rel_error for c in trace.comparisons)
        ratio[name] = max(c.norm_ratio for c in trace.comparisons)
    return rel, ratio, _bert_reported_ratio(k, batch_size, seed, dev)


def _bert_reported_ratio(accum_steps: int, batch_size: int, seed: int, dev: torch.device) -> float:
    """The seed loop's reported epoch loss / the true mean item loss (``bert_epoch`` without the fixed loop:
    half the work).
    """
    model = get_task(TASK).make_model(seed).to(dev)
    optimizer = make_optimizer(model.parameters())
    items: list[torch.Tensor] = []

    def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = torch.nn.functional.cross_entropy(outputs, targets, reduction="none")
        items.append(losses.detach().cpu())
        return losses.mean()

    data = DataLoader(digits_subset(N_WINDOWS * accum_steps * batch_size, seed), batch_size=batch_size)
    reported = bert_train_one_epoch(
        model,
        optimizer,
        make_scheduler(optimizer),
        data,
        dev,
        0,
        n_accumulate=accum_steps,
        criterion=criterion,
        collect=False,
    )
    return reported / float(torch.cat(items).mean())


def compute(max_k: int = 8, batch_size: int = 8, *, seed: int = 0, device: Any = "auto") -> ErrorResult:
    """For k = 1..``max_k``: each loop over two full windows, every step compared with the oracle.

    Each k is computed once per (``batch_size``, ``seed``, device) and cached, so a sweep to a
    larger ``max_k`` only adds the new k.

    >>> compute(max_k=0)
    Traceback (most recent call last):
    ...
    ValueError: max_k must be an integer between 1 and 898 (got 0)
    """
    max_k, batch_size, seed = _check(max_k, batch_size, seed)
    dev = str(resolve_device(device))
    ks = tuple(range(1, max_k + 1))
    points = [_point(k, batch_size, seed, dev) for k in ks]
    return ErrorResult(
        ks,
        batch_size,
        {n: tuple(p[0][n] for p in points) for n in LOOPS},
        {n: tuple(p[1][n] for p in points) for n in LOOPS},
        tuple(p[2] for p in points),
    )


@_style.styled
def plot(result: ErrorResult, highlight: int | None = None) -> Figure:
    """Left: |grad| / |true grad| vs k per loop. Right: the BERT loop's reported epoch loss / true."""
    fig, (ax, bx) = _style.figure(
        2,
        width=11.5,
        height=4.4,
        title=(
            f"Micro-batches of {result.batch_size}: dividing by k (loss or grad) is exact, "
            "not dividing is k times too long, the BERT loop logs 1/k of the loss"
        ),
    )
    roles = {
        "naive (accumlib.naive)": "buggy",
        "loss / k (accumlib.normalized)": "correct",
        "grad / k after the window": "alternative",
    }
    for name, role in roles.items():
        ax.plot(result.ks, result.norm_ratio[name], label=name, **_style.ROLE[role])
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("|grad at step| / |large-batch grad|")
    ax.set_title("Gradient length at optimizer.step()")
    ax.legend(loc="upper left")
    bx.plot(result.ks, result.reported_ratio, label="BERT post's loop: logs loss / k", **_style.ROLE["buggy"])
    bx.plot(result.ks, [1.0 / k for k in result.ks], label="1 / k", **_style.ROLE["oracle"])
    bx.axhline(1.0, label="fixed loop: logs the undivided loss", **{**_style.ROLE["correct"], "marker": ""})
    bx.set_ylim(0, 1.15)
    bx.set_xlabel("accumulation steps k")
    bx.set_ylabel("reported / true epoch loss")
    bx.set_title("The BERT-style loop's progress-bar loss")
    bx.legend(loc="center right")
    if highlight is not None:
        for a in (ax, bx):
            a.axvline(highlight, color=_style.BLACK, ls=":", lw=1)
    return fig


# --- Adam and the naive loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerComparison:
    """The same four runs (``why.train``) under SGD and under Adam: does not dividing change the training?"""

    sgd: TrainResult
    adam: TrainResult

    def rows(self) -> list[tuple[Any, ...]]:
        out = []
        for r in (self.sgd, self.adam):
            big, acc, naive_run, scaled = r.runs
            out.append(
                (
                    f"{r.optimizer.upper()}, lr {r.lr:g}",
                    round(r.max_curve_gap(acc, naive_run), 4),
                    round(100 * r.runs[acc].test_accuracy[-1], 1),
                    round(100 * r.runs[naive_run].test_accuracy[-1], 1),
                    round(100 * r.runs[scaled].test_accuracy[-1], 1),
                )
            )
        return out

    def table(self) -> Table:
        k = self.sgd.accum_steps
        return Table(
            (
                "optimizer",
                "largest loss gap: loss / k vs naive",
                "loss / k: test acc. %",
                "naive: test acc. %",
                f"batch {self.sgd.large_batch_size} at lr x {k}: test acc. %",
            ),
            self.rows(),
            caption=f"{k} x {self.sgd.batch_size} accumulated, {self.sgd.epochs} epochs on digits",
        )


def optimizer_comparison(
    accum_steps: int = 4,
    batch_size: int = 16,
    *,
    sgd_lr: float = 0.1,
    adam_lr: float = 0.01,
    epochs: int = 3,
    seed: int = 0,
    device: Any = "auto",
) -> OptimizerComparison:
    """``why.train`` under SGD and Adam. Adam divides each step by sqrt(v), the running size of the gradient,
    so a gradient k times too long gives the same update up to Adam's eps: the naive bug nearly cancels."""
    return OptimizerComparison(
        train(accum_steps, batch_size, lr=sgd_lr, epochs=epochs, optimizer="sgd", seed=seed, device=device),
        train(accum_steps, batch_size, lr=adam_lr, epochs=epochs, optimizer="adam", seed=seed, device=device),
    )


def widget(
    accum_steps: int = 4, batch_size: int = 8, *, device: Any = "auto", initial: ErrorResult | None = None
) -> Explorer:
    """A slider for k (highlighted) and the micro-batch size; re-runs ``compute`` up to max(8, k).

    Every k is cached (``_point``), so moving k within 1..8 only moves the highlight, a larger
    k adds that k, and a new micro-batch size computes its sweep once.
    ``initial``: the notebook's ``compute(8, 8)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    check_int("accum_steps", accum_steps, low=1, high=12)
    check_int("batch_size", batch_size, low=1, high=32)

    def run(accum_steps: int, batch_size: int) -> tuple[int, ErrorResult]:
        return accum_steps, compute(max(8, accum_steps), batch_size, device=device)

    return Explorer(
        run,
        lambda r: plot(r[1], highlight=r[0]),
        initial=None if initial is None else (accum_steps, initial),
        accum_steps=w.IntSlider(value=accum_steps, min=1, max=12, description="k"),
        batch_size=w.IntSlider(value=batch_size, min=1, max=32, description="micro-batch"),
    )


# --- the exercise: report the loss you train on ------------------------------------------------------


def exercise_dataset(seed: int = 0) -> Any:
    """64 digits: two windows of 4 x 8, nothing left over."""
    return digits_subset(64, seed)


EXERCISE = Exercise(
    "02-log-the-true-loss",
    "Keep the gradient right and report the true epoch loss",
    accum_steps=4,
    batch_size=8,
    make_dataset=exercise_dataset,
    call="normalizing.EXERCISE",
    logged_loss="required",  # the number returned must be the epoch's mean item loss, to float32 rounding
    hints={
        "logged-loss-scaled": (
            "The gradient is already right: every step matches the large batch. The number the loop returns "
            "is k times too small.",
            "The same variable serves two purposes: backward() needs the divided value, the running loss "
            "needs the micro-batch mean itself. Let them be two different expressions.",
            "Keep loss undivided, call (loss / k).backward(), and add loss.item() * len(y) to the running "
            "loss.",
        ),
        "logged-loss-wrong": (
            "The gradient is right, but the number the loop returns is not the mean loss over the epoch's "
            "items (the verdict gives both numbers and their ratio).",
            "The epoch loss is the sum of every item's loss divided by the number of items: does your "
            "running loss add up every micro-batch (not only the last), each undivided, weighted by its "
            "item count?",
            "Accumulate running_loss += loss.item() * len(y) and n_items += len(y) for every micro-batch, "
            "with loss the undivided micro-batch mean, and return running_loss / n_items.",
        ),
        "logged-loss-tensor": (
            "The loop returns a tensor that still requires grad: the running loss added up loss itself.",
            "Adding a loss tensor to a running total keeps every micro-batch's autograd graph alive until "
            "the epoch ends: memory grows with every micro-batch. A logged number needs no graph.",
            "Add loss.item() (a Python float) or loss.detach() to the running loss, not loss.",
        ),
        "no-logged-loss": (
            "The loop returns no epoch loss.",
            "The exercise asks train_fn to return the epoch loss the progress bar would show.",
            "End the loop with return running_loss / n_items.",
        ),
        "unscaled-sum": (
            "The reported loss may be right now, but the gradient is k times too long: the division no "
            "longer reaches backward().",
            "The division has to be in the expression you call backward() on; the log reads the undivided "
            "value.",
            "Call (loss / k).backward() and log loss.item().",
        ),
        "misscaled": (
            "Every step is scaled by one factor c: the division happens more than once, or by the wrong "
            "number, on the way to backward().",
            "Follow loss from the forward to backward(): how many divisions does it pass through?",
            "Divide the micro-batch mean by k exactly once: (loss / k).backward().",
        ),
        "zero-grad-inside-window": (
            ".grad is emptied (or divided again) between micro-batches of one window.",
            "Only the step ends a window: nothing between two backward() calls of one window may touch "
            ".grad.",
            "Call optimizer.zero_grad() only right after optimizer.step().",
        ),
        "late-step": (
            "Your loop waited for more micro-batches than k = 4 before stepping: each step averaged more "
            "micro-batches of 8 than the 4 x 8 = 32 items the exercise asks for.",
            "Check the k your loop uses, and where optimizer.step() sits: every k-th micro-batch, or less "
            "often?",
            "Use k = 4 and step (and zero) when (i + 1) % k == 0.",
        ),
        "early-step": (
            "The optimizer stepped before all k micro-batches of a window were in .grad.",
            "Which values of i should reach optimizer.step()?",
            "Step only when (i + 1) % k == 0.",
        ),
        "error": "Your code raised an error: read its last line, fix it, and run the cell again.",
    },
)


__all__ = [
    "BertRun",
    "EXERCISE",
    "ErrorResult",
    "LOOPS",
    "OptimizerComparison",
    "bert_epoch",
    "bert_train_fn",
    "bert_train_one_epoch",
    "bert_train_one_epoch_fixed",
    "compute",
    "exercise_dataset",
    "make_optimizer",
    "make_scheduler",
    "optimizer_comparison",
    "plot",
    "widget",
]
