"""Exact accumulation under DistributedDataParallel: no_sync inside a window, global item counts.

R ranks each hold a window of micro-batches b_{r,1}..b_{r,m} (m <= k; the last window
may be partial, as in ``ragged``). With n_r items on rank r and N = sum_r n_r:

    grad (1/N) sum_{r,i} l_{r,i}  ==  (1/R) sum_r  sum_j grad( sum_{i in b_{r,j}} l_i * R / N )

The right side is what this loop computes: each rank backpropagates its micro-batches
scaled by R / N, and DDP's all-reduce AVERAGES over the R ranks. N is one all-reduce of
an integer per window, done before the first backward.

Communication: the forward AND backward of every micro-batch but the last run inside
``model.no_sync()``, so gradients accumulate locally and DDP all-reduces once per window.
DDP arms its all-reduce during the forward, so ``no_sync`` around the backward alone
still all-reduces every micro-batch (``no_sync="backward"`` reproduces that).

The mistake ``global_counts=False`` divides by the rank's own n_r: DDP then averages
per-rank means, (1/R) sum_r (1/n_r) sum_i grad l_i, which equals the large-batch
gradient only when every rank holds the same number of items.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

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
    windows,
)
from ..batches import count_items as _rows
from ..checks import check_choice, check_device, check_int
from ..tasks import Task

NO_SYNC = ("forward+backward", "backward", "never")


def _no_sync(model: DDP, enabled: bool) -> contextlib.AbstractContextManager:
    return model.no_sync() if enabled else contextlib.nullcontext()


def _same_length_everywhere(loader, device: torch.device) -> None:
    """Every rank must take the same number of steps, or a collective waits forever."""
    if not hasattr(loader, "__len__"):
        return
    n = torch.tensor([len(loader), -len(loader)], device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    if int(n[0]) != -int(n[1]):
        raise ValueError(
            "loader must yield the same number of micro-batches on every rank "
            f"(got between {-int(n[1])} and {int(n[0])})"
        )


def ddp_accumulate(
    model: DDP,
    optimizer: torch.optim.Optimizer,
    loader: Iterable[Batch],
    item_losses: ItemLosses,
    *,
    accum_steps: int,
    device: Device = None,
    progress: Progress = False,
    count_items: Callable[[Batch], int] = _rows,
    no_sync: str = "forward+backward",
    global_counts: bool = True,
) -> list[float]:
    """Run one epoch on this rank; return the true mean item loss (over all ranks) of each step's window.

    Every rank calls it with its own shard (e.g. ``shard_loader``; all shards must yield as many
    micro-batches). ``no_sync`` and ``global_counts`` exist to reproduce the mistakes; keep the defaults.

    >>> rank, world = init_from_env()                                # under torchrun  # doctest: +SKIP
    >>> model = DDP(task.make_model(0)); opt = torch.optim.SGD(model.parameters(), lr=0.05)  # doctest: +SKIP
    >>> ddp_accumulate(model, opt, shard_loader(task, rank, world), task.item_losses,
    ...                accum_steps=4, count_items=task.count_items)  # doctest: +SKIP
    [3.83..., 3.62...]
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    if not isinstance(model, DDP):
        raise TypeError(f"model must be wrapped in DistributedDataParallel (got {type(model).__name__})")
    if not dist.is_initialized():
        raise ValueError(
            "the default process group must be initialized before the loop "
            "(got none; use launch() or torchrun)"
        )
    check_choice("no_sync", no_sync, NO_SYNC)
    world = dist.get_world_size()
    where = next(model.parameters()).device  # collectives run where the parameters live (NCCL: the GPU)
    device = check_device(device, model)  # None: the model's own device, as in every loop
    _same_length_everywhere(loader, where)
    bar = progress_bar(progress, loader, "ddp")
    sums, counts = [], []
    for window in windows(loader, accum_steps):
        n_local = window_items(window, count_items)
        n = torch.tensor(n_local, device=where)
        dist.all_reduce(n)  # N: every rank's items in this window, known before any backward
        # DDP divides the summed gradient by R, so R / N makes each item weigh 1 / N;
        # the mistake divides by this rank's items only.
        scale = world / int(n) if global_counts else 1.0 / n_local
        total = torch.zeros((), dtype=torch.float64)
        for j, batch in enumerate(window):
            defer = j < len(window) - 1  # all but the last micro-batch accumulate locally
            with _no_sync(model, defer and no_sync == "forward+backward"):
                losses = checked_losses(item_losses, model, to_device(batch, device))
                check_count(count_items(batch), losses)
                # too late: the forward already armed the all-reduce
                with _no_sync(model, defer and no_sync == "backward"):
                    (losses.sum() * scale).backward()
            total = total + losses.detach().sum().double().cpu()
            bar.update()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sums.append(total)
        counts.append(int(n))
        bar.set_postfix(loss=float(total / n_local))
    bar.close()
    loss_sums = torch.stack(sums).to(where)
    dist.all_reduce(loss_sums)  # one all-reduce per epoch turns per-rank sums into each window's global mean
    return [float(s) / c for s, c in zip(loss_sums.cpu(), counts)]


def shard_loader(
    task: Task, rank: int, world_size: int, batch_size: int | None = None, dataset=None
) -> DataLoader:
    """This rank's loader: DistributedSampler's interleaved shard (padded so every rank gets as many
    items)."""
    dataset = task.make_dataset() if dataset is None else dataset
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)
    return DataLoader(
        dataset, batch_size=batch_size or task.batch_size, sampler=sampler, collate_fn=task.collate_fn
    )
