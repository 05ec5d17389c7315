"""A LightningModule over the digits MLP, as a Lightning user writes one: for ``verify_fit``.

``training_step`` returns the mean cross-entropy of its micro-batch; with
``Trainer(accumulate_grad_batches=k)`` Lightning divides it by k and steps on the final batch of
the epoch too, still divided by k. On 110 digits in micro-batches of 8 (13 of 8 and one of 6),
k = 4, the last window holds 2 micro-batches (8 + 6 digits) and gets (1/4)(mean_8 + mean_6):
about half the true gradient, and its two micro-batches weighted alike.

    >>> import torch, accumlib
    >>> from accumlib_course.examples.lightning_digits import Digits, item_losses
    >>> from accumlib.lightning import verify_fit
    >>> loader = torch.utils.data.DataLoader(accumlib.data.digits(110), batch_size=8)
    >>> report = verify_fit(Digits(), loader, item_losses=item_losses,
    ...                     accumulate_grad_batches=4)  # doctest: +SKIP
    >>> sorted(report.codes)  # doctest: +SKIP
    ['mean-of-means', 'tail-misscaled']
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from accumlib.tasks import get_task

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - lightning is in the notebooks and test extras
    raise ImportError(
        "accumlib_course.examples.lightning_digits needs lightning: pip install accumlib[notebooks]"
    ) from err


class Digits(pl.LightningModule):
    """The digits MLP (``accumlib.get_task("mlp-digits")``), trained with SGD."""

    def __init__(self, seed: int = 0, lr: float = 0.05) -> None:
        super().__init__()
        self.model = get_task("mlp-digits").make_model(seed)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.model(x), y)  # the micro-batch's mean

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def item_losses(module: Digits, batch: Any) -> torch.Tensor:
    """The loss ``training_step`` averages, one per digit."""
    x, y = batch
    return F.cross_entropy(module(x), y, reduction="none")


__all__ = ["Digits", "item_losses"]
