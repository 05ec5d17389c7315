"""The in-place engine across ranks: one verdict for a data-parallel job under torchrun.

Each rank's hooks sum its own micro-batches' gradients, O_r (``inplace.py``), over its own N_r items.
The job's window is every rank's: g* = (sum_r O_r) / (sum_r N_r). At a step, which every rank of a
data-parallel job takes together, one all-reduce turns O_r into sum_r O_r in place; G, what the
optimizer holds after DDP's own mean over ranks, is compared with it exactly as on one process.
Where the ranks' counts differ, a second all-reduce gives H = (1/R) sum_r O_r / N_r, what a job that
divides by each rank's own count steps (``per-rank-mean``); rank 0's gradient and parameters,
broadcast, say whether the ranks stepped alike (``ranks-diverged``). The extra memory is one
parameter-sized buffer, for as long as a comparison lasts.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .measure import against_sums, fit
from .numbers import StepNumbers
from .oracle import gram


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
    counts = torch.tensor([float(numbers.items), float(numbers.loss_sum), float(numbers.leak)], device=device)
    every = [torch.zeros_like(counts) for _ in range(r)]
    dist.all_gather(every, counts)
    numbers.rank_items = [int(c[0]) for c in every]
    numbers.items = sum(numbers.rank_items)
    numbers.loss_sum = float(sum(c[1] for c in every))
    numbers.leak = any(bool(c[2]) for c in every)
    numbers.ranks, numbers.weights = r, []
    own = [torch.zeros_like(p) if s is None else s for p, s in zip(ps, sums)]
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in ps]
    mine = numbers.rank_items[dist.get_rank()]
    if len(set(numbers.rank_items)) > 1:  # H = (1/R) sum_r O_r / N_r, on a copy (O_r is still needed)
        h = [o / max(mine, 1) / r for o in own]
        for t in h:
            dist.all_reduce(t)
        g = gram([grads, h])
        if float(g[1, 1]) > 0:
            _, numbers.per_rank_scale, numbers.per_rank_resid = fit(
                float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
            )
        del h
    for o in own:
        dist.all_reduce(o)  # in place: O is rebuilt from zero when the next window opens
    if numbers.items > 0:
        against_sums(numbers, grads, own)
    numbers.diverged = _spread(grads)
    numbers.params_diverged = _spread([p.detach() for p in ps])


def _spread(tensors: list[torch.Tensor]) -> float:
    """max over ranks of ||t_r - t_0|| / ||t_0||, one tensor at a time (rank 0's broadcast)."""
    diff, base = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for t in tensors:
        zero = t.detach().clone()
        dist.broadcast(zero, 0)
        diff += (t.detach().double() - zero.double()).square().sum().cpu()
        base += zero.double().square().sum().cpu()
    worst = diff.to(tensors[0].device)  # NCCL reduces device tensors only
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return math.sqrt(float(worst)) / max(math.sqrt(float(base)), 1e-300)


__all__ = ["measure_job", "sharded", "world"]
