"""The oracle as a loop: one forward/backward over the whole window at once.

    grad (1/N) sum_i l_i   computed directly on the merged window of N items

Needs the memory of the large batch, which is what accumulation exists to avoid;
every other loop is judged against the gradient this one takes.
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
    cat_batches,
    checked_losses,
    progress_bar,
    to_device,
    windows,
)
from ..checks import check_callable, check_device, check_int, check_model
from ._contract import Contract


def large_batch(
    model: nn.Module,
    optimizer: Optimizer,
    loader: Iterable[Batch],
    item_losses: ItemLosses,
    *,
    accum_steps: int,
    device: Device = None,
    progress: Progress = False,
    merge: Callable[[list[Batch]], Batch] = cat_batches,
) -> list[float]:
    """Run one epoch; each window of ``accum_steps`` micro-batches is merged and stepped once.

    Takes the keywords every loop takes (``accum_steps``, ``device``, ``progress``; see
    ``accumlib.loops``) and ``merge`` (joins a window's micro-batches into one batch).

    >>> from accumlib import get_task
    >>> from accumlib.harness import trace_loop
    >>> trace_loop(large_batch, get_task("cnn-batchnorm")).verdict  # BatchNorm too: it is the oracle
    ()
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    merge = check_callable("merge", merge, "merge(micro_batches) -> batch")
    model = check_model(model)
    device = check_device(device, model)  # None: the model's own device
    bar = progress_bar(progress, loader, "large_batch")
    logged = []
    for window in windows(loader, accum_steps):
        losses = checked_losses(item_losses, model, to_device(merge(window), device))
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(losses.detach().mean().item())
        bar.update(len(window))
        bar.set_postfix(loss=logged[-1])
    bar.close()
    return logged


# One forward over the merged window is the oracle itself, BatchNorm's statistics included.
CONTRACT = Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm=(), order=5, takes=("merge",))
