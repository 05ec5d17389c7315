"""Multi-rank training loops, right and wrong, as users write them under torchrun: each wraps the
model in ``DistributedDataParallel`` itself and shards the data with its own ``DistributedSampler``
over ``loader.dataset``. ``accumlib.verify(loop, ..., ranks="all")`` on every rank judges the job.

The correct loop, for a window of micro-batches b_1..b_m on each of R ranks (N_r items on rank r):

    N = all_reduce(sum_r N_r);   loss_j = (R / N) sum_{i in b_j} l_i;   backward under no_sync but the last

DDP's mean over ranks then gives (1/R) sum_r (R/N) O_r = (1/N) sum_r O_r = g*, the gradient of the
mean item loss over every rank's window. Each bug below changes one line of it; ``BUGS`` says what
verify names it. Every loop takes the task's ``item_losses`` (the loss the loop minimizes) and
``count_items`` (a micro-batch's item count, without a forward): ``LOOPS[name](task)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

ItemLosses = Callable[[torch.nn.Module, Any], torch.Tensor]
Train = Callable[[torch.nn.Module, torch.optim.Optimizer, DataLoader], None]


def shard(loader: DataLoader, *, drop_last: bool = False) -> DataLoader:
    """This rank's loader: the same dataset, batch size and collate_fn, one DistributedSampler shard."""
    sampler = DistributedSampler(loader.dataset, shuffle=False, drop_last=drop_last)
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
    )


def windows(loader: DataLoader, k: int) -> Iterator[list[Any]]:
    """The loader's micro-batches, k at a time; the last window holds what is left."""
    window: list[Any] = []
    for batch in loader:
        window.append(batch)
        if len(window) == k:
            yield window
            window = []
    if window:
        yield window


def _train(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loader: DataLoader,
    *,
    item_losses: ItemLosses,
    count_items: Callable[[Any], int],
    k: int,
    global_count: bool = True,
    divide_by_ranks: bool = False,
    sync: str = "last",
    drop_last: bool = False,
    sharded: bool = True,
) -> None:
    """The one loop every variant below is: ``sync`` says which backwards synchronize
    (``last``: the window's last; ``never``: none; ``forward-only``: no_sync around the backward alone)."""
    ddp, world = DDP(model), dist.get_world_size()
    data = shard(loader, drop_last=drop_last) if sharded else loader
    for window in windows(data, k):
        n = torch.tensor(float(sum(count_items(b) for b in window)))
        if global_count:
            dist.all_reduce(n)  # the job's item count: every rank divides by the same N
        scale = (world if global_count else 1.0) / float(n)
        if divide_by_ranks:
            scale /= world  # DDP averages over ranks already
        for j, batch in enumerate(window):
            last = j == len(window) - 1
            quiet = sync == "never" or (sync == "last" and not last)
            with ddp.no_sync() if quiet else contextlib.nullcontext():
                loss = item_losses(ddp, batch).sum() * scale
            with ddp.no_sync() if sync == "forward-only" else contextlib.nullcontext():
                loss.backward()  # DDP decided at the forward whether this backward syncs
        opt.step()
        opt.zero_grad()


def _train_fsdp(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loader: DataLoader,
    *,
    item_losses: ItemLosses,
    count_items: Callable[[Any], int],
    k: int,
    global_count: bool = True,
) -> None:
    """The same loop under FSDP2: ``fully_shard`` replaces the parameters with shards, so the optimizer
    is built over them, with the learning rate of the one handed in; a gradient sync only on the last."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    opt = type(opt)(model.parameters(), lr=opt.param_groups[0]["lr"])
    world = dist.get_world_size()
    for window in windows(shard(loader), k):
        n = torch.tensor(float(sum(count_items(b) for b in window)))
        if global_count:
            dist.all_reduce(n)
        scale = (world if global_count else 1.0) / float(n)
        for j, batch in enumerate(window):
            model.set_requires_gradient_sync(j == len(window) - 1)  # type: ignore[operator]
            (item_losses(model, batch).sum() * scale).backward()
        opt.step()
        opt.zero_grad()


def make_fsdp(**how: Any) -> Callable[[Any], Train]:
    def bind(task: Any) -> Train:
        def train(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: DataLoader) -> None:
            _train_fsdp(
                model,
                opt,
                loader,
                item_losses=task.item_losses,
                count_items=task.count_items,
                k=task.accum_steps,
                **how,
            )

        return train

    return bind


def _uneven(task: Any) -> Train:
    """A correct DDP run, then one more step on rank 1 alone (on the bare model: no collective of the
    loop's own)."""

    def train(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: DataLoader) -> None:
        make()(task)(model, opt, loader)
        if dist.get_rank() == 1:
            batch = next(iter(loader))
            (task.item_losses(model, batch).sum() / task.count_items(batch)).backward()
            opt.step()
            opt.zero_grad()

    return train


def make(**how: Any) -> Callable[[Any], Train]:
    """A loop factory: ``make(...)(task)`` is ``train(model, opt, loader)`` for that task's loss and k."""

    def bind(task: Any) -> Train:
        def train(model: torch.nn.Module, opt: torch.optim.Optimizer, loader: DataLoader) -> None:
            _train(
                model,
                opt,
                loader,
                item_losses=task.item_losses,
                count_items=task.count_items,
                k=task.accum_steps,
                **how,
            )

        return train

    return bind


LOOPS = {
    "correct": make(),
    "per-rank-mean": make(global_count=False),  # each rank divides by its own count (transformers #34242)
    "divided-by-ranks": make(divide_by_ranks=True),  # /R on top of DDP's mean (torchtune #1917)
    "never-synced": make(sync="never"),  # no_sync around every micro-batch: ranks drift apart
    "sync-every-micro-batch": make(sync="forward-only"),  # no_sync around the backward only: DDP syncs anyway
    "drop-last": make(drop_last=True),  # DistributedSampler(drop_last=True) leaves len % R items out
    "unsharded": make(sharded=False),  # no DistributedSampler: every rank trains on the same items
    "fsdp2": make_fsdp(),
    "fsdp2-per-rank-mean": make_fsdp(global_count=False),
    "uneven-steps": _uneven,
}

# what verify names each loop on its task (a DistributedSampler's padding adds `duplicate-items` where
# len % R != 0)
BUGS = {
    "correct": set(),
    "per-rank-mean": {"per-rank-mean"},
    "divided-by-ranks": {"misscaled"},
    "never-synced": {"ranks-diverged"},
    "sync-every-micro-batch": {"sync-every-micro-batch"},
    "drop-last": {"tail-dropped"},
    "unsharded": {"unsharded-data"},
    "fsdp2": {"sharded-model"},
    "fsdp2-per-rank-mean": {"per-rank-mean", "sharded-model"},
    "uneven-steps": {"uneven-steps"},
}

__all__ = ["BUGS", "LOOPS", "make", "shard", "windows"]
