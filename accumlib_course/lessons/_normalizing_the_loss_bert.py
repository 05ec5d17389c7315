"""Lesson 2's BERT-style loop: the seed's loop (ported once, in ``accumlib_course.gallery``), its fix, and one
epoch of each on the same data (``bert_epoch``), the reported loss against the true one.

A part of ``normalizing_the_loss.py``, which re-exports every name here.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from accumlib import get_task
from accumlib.checks import check_int, resolve_device
from accumlib.data import N_DIGITS, digits_subset
from accumlib.tolerances import FLOAT32_RTOL

from ..gallery import bert_train_one_epoch  # the seed's loop, ported once

TASK = "mlp-digits"
N_WINDOWS = 2  # two full windows per run: the division is the only thing that differs between the loops


# --- the seed's BERT-style loop (ported once, in accumlib_course.gallery) and its fix -----------------


def bert_train_one_epoch_fixed(
    model,
    optimizer,
    scheduler,
    dataloader,
    device,
    epoch,
    *,
    n_accumulate,
    criterion,
    progress=False,
    collect=True,
):
    """The same loop, fixed: divide a copy for ``backward``, log the undivided micro-batch loss."""
    model.train()
    dataset_size = 0
    running_loss = 0.0
    bar = tqdm(enumerate(dataloader), total=len(dataloader), disable=not progress)
    for step, data in bar:
        inputs = data[0].to(device)
        targets = data[1].to(device, dtype=torch.long)
        batch_size = inputs.size(0)
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        (loss / n_accumulate).backward()  # the gradient wants the division ...
        if (step + 1) % n_accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
        running_loss += loss.item() * batch_size  # ... the log does not
        dataset_size += batch_size
        epoch_loss = running_loss / dataset_size
        bar.set_postfix(Epoch=epoch, Train_Loss=epoch_loss, LR=optimizer.param_groups[0]["lr"])
    if collect:  # the seed's gc.collect(); it frees nothing here and costs ~0.5 s, so compute() skips it
        gc.collect()
    return epoch_loss


def make_optimizer(params) -> torch.optim.Optimizer:
    """AdamW, as in BERT fine-tuning."""
    return torch.optim.AdamW(params, lr=1e-3)


def make_scheduler(optimizer: torch.optim.Optimizer, total_steps: int = 64) -> Any:
    """A linear decay over ``total_steps`` optimizer steps, stepped once per window."""
    return torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1.0, end_factor=0.1, total_iters=total_steps
    )


def bert_train_fn(fixed: bool = False, accum_steps: int = 4, progress: bool = False) -> Callable[..., float]:
    """``train_fn(model, optimizer, loader)`` for ``accumlib.verify``: the seed loop (or the fix) with a
    scheduler.
    """
    loop = bert_train_one_epoch_fixed if fixed else bert_train_one_epoch

    def train_fn(model, optimizer, loader):
        device = next(model.parameters()).device
        return loop(
            model,
            optimizer,
            make_scheduler(optimizer),
            loader,
            device,
            0,
            n_accumulate=accum_steps,
            criterion=torch.nn.functional.cross_entropy,
            progress=progress,
        )

    return train_fn


@dataclass(frozen=True)
class BertRun:
    """The epoch loss each loop reports, and the true mean item loss of the epoch (recorded independently)."""

    accum_steps: int
    reported: float
    reported_fixed: float
    true: float


def bert_epoch(
    accum_steps: int = 4, batch_size: int = 8, *, seed: int = 0, device: Any = "auto", progress: bool = False
) -> BertRun:
    """One epoch of the seed loop and of the fix, from one initial model, on ``N_WINDOWS`` full windows.

    The true epoch loss is the mean of every item loss the criterion computed, recorded by a
    wrapper around the criterion, so it does not depend on how either loop logs.
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    batch_size = check_int(
        "batch_size",
        batch_size,
        low=1,
        high=N_DIGITS // (N_WINDOWS * accum_steps),
        why=f"{N_WINDOWS} windows of accum_steps x batch_size digits must exist ({N_DIGITS} in all)",
    )
    dev = resolve_device(device)
    data = digits_subset(N_WINDOWS * accum_steps * batch_size, seed)
    out, seen = {}, []
    for fixed in (False, True):
        model = get_task(TASK).make_model(seed).to(dev)
        optimizer = make_optimizer(model.parameters())
        items: list[torch.Tensor] = []

        def criterion(outputs: torch.Tensor, targets: torch.Tensor, items: list = items) -> torch.Tensor:
            losses = torch.nn.functional.cross_entropy(outputs, targets, reduction="none")
            items.append(losses.detach().cpu())
            return losses.mean()

        loop = bert_train_one_epoch_fixed if fixed else bert_train_one_epoch
        out[fixed] = loop(
            model,
            optimizer,
            make_scheduler(optimizer),
            DataLoader(data, batch_size=batch_size),
            dev,
            0,
            n_accumulate=accum_steps,
            criterion=criterion,
            progress=progress,
            collect=False,
        )
        seen.append(float(torch.cat(items).mean()))
    # both loops train identically; only the log differs
    assert abs(seen[0] - seen[1]) <= FLOAT32_RTOL * seen[0]
    return BertRun(accum_steps, out[False], out[True], seen[1])
