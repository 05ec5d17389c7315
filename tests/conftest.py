"""Shared set-up, and the helpers verify's tests share (one definition each; a test module binds its own
defaults with ``functools.partial``)."""

from __future__ import annotations

import os
from typing import Any

import _schedule
import pytest
import torch
import torch.nn.functional as F

import accumlib
from accumlib.tolerances import FLOAT32_RTOL

# Two cores in CI: one intra-op thread per test process keeps timings and rounding stable.
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")
# nanoGPT's scripts, vendored unmodified (tests/_nanogpt.py runs them): not test modules, and importing one
# (as --doctest-modules would) runs it
collect_ignore = ["scripts"]

DIGITS = accumlib.get_task("mlp-digits")  # 110 items, batches of 8: 14 micro-batches, windows 4, 4, 4, 2
K = 4  # micro-batches per optimizer step in verify's digits tests
B = 8  # items per micro-batch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def verify_digits(
    fn: Any,
    *,
    n: int | None = None,
    k: int = K,
    b: int = B,
    task: Any = DIGITS,
    model: torch.nn.Module | None = None,
    dataset: Any = None,
    **kw: Any,
) -> accumlib.Report:
    """``accumlib.verify(fn)`` on a task's model (seed 0): its own dataset, or ``n`` digits, or ``dataset``;
    ``k`` micro-batches of ``b`` items per step (``accum_steps=``/``batch_size=``/``item_losses=`` in ``kw``
    win)."""
    if dataset is None:
        dataset = task.make_dataset() if n is None else accumlib.data.digits(n)
    kw = {
        "accum_steps": k,
        "batch_size": b,
        "collate_fn": task.collate_fn,
        "item_losses": task.item_losses,
    } | kw
    model = task.make_model(0) if model is None else model
    return accumlib.verify(fn, model=model, dataset=dataset, **kw)


def windows_of(loader: Any, k: int = K) -> list[list[Any]]:
    """The loader's micro-batches in windows of ``k`` (the last may be shorter)."""
    batches = list(loader)
    return [batches[s : s + k] for s in range(0, len(batches), k)]


def exact_loop(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any, k: int = K) -> None:
    """The correct loop on digits: every item weighs 1/N of its window, the tail stepped."""
    for window in windows_of(loader, k):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def within_rounding(report: accumlib.Report) -> bool:
    """Every judged step is the true large-batch gradient up to float32 rounding."""
    return max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


def exact(report: accumlib.Report, *, notes: bool = False) -> bool:
    """OK with no finding at all (``notes``: or only notes and costs), every step within float32 rounding
    of the truth."""
    return report.ok and (notes or not report.codes) and within_rounding(report)


# make test's two workers: the balanced scheduler, and `make durations`' record (tests/_schedule.py)
pytest_xdist_make_scheduler = _schedule.make_scheduler
pytest_runtest_logreport = _schedule.record_report
pytest_sessionfinish = _schedule.write_record
