"""Notebook 8's DDP experiment: the reference loop ``accumlib.distributed.ddp_accumulate`` against
the large batch and against the three public mistakes, with what DDP sends counted.

``ddp_experiment`` runs the comparisons ``python -m accumlib_course.distributed`` (also under torchrun)
and notebook 8 show; ``count_allreduce`` measures what DDP sends (a communication hook).

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
    worker,
)

__all__ = [
    "COMM_VARIANTS",
    "FLOAT32_RTOL",
    "VARIANTS",
    "CommCounter",
    "DDPReport",
    "RunResult",
    "RunSpec",
    "count_allreduce",
    "ddp_experiment",
    "run_specs",
    "worker",
]
