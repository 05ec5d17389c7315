"""The report's parameters: their defaults (shared with the notebook's parameters cell and the
Makefile), how a value from papermill or ``make report`` is read, and every check made before work.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from accumlib import TASKS, Task, get_task
from accumlib.batches import expected_steps
from accumlib.checks import check_choice, check_int, check_ints, resolve_device
from accumlib.data import digits_subset
from accumlib.models import SmallCNN
from accumlib.tasks import classification_losses

PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
NORMS = ("batch", "group", "none")
TASK_NAMES = ("cnn", *sorted(TASKS))
# plain SGD, as accumlib.harness.trace_loop and verify use: every gradient error shows 1:1 in the update
LR = 0.05
# digit images for the norm-layer section: 128 / (3 x 8) windows, enough to see BatchNorm drift
N_IMAGES = 128
# Three steps at every k: a per-step figure then draws a line, not a dot, and the largest k
# still has a full window before its tail.
MIN_STEPS = 3
# The defaults of run(), of the notebook's parameters cell and of the Makefile (tests keep them equal).
# Micro-batches of 3 give every built-in task at least 3 steps at k = 8: mlp-digits' 110 items make
# 37 micro-batches (the last holds 2, so the tail window is ragged), lm-tokens' 64 sequences make 22.
DEFAULTS: dict[str, Any] = dict(
    task="mlp-digits",
    accum_steps=(1, 2, 4, 8),
    batch_size=3,
    norm="group",
    precision="float32",
    device="auto",
    seed=0,
    results_path="",
)


def parse_accum(accum_steps: Any) -> tuple[int, ...]:
    """``[1, 2, 4]``, ``"1 2 4"``, ``"1,2,4"`` or ``4`` -> sorted distinct k, each an integer >= 1.

    >>> parse_accum("1 2 4 8"), parse_accum([4, 2]), parse_accum(8)
    ((1, 2, 4, 8), (2, 4), (8,))
    """
    rule = "accum_steps must be integers >= 1, as a list, one integer or a string like '1 2 4 8'"
    if isinstance(accum_steps, str):
        try:
            items: Any = [int(k) for k in accum_steps.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{rule} (got {accum_steps!r})") from None
    elif isinstance(accum_steps, int) and not isinstance(accum_steps, bool):
        items = [accum_steps]  # papermill turns -p accum_steps 4 into an int
    else:
        items = accum_steps
    # check_ints refuses an empty list, a bool, a float and k < 1; the message here shows the value as given
    try:
        return check_ints("accum_steps", items, low=1)
    except ValueError:
        raise ValueError(f"{rule} (got {accum_steps!r})") from None


def cnn_task(norm: str, seed: int = 0) -> Task:
    """SmallCNN with ``norm`` on ``N_IMAGES`` digit images (the built-in CNN tasks, any norm)."""
    check_choice("norm", norm, NORMS)

    def make_model(s: int = 0) -> torch.nn.Module:
        torch.manual_seed(s)
        return SmallCNN(norm=norm)

    def images() -> Any:
        x, y = digits_subset(N_IMAGES, seed)[:]
        return torch.utils.data.TensorDataset(x.view(-1, 1, 8, 8), y)

    return Task(
        f"cnn-{norm}",
        f"SmallCNN(norm={norm!r}) on {N_IMAGES} digit images",
        make_model,
        images,
        classification_losses,
        batch_size=4,
        accum_steps=4,
        tags=("batchnorm",) if norm == "batch" else (),
    )


def resolve_task(task: str, norm: str, seed: int = 0) -> Task:
    """A built-in task by name, or ``"cnn"``: the CNN with the report's ``norm``."""
    check_choice("task", task, TASK_NAMES)
    return cnn_task(norm, seed) if task == "cnn" else get_task(task)


@dataclass(frozen=True)
class Parameters:
    """The report's parameters, checked: what ``run`` works with."""

    task: Task
    ks: tuple[int, ...]
    batch_size: int
    norm: str
    precision: str
    device: torch.device
    seed: int
    results_path: str


def _check_steps(
    data: str, n_examples: int, n_batches: int, ks: tuple[int, ...], accum_steps: Any, batch_size: int
) -> None:
    """Every k must give ``MIN_STEPS`` optimizer steps: ceil(n_batches / k) >= 3, i.e. n_batches > 2k."""
    short = [k for k in ks if expected_steps(n_batches, k) < MIN_STEPS]
    if not short:
        return
    k_max = (n_batches - 1) // (MIN_STEPS - 1)  # the largest k with ceil(n_batches / k) >= MIN_STEPS
    b_max = max(
        (b for b in range(1, batch_size) if expected_steps(math.ceil(n_examples / b), max(ks)) >= MIN_STEPS),
        default=0,
    )
    fixes = ([f"k <= {k_max}"] if k_max >= 1 else []) + ([f"batch_size <= {b_max}"] if b_max else [])
    raise ValueError(
        f"accum_steps and batch_size must give every k at least {MIN_STEPS} optimizer steps, "
        f"ceil(micro-batches / k) >= {MIN_STEPS}: {data} has {n_examples} examples, which "
        f"batch_size={batch_size} splits into {n_batches} micro-batches, "
        f"so k = {', '.join(map(str, short))} {'give' if len(short) > 1 else 'gives'} "
        f"{', '.join(str(expected_steps(n_batches, k)) for k in short)} steps "
        f"(got accum_steps={accum_steps!r}, batch_size={batch_size!r})"
        + (f"; use {', or '.join(fixes)}" if fixes else "")
    )


def check_parameters(
    task: str = DEFAULTS["task"],
    accum_steps: Any = DEFAULTS["accum_steps"],
    batch_size: int = DEFAULTS["batch_size"],
    norm: str = DEFAULTS["norm"],
    precision: str = DEFAULTS["precision"],
    device: Any = DEFAULTS["device"],
    seed: int = DEFAULTS["seed"],
    results_path: str = DEFAULTS["results_path"],
) -> Parameters:
    """Every parameter by name, rule and value, before any training: names and types, then the step rule."""
    check_choice("task", task, TASK_NAMES)
    ks = parse_accum(accum_steps)
    batch_size = check_int("batch_size", batch_size, low=1)
    check_choice("norm", norm, NORMS)
    check_choice("precision", precision, tuple(PRECISIONS))
    dev = resolve_device(device)
    seed = check_int("seed", seed, low=0)
    if not isinstance(results_path, (str, os.PathLike)):
        raise ValueError(
            f"results_path must be a path ending in .json, or '' to write no file (got {results_path!r})"
        )
    path = os.fspath(results_path)
    if path and not path.endswith(".json"):
        raise ValueError(f"results_path must end in .json, or be '' to write no file (got {path!r})")
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(
            f"results_path must be in an existing folder (got {path!r}; "
            f"{os.path.dirname(os.path.abspath(path))!r} does not exist)"
        )
    t = resolve_task(task, norm, seed)
    cnn = cnn_task(norm, seed)
    for data, each in ((f"task {t.name!r}", t), (f"the norm section's {cnn.name!r}", cnn)):
        loader = each.loader(batch_size)
        _check_steps(data, len(loader.dataset), len(loader), ks, accum_steps, batch_size)  # type: ignore[arg-type]
    return Parameters(t, ks, batch_size, norm, precision, dev, seed, path)
