"""The in-place engine across ranks: one verdict for a data-parallel job under torchrun.

Each rank's hooks sum its own micro-batches' gradients, O_r (``inplace.py``), over its own N_r items.
The job's window is every rank's: g* = (sum_r O_r) / (sum_r N_r). At a step, which every rank of a
data-parallel job takes together, one all-reduce turns O_r into sum_r O_r in place; G, what the
optimizer holds after DDP's own mean over ranks, is compared with it exactly as on one process.
Where the ranks' counts differ, a second all-reduce gives H = (1/R) sum_r O_r / N_r, what a job that
divides by each rank's own count steps (``per-rank-mean``); whether the ranks stepped alike
(``ranks-diverged``) is read from a few sums of each rank's gradient and parameters, gathered, and only
where they differ are rank 0's broadcast and the spread measured. Collectives go by buckets of at most
``BUCKET_BYTES`` (one all-reduce for a small model's whole step, not one per parameter); the extra memory
is a bucket's flat copies, and H (one parameter-sized buffer) for as long as its comparison lasts.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from .measure import against_sums, fit
from .ranks import checksums, one_block
from .step_numbers import StepNumbers
from .window_oracle import gram


def world() -> int:
    """The process group's size (1 outside one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def sharded(params: list[torch.Tensor]) -> bool:
    """FSDP2's parameters are DTensors, each rank holding a shard: not judged in place."""
    return any(type(p).__name__ == "DTensor" for p in params)


def measure_job(numbers: StepNumbers, ps: list[torch.Tensor], sums: list[torch.Tensor | None]) -> None:
    """Fill ``numbers`` with the job's figures; every rank calls it at the same step, in the same order."""
    r = world()
    device = ps[0].device
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in ps]
    params = [p.detach() for p in ps]
    # with the counts, in the same gather: a few sums of G and the parameters, equal on every rank that
    # holds the same bits (``ranks.checksums``); only where they differ is rank 0's broadcast (``_spread``)
    same = [float(x) for x in checksums([*grads, *params]) or ()]
    counts = torch.tensor(
        [float(numbers.items), float(numbers.loss_sum), float(numbers.leak), *same],
        dtype=torch.float64,
        device=device,
    )
    every = [torch.zeros_like(counts) for _ in range(r)]
    dist.all_gather(every, counts)
    numbers.rank_items = [int(c[0]) for c in every]
    numbers.items = sum(numbers.rank_items)
    numbers.loss_sum = float(sum(c[1] for c in every))
    numbers.leak = any(bool(c[2]) for c in every)
    numbers.ranks, numbers.weights = r, []
    own = [torch.zeros_like(p) if s is None else s for p, s in zip(ps, sums)]
    mine = numbers.rank_items[dist.get_rank()]
    if len(set(numbers.rank_items)) > 1:  # H = (1/R) sum_r O_r / N_r, on a copy (O_r is still needed)
        h = [o / max(mine, 1) / r for o in own]
        all_reduce(h)
        g = gram([grads, h])
        if float(g[1, 1]) > 0:
            _, numbers.per_rank_factor, numbers.per_rank_resid = fit(
                float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
            )
        del h
    all_reduce(own)  # in place: O is rebuilt from zero when the next window opens
    if numbers.items > 0:
        against_sums(numbers, grads, own)
    if any(not torch.equal(e[3:], every[0][3:]) for e in every):  # some rank differs (or a nan): measured
        numbers.diverged, numbers.params_diverged = _spread(grads, params)
    else:
        numbers.diverged = numbers.params_diverged = 0.0


# One collective per bucket of tensors of one dtype, at most this many bytes: a tiny model's step is one
# all-reduce, not one per parameter (gloo: about a millisecond each), and the flat copy a bucket needs
# stays small beside the parameters.
BUCKET_BYTES = 2**25


def buckets(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by dtype and device, each group cut at ``BUCKET_BYTES``.

    >>> buckets([torch.zeros(3), torch.zeros(2, dtype=torch.float64), torch.zeros(4)])
    [[0, 2], [1]]
    """
    groups: dict[tuple[Any, Any], list[list[int]]] = {}
    for i, t in enumerate(tensors):
        runs = groups.setdefault((t.dtype, t.device), [[]])
        size = sum(tensors[j].numel() * tensors[j].element_size() for j in runs[-1])
        if runs[-1] and size + t.numel() * t.element_size() > BUCKET_BYTES:
            runs.append([])
        runs[-1].append(i)
    return [run for runs in groups.values() for run in runs]


def all_reduce(tensors: list[torch.Tensor]) -> None:
    """Sum every tensor over the ranks, in place: the in-place engine's O in one all-reduce where it lies
    (one block, in the order every rank lists its parameters: ``ranks.one_block``), else one all-reduce
    per bucket of copies."""
    own = one_block(list(tensors))
    if own is not None and own[1] == tuple(range(len(tensors))):  # laid out as listed: alike on every rank
        dist.all_reduce(own[0])
        return
    for run in buckets(tensors):
        flat = torch.cat([tensors[i].reshape(-1) for i in run])
        dist.all_reduce(flat)
        for i, part in zip(run, flat.split([tensors[i].numel() for i in run])):  # type: ignore[no-untyped-call]  # Tensor.split is unannotated in torch
            tensors[i].copy_(part.view_as(tensors[i]))


def _spread(*groups: list[torch.Tensor]) -> list[float]:
    """For each group of tensors, max over ranks of ||t_r - t_0|| / ||t_0|| over all of them: rank 0's
    tensors broadcast by bucket (the groups together), the ranks' squared distances in one all-reduce."""
    tensors = [t for g in groups for t in g]
    owner = [k for k, g in enumerate(groups) for _ in g]
    device = tensors[0].device  # NCCL reduces device tensors only; no sync until the end
    diff = torch.zeros(len(groups), dtype=torch.float64, device=device)
    base = torch.zeros(len(groups), dtype=torch.float64, device=device)
    for run in buckets(tensors):
        mine = torch.cat([tensors[i].detach().reshape(-1) for i in run])
        zero = mine.clone()
        dist.broadcast(zero, 0)
        sizes, at = [tensors[i].numel() for i in run], torch.tensor([owner[i] for i in run], device=device)
        d = torch.stack([x.sum() for x in (mine.double() - zero.double()).square().split(sizes)])  # type: ignore[no-untyped-call]  # Tensor.split is unannotated in torch
        b = torch.stack([x.sum() for x in zero.double().square().split(sizes)])  # type: ignore[no-untyped-call]  # Tensor.split is unannotated in torch
        diff.index_add_(0, at, d)
        base.index_add_(0, at, b)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return [math.sqrt(float(w)) / max(math.sqrt(float(b)), 1e-300) for w, b in zip(diff.cpu(), base.cpu())]


__all__ = ["BUCKET_BYTES", "all_reduce", "buckets", "measure_job", "sharded", "world"]
