"""A Trainer that records what its own training loop trains on: the independent count a test holds
verify's factors against (shared by tests/test_verify_trl.py and tests/test_verify_peft.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


def recording(base: type) -> type:
    """A subclass of the Trainer class ``base`` whose ``training_step`` notes each micro-batch's labels.
    The record is on the class, so verify_trainer's copy, built as ``type(trainer)``, writes there too."""

    class Recording(base):  # type: ignore[misc, valid-type]
        windows: list[list[torch.Tensor]] = [[]]

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            type(self).windows[-1].append(inputs["labels"].clone())
            return super().training_step(model, inputs, num_items_in_batch)

    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording


@contextlib.contextmanager
def windows_of(cls: type) -> Iterator[list[list[torch.Tensor]]]:
    """The labels ``cls`` (from ``recording``) trained on, cut into windows right before each optimizer
    step."""
    cls.windows = [[]]  # type: ignore[attr-defined]
    hook = register_optimizer_step_pre_hook(lambda opt, a, kw: cls.windows.append([]))  # type: ignore[attr-defined]
    try:
        yield cls.windows  # type: ignore[attr-defined]
    finally:
        hook.remove()
