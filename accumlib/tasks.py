"""The task contract and the built-in tasks.

A task is ``item_losses(model, batch) -> 1-D tensor``: the unreduced loss of every
item in a micro-batch, where an item is a sample, or a non-ignored token for a
language model. The true large-batch loss of a window is the mean of all its items'
losses; its gradient at the window's starting parameters is the oracle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from . import data as _data
from .batches import cat_batches, count_items
from .checks import check_choice
from .models import MLP, SmallCNN, TinyLM


def classification_losses(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every sample: ``[batch_size]``.

    >>> classification_losses(torch.nn.Linear(4, 2), (torch.zeros(3, 4), torch.tensor([0, 1, 1]))).shape
    torch.Size([3])
    """
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def token_losses(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every non-ignored target token: ``[n_tokens]``, padding dropped.

    >>> from accumlib.data import pad_collate
    >>> from accumlib.models import TinyLM
    >>> batch = pad_collate([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    >>> token_losses(TinyLM(), batch).shape  # 2 + 1 targets
    torch.Size([3])
    """
    inputs, targets = batch
    logits = model(inputs)
    keep = targets != _data.IGNORE_INDEX
    return F.cross_entropy(logits[keep], targets[keep], reduction="none")


@dataclass(frozen=True)
class Task:
    """Everything a loop, the oracle and ``verify`` need to run one problem.

    ``make_model(seed)`` and ``make_dataset()`` build fresh objects every call, so
    two runs never share state. ``merge`` joins micro-batches into the large batch;
    ``count_items`` counts a micro-batch's items without a forward pass.

    >>> task = get_task("mlp-digits")
    >>> batch = next(iter(task.loader()))
    >>> task.count_items(batch), task.item_losses(task.make_model(0), batch).shape
    (8, torch.Size([8]))
    """

    name: str
    description: str
    make_model: Callable[[int], torch.nn.Module]
    make_dataset: Callable[[], Dataset]
    item_losses: Callable[[torch.nn.Module, Any], torch.Tensor]
    collate_fn: Callable[[list], Any] | None = None
    count_items: Callable[[Any], int] = count_items
    merge: Callable[[list], Any] = cat_batches
    batch_size: int = 8
    accum_steps: int = 4
    tags: tuple[str, ...] = field(default_factory=tuple)

    def loader(self, batch_size: int | None = None, dataset: Dataset | None = None) -> DataLoader:
        """A deterministic (unshuffled) loader that keeps its last, smaller batch."""
        return DataLoader(
            dataset if dataset is not None else self.make_dataset(),
            batch_size=batch_size or self.batch_size,
            shuffle=False,
            drop_last=False,
            collate_fn=self.collate_fn,
        )


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[int], torch.nn.Module]:
    def make(seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        return factory()

    return make


TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task(
            "mlp-digits",
            "MLP on 110 digits; batch 8 x accumulation 4 leaves a 2-batch tail whose last batch holds 6",
            _seeded(MLP),
            functools.partial(_data.digits, 110),
            classification_losses,
            batch_size=8,
            accum_steps=4,
            tags=("ragged-tail",),
        ),
        Task(
            "lm-tokens",
            "tiny causal LM on sequences of 4 to 40 tokens; items are non-padding tokens",
            _seeded(TinyLM),
            functools.partial(_data.TokenSequences, 64),
            token_losses,
            collate_fn=_data.pad_collate,
            count_items=_data.count_tokens,
            merge=functools.partial(cat_batches, pad_values=(_data.PAD_ID, _data.IGNORE_INDEX)),
            batch_size=4,
            accum_steps=4,
            tags=("token-counts",),
        ),
        Task(
            "cnn-batchnorm",
            "CNN with BatchNorm on 128 digit images: statistics per micro-batch differ from the large batch",
            _seeded(functools.partial(SmallCNN, norm="batch")),
            functools.partial(_data.digits, 128, image=True),
            classification_losses,
            batch_size=4,  # small micro-batches make per-micro-batch statistics visibly noisy
            accum_steps=4,
            tags=("batchnorm",),
        ),
        Task(
            "cnn-groupnorm",
            "the same CNN with GroupNorm on the same 128 images: per-sample statistics, exact",
            _seeded(functools.partial(SmallCNN, norm="group")),
            functools.partial(_data.digits, 128, image=True),
            classification_losses,
            batch_size=4,
            accum_steps=4,
        ),
    ]
}


def get_task(name: str) -> Task:
    """Look up a built-in task by name, with the list of names in the error.

    >>> task = get_task("lm-tokens")
    >>> task.tags, task.accum_steps
    (('token-counts',), 4)
    >>> get_task("mnist")
    Traceback (most recent call last):
    ValueError: task must be one of 'cnn-batchnorm', 'cnn-groupnorm', 'lm-tokens', 'mlp-digits' (got 'mnist')
    """
    return TASKS[check_choice("task", name, sorted(TASKS))]


__all__ = ["TASKS", "Task", "classification_losses", "get_task", "token_losses"]
