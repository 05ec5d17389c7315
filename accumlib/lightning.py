"""``verify_fit``: ``accumlib.verify`` on a PyTorch Lightning ``Trainer.fit``, in one line.

``verify_fit(module, loader, item_losses=..., accumulate_grad_batches=4)`` runs
``lightning.Trainer(**trainer_kwargs).fit`` on a copy of ``module``: its ``training_step``, its
``configure_optimizers``, and the Trainer's ``accumulate_grad_batches``, ``gradient_clip_val`` and
``precision``. Every optimizer step is judged against the true gradient of the mean item loss
over the step's micro-batches.

What runs differs from ``Trainer(**trainer_kwargs).fit(module, loader)`` only where a comparison
needs it: one epoch unless ``max_steps`` is given, no logger, no checkpoints, no validation, no
progress bar, files only in a temporary folder, the loader's batches drawn in the main process
(verify records each as it arrives), and dropout off in the copy.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ._verify import Report, verify
from .batches import ItemLosses
from .checks import check_callable, check_int

# Trainer arguments verify_fit sets itself (a user's values are replaced): none changes how
# gradients accumulate, and each would write files, print, or run forwards on other data
OWN = (
    "logger",
    "enable_checkpointing",
    "enable_progress_bar",
    "enable_model_summary",
    "default_root_dir",
    "limit_val_batches",
    "num_sanity_val_steps",
    "max_epochs",
    "devices",
)


def _lightning_for(module: Any) -> Any:
    """The package whose LightningModule ``module`` is: ``lightning.pytorch`` or ``pytorch_lightning``."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            pl = __import__(name, fromlist=["LightningModule"])
        except ImportError:
            continue
        if isinstance(module, pl.LightningModule):
            return pl
    raise TypeError(
        "module must be a LightningModule (lightning.pytorch or pytorch_lightning) (got "
        f"{type(module).__name__})"
    )


class _Steps(torch.nn.Module):
    """verify's model: the LightningModule copy, with each ``training_step`` passed through this
    module's ``__call__``, where verify's forward hook sees the micro-batch (a ``training_step``
    that calls ``self.model(x)``, not ``self(x)``, would otherwise never reach it)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.module).training_step(self.module, *args, **kwargs)


def _check(
    module: Any, train_dataloaders: Any, item_losses: Any, max_steps: Any, trainer_kwargs: dict[str, Any]
) -> Any:
    """Refuse bad input before anything runs; return the Lightning package of ``module``."""
    pl = _lightning_for(module)
    if not isinstance(train_dataloaders, DataLoader):
        hint = (
            " (pass datamodule.train_dataloader())" if hasattr(train_dataloaders, "train_dataloader") else ""
        )
        raise TypeError(
            "train_dataloaders must be one torch.utils.data.DataLoader, whose dataset, batch_size and "
            f"collate_fn verify takes over{hint} (got {type(train_dataloaders).__name__})"
        )
    if train_dataloaders.batch_size is None:
        raise ValueError(
            "train_dataloaders must batch with batch_size, not a batch_sampler of its own "
            f"(got batch_size=None, batch_sampler={type(train_dataloaders.batch_sampler).__name__})"
        )
    check_callable("item_losses", item_losses, "item_losses(module, batch)")
    check_int("max_steps", max_steps, low=1, optional=True)
    check_int("accumulate_grad_batches", trainer_kwargs.get("accumulate_grad_batches", 1), low=1)
    devices = trainer_kwargs.get("devices", 1)
    if (
        not (devices in (1, "1") or (isinstance(devices, (list, tuple)) and len(devices) == 1))
        or trainer_kwargs.get("num_nodes", 1) != 1
    ):
        raise ValueError(
            "trainer_kwargs must run one process on one device (devices=1, num_nodes=1): verify_fit judges a "
            f"single-process run (got devices={devices!r}, num_nodes={trainer_kwargs.get('num_nodes', 1)!r})"
        )
    return pl


def _sampler_copy(loader: DataLoader) -> tuple[Any, torch.Generator | None]:
    """The user's sampler and generator, deep-copied together without the dataset (they only draw
    indices): a DataLoader draws a seed from its generator before its sampler draws the order, so
    the copies draw the user's order, and the user's generator stays where it was."""
    if isinstance(loader.dataset, IterableDataset):
        return None, None
    return copy.deepcopy((loader.sampler, loader.generator), memo={id(loader.dataset): loader.dataset})


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Lightning's samplers and seeding draw from the global generators: put them back."""
    import numpy as np

    state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(state[0])
        random.setstate(state[1])
        np.random.set_state(state[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def verify_fit(
    module: Any,
    train_dataloaders: DataLoader,
    *,
    item_losses: ItemLosses,
    max_steps: int | None = None,
    **trainer_kwargs: Any,
) -> Report:
    """Run ``Trainer(**trainer_kwargs).fit(copy of module, train_dataloaders)`` and judge every step.

    ``item_losses(module, batch)`` returns one loss per item (``reduction="none"``) of the loss
    ``training_step`` averages. ``trainer_kwargs`` are the user's ``lightning.Trainer`` arguments
    (``accumulate_grad_batches``, ``gradient_clip_val``, ``precision``, ``accelerator``, ...).
    ``max_steps`` judges the first N optimizer steps. ``module`` and ``train_dataloaders`` (its
    sampler's generator included) are left as they were.

    >>> report = verify_fit(module, loader, item_losses=losses, accumulate_grad_batches=4)  # doctest: +SKIP
    >>> # 110 items, batches of 8: the last window of 2 is divided by 4
    >>> sorted(report.codes)  # doctest: +SKIP
    ['mean-of-means', 'tail-misscaled']
    """
    pl = _check(module, train_dataloaders, item_losses, max_steps, trainer_kwargs)
    user = train_dataloaders
    k = trainer_kwargs.get("accumulate_grad_batches", 1)  # checked by _check
    sampler, generator = _sampler_copy(user)

    kwargs = {k: v for k, v in trainer_kwargs.items() if k not in OWN + ("callbacks",)}
    kwargs |= dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        devices=trainer_kwargs.get("devices", 1),
    )
    kwargs |= {"max_steps": max_steps} if max_steps else {"max_epochs": 1}
    callbacks = trainer_kwargs.get("callbacks") or []
    callbacks = [callbacks] if not isinstance(callbacks, (list, tuple)) else callbacks

    def train_fn(steps: _Steps, optimizer: torch.optim.Optimizer, loader: DataLoader) -> None:
        lm = steps.module
        # through __call__: verify's hook sees each micro-batch
        lm.training_step = lambda *a, **kw: steps(*a, **kw)
        # the user's batching, sampler, generator and drop_last over verify's recording dataset and collate_fn
        data = DataLoader(
            loader.dataset,
            batch_size=user.batch_size,
            sampler=sampler,
            drop_last=user.drop_last,
            collate_fn=loader.collate_fn,
            generator=generator,
            num_workers=0,
            pin_memory=user.pin_memory,
        )
        log = logging.getLogger(pl.__name__)
        level = log.level
        log.setLevel(logging.WARNING)  # its banner (GPU available: ...), not about accumulation
        try:
            with tempfile.TemporaryDirectory(prefix="accumlib-lightning-") as root, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Lightning's advice on workers and loggers
                # the user's callbacks, copied; checkpointing ones would write files
                own = [copy.deepcopy(cb) for cb in callbacks if not isinstance(cb, pl.callbacks.Checkpoint)]
                pl.Trainer(**kwargs, callbacks=own, default_root_dir=root).fit(lm, data)
        finally:
            log.setLevel(level)

    with _rng_kept():
        return verify(
            train_fn,
            model=_Steps(module),
            dataset=user.dataset,
            item_losses=lambda m, b: item_losses(m.module, b),
            accum_steps=k,
            batch_size=user.batch_size,
            collate_fn=user.collate_fn,
            max_steps=max_steps,
        )


__all__ = ["verify_fit"]
