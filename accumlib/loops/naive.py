"""Naive accumulation: backward on each micro-batch *mean*, never divided. Kept as the bug.

What it computes, for a window of k micro-batches b_1..b_k:

    sum_j grad( mean_{i in b_j} l_i )   ~=   k * grad( (1/N) sum_i l_i )

so every step is about k times too large (exactly k when the micro-batches are the
same size). With SGD that is a k-times learning rate; Adam hides it, which is why
the bug survives.
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


def naive(
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

    >>> import torch
    >>> from accumlib import naive, get_task
    >>> task = get_task("mlp-digits"); model = task.make_model(0)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> len(naive(model, opt, task.loader(), task.item_losses, accum_steps=4))
    4
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    model = check_model(model)
    device = check_device(device, model)  # None: the model's own device
    bar = progress_bar(progress, loader, "naive")
    logged = []
    for window in windows(loader, accum_steps):
        total, n = 0.0, 0
        for batch in window:
            losses = checked_losses(item_losses, model, to_device(batch, device), check_finite=False)
            losses.mean().backward()  # the bug: k means are summed into .grad, not averaged
            total, n = total + losses.detach().sum(), n + losses.numel()
            bar.update()
        loss = window_mean(total, n)  # one sync per window; refuses a non-finite loss before the step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(loss)
        bar.set_postfix(loss=logged[-1])
    bar.close()
    return logged


# Every micro-batch mean is summed undivided: m times the truth for a window of m micro-batches,
# whatever the task (BatchNorm's per-micro-batch statistics move the direction, not the size).
CONTRACT = Contract(
    full_windows=("unscaled-sum",),
    ragged_tail=("unscaled-sum",),
    token_counts=("unscaled-sum",),
    batchnorm=("batchnorm", "unscaled-sum"),
    order=1,
)
