"""Textbook accumulation: divide each micro-batch mean by ``accum_steps``.

    grad (1/N) sum_i l_i  ==  sum_j grad( mean_{i in b_j} l_i / k )

holds only when the window has exactly k micro-batches of |b_j| = N/k items each.
It breaks on a last, partial window (still divided by k, so scaled by m/k for m < k
micro-batches), on a smaller last micro-batch, and on token counts that differ
between micro-batches (every micro-batch weighs 1/k, not |b_j|/N).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.optim import Optimizer

from ..batches import (
    Batch,
    Device,
    ItemLosses,
    Progress,
    checked_losses,
    progress_bar,
    to_device,
    window_mean,
    windows,
)
from ..checks import check_device, check_int, check_model
from ._contract import Contract


def normalized(
    model: nn.Module,
    optimizer: Optimizer,
    loader: Iterable[Batch],
    item_losses: ItemLosses,
    *,
    accum_steps: int,
    device: Device = None,
    progress: Progress = False,
) -> list[float]:
    """Run one epoch; return the true mean item loss of each optimizer step's window.

    Takes the keywords every loop takes (``accum_steps``, ``device``, ``progress``; see
    ``accumlib.loops``).

    >>> from accumlib import get_task
    >>> from accumlib.harness import trace_loop
    >>> # 110 items: the last window holds 2 micro-batches, divided by 4, not by 2
    >>> trace = trace_loop(normalized, get_task("mlp-digits"))
    >>> [round(c.norm_ratio, 2) for c in trace.comparisons]
    [1.0, 1.0, 1.0, 0.49]
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    model = check_model(model)
    device = check_device(device, model)  # None: the model's own device
    bar = progress_bar(progress, loader, "normalized")
    logged = []
    for window in windows(loader, accum_steps):
        total, n = 0.0, 0
        for batch in window:
            losses = checked_losses(item_losses, model, to_device(batch, device), check_finite=False)
            (losses.mean() / accum_steps).backward()  # right only for k equal micro-batches
            total, n = total + losses.detach().sum(), n + losses.numel()
            bar.update()
        loss = window_mean(total, n)  # one sync per window; refuses a non-finite loss before the step
        optimizer.step()  # the tail window is stepped too, scaled as if it were full
        optimizer.zero_grad(set_to_none=True)
        logged.append(loss)  # the window's true mean, not the divided value
        bar.set_postfix(loss=logged[-1])
    bar.close()
    return logged


# Exact only for full windows of equal micro-batches: a partial window is still divided by k,
# unequal token counts are weighed per micro-batch, BatchNorm sees micro-batch statistics.
CONTRACT = Contract(
    full_windows=(),
    ragged_tail=("mean-of-means", "tail-misscaled"),
    token_counts=("mean-of-means",),
    batchnorm=("batchnorm",),
    order=2,
)
