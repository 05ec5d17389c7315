"""Run a reference loop on a built-in task under ``accumlib.verify``: the library's own loops are judged
by the one judge users' loops get, in its codes.

``trace_loop`` builds the task's fresh model, hands the loop to ``verify`` with the task fields its
contract takes (``accumlib.loops``), and keeps verify's ``Report`` beside what the reference table, the
report and the lessons read from it: each step's comparison with the true large-batch gradient of its
window (``Report.steps``), the windows' sizes, the loop's own logged losses, and the epoch's totals.
A trace's ``verdict`` is the report's codes, ``()`` for a run verify passes with nothing to say;
``accumlib.reference`` sets it beside the verdict each loop's contract promises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._verify import Report, StepRow, verify
from .checks import resolve_device
from .loops import contract_of
from .tasks import Task

__all__ = ["Trace", "trace_loop", "verdict_text"]


def verdict_text(codes: tuple[str, ...]) -> str:
    """A verdict as the table prints it: its codes, or ``ok`` for none.

    >>> verdict_text(()), verdict_text(("batchnorm", "unscaled-sum"))
    ('ok', 'batchnorm, unscaled-sum')
    """
    return ", ".join(codes) or "ok"


@dataclass(frozen=True)
class Trace:
    """One epoch of a reference loop as ``verify`` judged it, with the loop's logged losses.

    >>> from accumlib import get_task, normalized
    >>> trace = trace_loop(normalized, get_task("mlp-digits"))
    >>> trace.window_batches, trace.window_items, trace.n_items  # the tail: 2 micro-batches, 8 + 6 items
    ([4, 4, 4, 2], [32, 32, 32, 14], 110)
    >>> trace.verdict  # the tail divided by 4, not 2; its micro-batches of 8 and 6 weighed alike
    ('mean-of-means', 'tail-misscaled')
    """

    report: Report
    logged: list[float]  # the loop's own return: each step's logged loss ([] for a loop that logs none)
    n_batches: int  # micro-batches in the epoch, stepped or not

    @property
    def comparisons(self) -> tuple[StepRow, ...]:
        """Per optimizer step: its relative error, norm ratio and cosine against the true gradient."""
        return self.report.steps

    @property
    def window_batches(self) -> list[int]:
        return [s.micro_batches for s in self.report.steps]

    @property
    def window_items(self) -> list[int]:
        return [s.items for s in self.report.steps]

    @property
    def n_items(self) -> int:
        return int(self.report.items_total or 0)

    @property
    def verdict(self) -> tuple[str, ...]:
        """verify's codes for the run, sorted; ``()`` where it found nothing to say."""
        return tuple(sorted(self.report.codes))


def trace_loop(
    loop: Callable[..., list[float]],
    task: Task,
    *,
    accum_steps: int | None = None,
    batch_size: int | None = None,
    lr: float = 0.05,
    seed: int = 0,
    device: str | torch.device | None = None,
    **loop_kwargs: Any,
) -> Trace:
    """Train a fresh model of ``task`` for one epoch with ``loop`` under ``verify``.

    A reference loop gets the task fields its contract takes (its item counter, its merge), which
    ``loop_kwargs`` may replace; ``device=None`` keeps the fresh model on the CPU, where it is built.

    >>> from accumlib import get_task, naive
    >>> trace = trace_loop(naive, get_task("mlp-digits"))
    >>> len(trace.comparisons), round(trace.comparisons[0].norm_ratio), trace.verdict
    (4, 4, ('unscaled-sum',))
    """
    k = accum_steps or task.accum_steps
    bs = batch_size or task.batch_size
    device = None if device is None else resolve_device(device)
    contract = contract_of(loop)
    if contract is not None:
        loop_kwargs = contract.kwargs_for(task) | loop_kwargs
    dataset = task.make_dataset()
    logged: list[float] = []

    def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> Any:
        out = loop(model, optimizer, loader, task.item_losses, accum_steps=k, device=device, **loop_kwargs)
        # a run verify repeats (the recompute oracle after an autocast loop) keeps the last run's losses;
        # a loop of the lessons' that logs nothing logs nothing here
        logged[:] = [] if out is None else list(out)
        return out

    report = verify(
        train,
        model=task.make_model(seed).to(device),
        dataset=dataset,
        item_losses=task.item_losses,
        accum_steps=k,
        batch_size=bs,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr),
        collate_fn=task.collate_fn,
    )
    return Trace(report, logged, math.ceil(len(dataset) / bs))  # type: ignore[arg-type]
