"""Run a loop under a step pre-hook and judge every step against the oracle.

At every ``optimizer.step()`` the hook compares the gradient the optimizer is about to use
with the true large-batch gradient of the micro-batches drawn since the previous step, at
the current parameters (the ones that window started from; a GradScaler has already
unscaled ``.grad`` by then). ``classify`` names what the steps show, in the verdicts a
loop's contract promises (``accumlib.loops``); ``accumlib.reference`` tabulates both.

This harness judges the reference loops, which step with a plain ``optimizer.step()``; for a
user's loop (closures, clipping, schedulers, frameworks) use ``accumlib.verify``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .batches import Recording
from .checks import resolve_device
from .compare import Comparison, compare
from .loops import CLOSE, EXACT, OFF_BY_K, WRONG, contract_of
from .oracle import grads_of, true_gradient
from .tasks import Task
from .tolerances import BF16_RTOL, FLOAT32_RTOL, OFF_BY_K_TOL

__all__ = ["CLOSE", "EXACT", "OFF_BY_K", "WRONG", "Trace", "classify", "trace_loop"]


@dataclass
class Trace:
    """Per optimizer step: the comparison with the oracle and the window's micro-batch count.

    >>> from accumlib import get_task, normalized
    >>> trace = trace_loop(normalized, get_task("mlp-digits"))
    >>> trace.window_batches, trace.window_items, trace.n_items  # the tail: 2 micro-batches, 8 + 6 items
    ([4, 4, 4, 2], [32, 32, 32, 14], 110)
    """

    comparisons: list[Comparison] = field(default_factory=list)
    window_batches: list[int] = field(default_factory=list)
    window_items: list[int] = field(default_factory=list)
    logged: list[float] = field(default_factory=list)
    n_batches: int = 0
    n_items: int = 0


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
    """Train a fresh model of ``task`` for one epoch with ``loop``; compare every step with the oracle.

    A reference loop gets the task fields its contract takes (its item counter, its merge);
    ``device=None`` keeps the fresh model on the CPU, where it is built.

    >>> from accumlib import get_task, naive
    >>> trace = trace_loop(naive, get_task("mlp-digits"))
    >>> len(trace.comparisons), round(trace.comparisons[0].norm_ratio)
    (4, 4)
    """
    k = accum_steps or task.accum_steps
    device = None if device is None else resolve_device(device)
    model = task.make_model(seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = Recording(task.loader(batch_size))
    trace, everything = Trace(), []

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        window = loader.take()
        everything.extend(window)
        oracle = true_gradient(model, window, task.item_losses, merge=task.merge, device=device)
        trace.comparisons.append(compare(grads_of(model), oracle))
        trace.window_batches.append(len(window))
        trace.window_items.append(sum(task.count_items(b) for b in window))

    contract = contract_of(loop)
    if contract is not None:
        loop_kwargs = contract.kwargs_for(task) | loop_kwargs
    handle = optimizer.register_step_pre_hook(before_step)
    try:
        trace.logged = loop(
            model, optimizer, loader, task.item_losses, accum_steps=k, device=device, **loop_kwargs
        )
    finally:
        handle.remove()
    everything.extend(loader.take())  # drawn after the last step: a dropped tail
    trace.n_batches = len(everything)
    trace.n_items = sum(task.count_items(b) for b in everything)
    return trace


def classify(trace: Trace, *, low_precision: bool = False) -> str:
    """Name what a trace shows: exact, close (bf16), off by ~k, or not exact.

    >>> from accumlib import get_task, ragged
    >>> classify(trace_loop(ragged, get_task("mlp-digits")))
    'exact'
    """
    if not trace.comparisons:
        raise ValueError("trace must hold at least one optimizer step (got none: the loop never stepped)")
    worst = max(c.rel_error for c in trace.comparisons)
    if worst <= FLOAT32_RTOL:
        return EXACT
    if low_precision and worst <= BF16_RTOL:
        return CLOSE
    if all(
        abs(c.norm_ratio - m) <= OFF_BY_K_TOL * m for c, m in zip(trace.comparisons, trace.window_batches)
    ):
        return OFF_BY_K
    return WRONG
