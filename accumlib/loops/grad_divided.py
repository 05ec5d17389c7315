"""The seed's second form: backward on each micro-batch *mean*, then divide ``.grad`` by k once.

For k micro-batches of equal size, dividing the gradient after the window equals
dividing each loss (``normalized``):

    (1/k) * sum_j grad( mean_{i in b_j} l_i )  ==  grad (1/N) sum_i l_i

It shares ``normalized``'s limits (a partial window divided by k, unequal micro-batches
weighed per micro-batch) and adds a loop over the parameters; dividing the loss is
the same arithmetic for free, which is why it is the usual form.
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


def grad_divided(
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
    >>> trace = trace_loop(grad_divided, get_task("mlp-digits"))  # normalized's tail bug, too
    >>> [round(c.norm_ratio, 2) for c in trace.comparisons]
    [1.0, 1.0, 1.0, 0.49]
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    model = check_model(model)
    device = check_device(device, model)  # None: the model's own device
    bar = progress_bar(progress, loader, "grad_divided")
    logged = []
    for window in windows(loader, accum_steps):
        total, n = 0.0, 0
        for batch in window:
            losses = checked_losses(item_losses, model, to_device(batch, device), check_finite=False)
            losses.mean().backward()  # not divided: .grad holds the sum of the micro-batch gradients
            total, n = total + losses.detach().sum(), n + losses.numel()
            bar.update()
        loss = window_mean(total, n)
        for p in model.parameters():
            if p.grad is not None:
                p.grad = p.grad / accum_steps  # once, after the last micro-batch: their average
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(loss)
        bar.set_postfix(loss=logged[-1])
    bar.close()
    return logged


# normalized's arithmetic with the division moved onto .grad, so normalized's limits too;
# out of the table (normalized stands for both), run beside it in lesson 2.
CONTRACT = Contract(
    full_windows=(),
    ragged_tail=("mean-of-means", "tail-misscaled"),
    token_counts=("mean-of-means",),
    batchnorm=("batchnorm",),
    order=None,
)
