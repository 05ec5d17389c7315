"""Exact accumulation for any window: weigh every item by 1 / (items in its window).

For a window of micro-batches b_1..b_m (m <= k, any sizes, any token counts) with
N = sum_j |b_j| items:

    grad (1/N) sum_i l_i  ==  sum_j grad( sum_{i in b_j} l_i / N )

N is counted before the first backward (``count_items`` reads the batch, no forward),
and the last, partial window is stepped, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import nn
from torch.optim import Optimizer

from ..batches import (
    Batch,
    Device,
    ItemLosses,
    Progress,
    check_count,
    checked_losses,
    progress_bar,
    to_device,
    window_items,
    window_mean,
    windows,
)
from ..batches import count_items as _rows
from ..checks import check_callable, check_device, check_int, check_model
from ._contract import Contract


def ragged(
    model: nn.Module,
    optimizer: Optimizer,
    loader: Iterable[Batch],
    item_losses: ItemLosses,
    *,
    accum_steps: int,
    device: Device = None,
    progress: Progress = False,
    count_items: Callable[[Batch], int] = _rows,
) -> list[float]:
    """Run one epoch; return the true mean item loss of each optimizer step's window.

    Takes the keywords every loop takes (``accum_steps``, ``device``, ``progress``; see
    ``accumlib.loops``) and ``count_items`` (a micro-batch's item count, read without a
    forward).

    >>> from accumlib import get_task
    >>> from accumlib.harness import trace_loop
    >>> trace_loop(ragged, get_task("lm-tokens")).verdict  # token counts differ per micro-batch
    ()
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    count_items = check_callable("count_items", count_items, "count_items(batch) -> int")
    model = check_model(model)
    device = check_device(device, model)  # None: the model's own device
    bar = progress_bar(progress, loader, "ragged")
    logged = []
    for window in windows(loader, accum_steps):
        n = window_items(window, count_items)  # the window's item count, known before any backward
        total = 0.0
        for batch in window:
            losses = checked_losses(item_losses, model, to_device(batch, device), check_finite=False)
            check_count(count_items(batch), losses)
            (losses.sum() / n).backward()  # every item weighs 1/n, whichever micro-batch holds it
            total = total + losses.detach().sum()
            bar.update()
        loss = window_mean(total, n)  # one sync per window; refuses a non-finite loss before the step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(loss)
        bar.set_postfix(loss=logged[-1])
    bar.close()
    return logged


# Each item weighs 1/N of its own window, whatever the window holds; only BatchNorm's
# per-micro-batch statistics are out of its reach.
CONTRACT = Contract(
    full_windows=(),
    ragged_tail=(),
    token_counts=(),
    batchnorm=("batchnorm",),
    order=3,
    takes=("count_items",),
)
