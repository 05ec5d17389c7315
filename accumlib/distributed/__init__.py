"""Gradient accumulation under DistributedDataParallel, checked against the large batch.

``ddp_accumulate`` is the reference loop (no_sync over all but the last micro-batch of a
window, item counts all-reduced before normalizing); ``launch`` runs an importable
function on N local processes; ``count_allreduce`` measures what DDP sends;
``ddp_experiment`` runs the comparisons ``accumlib ddp`` and notebook 8 show.

Importing this module starts no process and initializes no process group.
"""

from .comm import CommCounter, count_allreduce
from .experiment import (
    COMM_VARIANTS,
    FLOAT32_RTOL,
    VARIANTS,
    DDPReport,
    RunResult,
    RunSpec,
    ddp_experiment,
    run_specs,
    shard_loader,
    worker,
)
from .launch import check_port, default_backend, free_port, init_from_env, launch
from .loop import ddp_accumulate

__all__ = [
    "COMM_VARIANTS",
    "FLOAT32_RTOL",
    "VARIANTS",
    "CommCounter",
    "DDPReport",
    "RunResult",
    "RunSpec",
    "check_port",
    "count_allreduce",
    "default_backend",
    "ddp_accumulate",
    "ddp_experiment",
    "free_port",
    "init_from_env",
    "launch",
    "run_specs",
    "shard_loader",
    "worker",
]
