"""Count what DDP actually sends: a communication hook that tallies all-reduce calls and bytes.

DDP packs gradients into buckets and all-reduces each bucket once per synchronized
backward. The hook sees every bucket on its way out, so the counts are measured, not
assumed: with ``no_sync`` over the first k-1 micro-batches a window costs one round of
buckets; without it (or with ``no_sync`` around the backward only) it costs k rounds.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


@dataclass
class CommCounter:
    """All-reduce calls (one per bucket) and their payload bytes since the last ``take()``."""

    calls: int = 0
    bytes: int = 0
    process_group: dist.ProcessGroup | None = None

    def take(self) -> tuple[int, int]:
        """Return ``(calls, bytes)`` so far and start counting from zero."""
        out = (self.calls, self.bytes)
        self.calls = self.bytes = 0
        return out


def _counting_allreduce(state: CommCounter, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    state.calls += 1
    state.bytes += buf.numel() * buf.element_size()  # the payload this rank hands to all-reduce
    return allreduce_hook(state.process_group, bucket)  # DDP's own behaviour: sum, then divide by world size


def count_allreduce(model: torch.nn.parallel.DistributedDataParallel) -> CommCounter:
    """Register the counting hook on ``model`` (before its first backward) and return its counter.

    >>> counter = count_allreduce(ddp_model)  # doctest: +SKIP
    >>> ...; counter.take()                   # doctest: +SKIP
    (1, 35880)
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"model must be a DistributedDataParallel module (got {type(model).__name__})")
    counter = CommCounter()
    model.register_comm_hook(counter, _counting_allreduce)
    return counter
