"""Gradient accumulation under DistributedDataParallel, checked against the large batch.

``ddp_accumulate`` is the reference loop (no_sync over all but the last micro-batch of a
window, item counts all-reduced before normalizing) and ``shard_loader`` a rank's loader for it;
``launch`` runs an importable function on N local processes (what ``accumlib verify --world-size``
starts its ranks with), ``init_from_env`` joins torchrun's process group.

Importing this module starts no process and initializes no process group.
"""

from .launch import check_port, default_backend, free_port, init_from_env, launch
from .loop import ddp_accumulate, shard_loader

__all__ = [
    "check_port",
    "default_backend",
    "ddp_accumulate",
    "free_port",
    "init_from_env",
    "launch",
    "shard_loader",
]
