"""accumlib: gradient accumulation in PyTorch, checked against the true large-batch gradient.

The public surface is small: the reference loops and their registry, the oracle, the comparison,
the verifier with its table of finding codes, the built-in tasks and the one device rule.

>>> import accumlib, torch
>>> task = accumlib.get_task("mlp-digits")
>>> def train(model, optimizer, loader):  # the textbook loop: each micro-batch mean divided by k
...     for i, (x, y) in enumerate(loader):
...         (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
...         if (i + 1) % 4 == 0:
...             optimizer.step(); optimizer.zero_grad()
>>> report = accumlib.verify(train, model=task.make_model(0), dataset=task.make_dataset(),
...                          item_losses=task.item_losses, accum_steps=4, batch_size=12)
>>> report.ok, sorted(report.codes)
(False, ['tail-dropped'])

Everything else lives in named submodules, imported on first use: ``accumlib.data`` and
``accumlib.models`` (offline data, tiny models), ``accumlib.harness`` and ``accumlib.reference``
(the reference table), ``accumlib.distributed`` (DDP), ``accumlib.hf`` and ``accumlib.lightning``
(framework runs under verify), and the building blocks code beside the core reuses:
``accumlib.checks`` (argument checks), ``accumlib.text`` (tables), ``accumlib.batches`` (windows,
devices, item losses) and ``accumlib.observe``. Modules starting with ``_`` are private.

The course (lessons, the gallery of user-style loops, the report; frameworks' own loops, the survey of
Transformers, notebook 8's DDP experiment, activation memory) is ``accumlib_course``, beside the core in
the repository: it imports only the core's public modules, and the core never imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._verify import CODES, Finding, Report, VerifyError, verify, watch
from .checks import resolve_device
from .compare import Comparison, compare
from .loops import LOOPS, amp, grad_divided, large_batch, naive, normalized, ragged
from .oracle import grads_of, true_gradient
from .tasks import TASKS, Task, get_task

__version__ = "0.1.0"

__all__ = [
    "LOOPS",
    # the reference loops, each by name (tests/test_loops.py: every loop of accumlib.loops.ALL is here)
    "naive",
    "normalized",
    "ragged",
    "amp",
    "large_batch",
    "grad_divided",
    "true_gradient",
    "grads_of",
    "compare",
    "Comparison",
    "verify",
    "watch",
    "Report",
    "Finding",
    "CODES",
    "VerifyError",
    "Task",
    "get_task",
    "TASKS",
    "resolve_device",
]

# Submodules served on first attribute access, so that ``import accumlib`` stays light (no
# torch.distributed, no tqdm, no transformers) and ``accumlib.data.digits`` still works.
_SUBMODULES = frozenset(
    {
        "cli",
        "compare",
        "data",
        "batches",
        "checks",
        "distributed",
        "harness",
        "hf",
        "lightning",
        "loops",
        "models",
        "observe",
        "oracle",
        "reference",
        "text",
        "tasks",
        "tolerances",
    }
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(
        f"module 'accumlib' has no attribute {name!r}; the public names are accumlib.__all__, "
        f"the rest lives in submodules ({', '.join(sorted(_SUBMODULES))})"
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
