"""Accelerate's ``accumulate()`` as its documentation writes it, on the digits MLP: for plain
``accumlib.verify``.

``accelerator.backward`` divides every micro-batch's mean loss by k, and ``accumulate`` steps at
every k-th micro-batch and at the end of the loader. On 110 digits in micro-batches of 8 (13 of
8 and one of 6), k = 4, the last window holds 2 micro-batches and gets (1/4)(mean_8 + mean_6):
about half the true gradient, its two micro-batches weighted alike.

    >>> import accumlib
    >>> from accumlib_course.examples import accelerate_digits as ex
    >>> task = accumlib.get_task("mlp-digits")
    >>> report = accumlib.verify(ex.train, model=task.make_model(0), dataset=accumlib.data.digits(110),
    ...                          item_losses=task.item_losses, accum_steps=4, batch_size=8)  # doctest: +SKIP
    >>> sorted(report.codes)  # doctest: +SKIP
    ['mean-of-means', 'tail-misscaled']
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

K = 4  # gradient_accumulation_steps


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> None:
    """One epoch of Accelerate's documented accumulation loop."""
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)  # the micro-batch's mean
            accelerator.backward(loss)  # divided by k, whatever the window holds
            optimizer.step()  # steps only at the end of a window, or of the loader
            optimizer.zero_grad()


__all__ = ["K", "train"]
