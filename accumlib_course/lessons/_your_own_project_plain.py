"""Lesson 10, part: the loops to copy, each graded by ``accumlib.verify`` on a built-in task.

The loops live in ``accumlib_course/examples/plain/``, one file per common case, each importing torch alone
so that it can be pasted into a project: fixed-size items, a token-counted causal LM, AMP with a
``GradScaler`` and clipping, DDP with ``no_sync`` and a global count. ``grade_plain`` runs one of the
first three under verify, as a learner would run their own loop; the DDP loop needs a process group,
so ``tests/test_plain_loops.py`` grades it on 2 gloo ranks (``verify(..., ranks="all")``).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

from accumlib import Report, get_task, verify
from accumlib.checks import check_choice, resolve_device
from accumlib_course.examples.plain import amp, ddp, fixed_size, tokens


@dataclass(frozen=True)
class PlainLoop:
    """One copyable loop: what it is for, the task it is graded on (``None``: in a test), its arguments."""

    module: types.ModuleType
    case: str
    task: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)


PLAIN = {
    "fixed_size": PlainLoop(fixed_size, "fixed-size items (classification)", "mlp-digits"),
    "tokens": PlainLoop(tokens, "token-counted causal LM", "lm-tokens"),
    # max_norm 0.1: the digits MLP's window gradients have norms ~0.3-1, so the clip really acts
    "amp": PlainLoop(amp, "AMP: autocast, GradScaler, clipping", "mlp-digits", {"max_norm": 0.1}),
    "ddp": PlainLoop(ddp, "DDP: no_sync and a global token count", None),  # tests/test_plain_loops.py
}


def grade_plain(module: types.ModuleType, *, seed: int = 0, device: Any = "auto") -> Report:
    """Run a plain loop for one epoch under ``accumlib.verify`` on its task; return verify's report.

    >>> grade_plain(fixed_size).ok  # the digits MLP, 110 samples, 8 x 4: three full windows and a tail
    True
    """
    graded = sorted(name for name, p in PLAIN.items() if p.task is not None)
    name = getattr(module, "__name__", repr(module)).rsplit(".", 1)[-1]
    why = "the DDP loop needs a process group: tests/test_plain_loops.py grades it on 2 gloo ranks"
    name = check_choice("module", name, graded, why if name == "ddp" else "")
    plain = PLAIN[name]
    task = get_task(plain.task)
    train = functools.partial(plain.module.train, accum_steps=task.accum_steps, **plain.kwargs)
    return verify(
        train,
        model=task.make_model(seed).to(resolve_device(device)),
        dataset=task.make_dataset(),
        item_losses=task.item_losses,
        accum_steps=task.accum_steps,
        batch_size=task.batch_size,
        collate_fn=task.collate_fn,
    )
