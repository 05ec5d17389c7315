"""Lesson 10, part: activation checkpointing against accumulation, memory and time measured on this machine.

Both cut the activation memory of one large batch. Accumulation runs k smaller forwards, each
saving a k-th of the activations; checkpointing keeps only each block's input and recomputes the
block during backward (one extra forward). Both give the large batch's gradient (float32 rounding
apart); they combine. Memory is what autograd saves for backward (``accumlib_course.memory.activation_bytes``,
exact on any device); time is the best of a few forward+backward passes over the same items on the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from accumlib.checks import check_int
from accumlib.compare import compare
from accumlib.text import Table
from accumlib_course.memory import activation_bytes


class DeepMLP(nn.Module):
    """An input layer, then ``depth`` residual blocks (Linear to 4 x width, GELU, Linear back), as in a
    transformer's MLP.

    ``checkpointed`` recomputes every block in backward and keeps only its input. The input layer is
    never checkpointed: the images need no gradient, and the reentrant checkpoint needs an input that does.

    >>> DeepMLP(depth=3, width=16)(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """

    def __init__(self, depth: int = 4, width: int = 128, *, checkpointed: bool = False):
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 10)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.flatten(1))
        for block in self.blocks:
            # reentrant: the block's input is saved through autograd's saved-tensor hooks, so it is counted
            h = h + (
                checkpoint(block, h, use_reentrant=True) if self.checkpointed and self.training else block(h)
            )
        return self.head(h)


def _losses(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


@dataclass(frozen=True)
class Way:
    """One way to train on the batch: its name, micro-batches, saved activation bytes, seconds, gradient
    error.
    """

    name: str
    accum_steps: int
    checkpointed: bool
    activation_bytes: int
    seconds: float
    rel_error: float  # against the plain large batch's gradient


@dataclass(frozen=True)
class MemoryResult:
    batch_size: int
    depth: int
    width: int
    ways: tuple[Way, ...]

    def by_name(self, name: str) -> Way:
        return next(w for w in self.ways if w.name == name)

    def rows(self) -> list[tuple[Any, ...]]:
        base = self.ways[0]
        return [
            (
                w.name,
                f"{w.activation_bytes / 2**20:.2f}",
                f"{w.activation_bytes / base.activation_bytes:.2f}",
                f"{1e3 * w.seconds:.1f}",
                f"{w.seconds / base.seconds:.2f}",
                f"{w.rel_error:.0e}",
            )
            for w in self.ways
        ]

    def table(self) -> Table:
        return Table(
            (
                "way",
                "activations saved (MiB)",
                "x large batch",
                "ms per batch (CPU)",
                "x large batch",
                "gradient rel. error",
            ),
            self.rows(),
            caption=f"{self.depth} blocks of width {self.width}, {self.batch_size} digits per optimizer step",
        )


def _grad_and_time(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, repeats: int
) -> tuple[list[torch.Tensor], float]:
    """The window's gradient (every item weighing 1/B) and the best time of ``repeats`` forward+backward
    passes.
    """
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        for xs, ys in zip(x.chunk(k), y.chunk(k)):
            (_losses(model, (xs, ys)).sum() / len(x)).backward()
        best = min(best, time.perf_counter() - start)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}, best


def checkpointing(
    batch_size: int = 256,
    accum_steps: int = 4,
    *,
    depth: int = 4,
    width: int = 128,
    repeats: int = 3,
    seed: int = 0,
) -> MemoryResult:
    """The large batch, k micro-batches, checkpointing, and both: memory, time and the gradient of each.

    >>> checkpointing(batch_size=10, accum_steps=4)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must divide batch_size=10 into equal micro-batches (got 4)
    """
    from accumlib.data import digits_subset

    batch_size = check_int("batch_size", batch_size, low=1, high=1024)
    accum_steps = check_int(
        "accum_steps", accum_steps, low=1, high=batch_size, why="one item per micro-batch at least"
    )
    if batch_size % accum_steps:
        raise ValueError(
            f"accum_steps must divide batch_size={batch_size} into equal micro-batches (got {accum_steps})"
        )
    depth = check_int("depth", depth, low=1, high=64)
    width = check_int("width", width, low=1, high=4096)
    repeats = check_int("repeats", repeats, low=1, high=20)
    data = digits_subset(batch_size, seed)
    x = torch.stack([data[i][0] for i in range(batch_size)])
    y = torch.tensor([int(data[i][1]) for i in range(batch_size)])
    torch.manual_seed(seed)
    plain = DeepMLP(depth, width)
    saved = DeepMLP(depth, width, checkpointed=True)
    saved.load_state_dict(plain.state_dict())
    k = accum_steps
    ways = []
    reference = None
    for name, model, m in (
        ("large batch", plain, 1),
        (f"{k} micro-batches", plain, k),
        ("checkpointing", saved, 1),
        (f"checkpointing + {k} micro-batches", saved, k),
    ):
        mem = activation_bytes(model, (x[: batch_size // m], y[: batch_size // m]), _losses)
        grads, seconds = _grad_and_time(model, x, y, m, repeats)
        reference = reference or grads
        ways.append(Way(name, m, model.checkpointed, mem, seconds, compare(grads, reference).rel_error))
    return MemoryResult(batch_size, depth, width, tuple(ways))


__all__ = ["DeepMLP", "MemoryResult", "Way", "checkpointing"]
