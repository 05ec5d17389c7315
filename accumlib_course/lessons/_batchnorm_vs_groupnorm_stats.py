"""Lesson 5's BatchNorm statistics: running buffers after accumulation against the large batch, the
momentum that makes them agree, and the training budget behind GroupNorm's lower accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from accumlib import get_task, ragged, resolve_device
from accumlib import large_batch as large_batch_loop  # the loop; ``large_batch`` below is a batch size
from accumlib.checks import check_choice, check_float, check_int
from accumlib.compare import compare
from accumlib.data import digits
from accumlib.text import Table

NORMS = ("batch", "group")
MOMENTUM = 0.9  # SGD momentum for the training curves: a realistic optimizer, still deterministic


def task_for(norm: str) -> Any:
    """The built-in task: ``cnn-batchnorm`` or ``cnn-groupnorm`` (the same CNN and 128 images)."""
    check_choice("norm", norm, NORMS)
    return get_task(f"cnn-{norm}norm")


def check_split(accum_steps: Any, large_batch: Any) -> tuple[int, int]:
    large_batch = check_int("large_batch", large_batch, low=1)
    k = check_int(
        "accum_steps", accum_steps, low=1, high=large_batch, why=f"it splits a large batch of {large_batch}"
    )
    if large_batch % k:
        raise ValueError(
            f"accum_steps must divide large_batch={large_batch}, so every micro-batch holds "
            f"{large_batch}/accum_steps images (got {k})"
        )
    return k, large_batch


@dataclass
class RunningStats:
    """BatchNorm buffers after one epoch: accumulated (k micro-batches) vs the large batch, same weights."""

    k: int
    micro_batch: int
    rel_diff: dict[str, float]
    batches_tracked: dict[str, int]
    eval_loss: dict[str, float]
    momentum: float


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return compare([a], [b]).rel_error  # the one relative error, in float64


def _frozen_epochs(
    loop: Any, k: int, large_batch: int, bn_momentum: float, epochs: int, device: torch.device
) -> torch.nn.Module:
    """``epochs`` of ``loop`` at lr = 0 (weights never move) with every BatchNorm's momentum set to
    ``bn_momentum``.
    """
    task = task_for("batch")
    model = task.make_model(0).to(device)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = bn_momentum
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights frozen: only the statistics move
    for _ in range(epochs):
        loop(model, opt, task.loader(large_batch // k), task.item_losses, accum_steps=k, device=device)
    return model


def running_stats(
    accum_steps: int = 8, large_batch: int = 32, device: str | torch.device = "auto"
) -> RunningStats:
    """One epoch of ``ragged`` and of ``large_batch`` at lr = 0, so the weights never move.

    Any difference left in ``running_mean``/``running_var`` is then due to the statistics
    alone: k updates per window from micro-batches of ``large_batch // k`` instead of one
    update from the large batch. ``eval_loss`` shows what that does to the model in eval mode.
    """
    k, large_batch = check_split(accum_steps, large_batch)
    dev = resolve_device(device)
    task = task_for("batch")
    models = {
        name: _frozen_epochs(loop, k, large_batch, 0.1, 1, dev)
        for name, loop in (("accumulated", ragged), ("large batch", large_batch_loop))
    }
    acc, big = (dict(m.named_buffers()) for m in models.values())
    rel = {name: _rel(acc[name], big[name]) for name in big if not name.endswith("num_batches_tracked")}
    tracked = {name: int(b["features.1.num_batches_tracked"]) for name, b in zip(models, (acc, big))}
    x, y = (t.to(dev) for t in task.make_dataset().tensors)
    eval_loss = {}
    for name, model in models.items():
        model.eval()
        with torch.no_grad():
            eval_loss[name] = float(F.cross_entropy(model(x), y))
    momentum = float(models["accumulated"].features[1].momentum)
    return RunningStats(k, large_batch // k, rel, tracked, eval_loss, momentum)


@dataclass
class MomentumCheck:
    """Running statistics after accumulation with several BatchNorm momenta, vs one large batch with momentum
    0.1.

    ``decay[m]`` is ``(1 - m) ** k``: how much of the old statistics survives one window of
    k micro-batch updates (the large batch keeps ``1 - 0.1 = 0.9``). ``worst[m]`` is the
    largest relative difference over every ``running_mean``/``running_var`` buffer.
    """

    k: int
    large_batch: int
    epochs: int
    momenta: dict[str, float]
    decay: dict[str, float]
    worst: dict[str, float]

    def table(self) -> Table:
        rows = [
            (name, f"{m:.5f}", f"{self.decay[name]:.4f}", f"{self.worst[name]:.4f}")
            for name, m in self.momenta.items()
        ]
        return Table(
            ("accumulated with momentum", "m", "(1 - m)^k (large batch: 0.9000)", "worst buffer difference"),
            rows,
            caption=f"BatchNorm running statistics after {self.epochs} epoch(s), k = {self.k} micro-batches "
            f"of {self.large_batch // self.k}, weights frozen",
        )


def momentum_check(
    accum_steps: int = 8, large_batch: int = 32, epochs: int = 1, device: str | torch.device = "auto"
) -> MomentumCheck:
    """Which BatchNorm momentum makes k micro-batch updates agree with one large-batch update at momentum 0.1?

    One window multiplies the old statistics by ``(1 - m) ** k`` under accumulation and by
    0.9 in the large batch. ``0.1 / k`` makes them agree to first order only
    (``(1 - 0.1/k) ** k -> exp(-0.1) = 0.905``); ``1 - 0.9 ** (1/k)`` makes them agree exactly,
    and what is left is that the k micro-batch means are weighted ``m (1 - m) ** (k - j)``,
    not equally, and that a micro-batch's variance is not the large batch's.
    """
    k, large_batch = check_split(accum_steps, large_batch)
    epochs = check_int("epochs", epochs, low=1)
    dev = resolve_device(device)
    momenta = {"0.1 (PyTorch's default)": 0.1, "0.1 / k": 0.1 / k, "1 - 0.9^(1/k)": 1 - 0.9 ** (1 / k)}
    big = dict(_frozen_epochs(large_batch_loop, k, large_batch, 0.1, epochs, dev).named_buffers())
    worst = {}
    for name, m in momenta.items():
        acc = dict(_frozen_epochs(ragged, k, large_batch, m, epochs, dev).named_buffers())
        worst[name] = max(_rel(acc[b], big[b]) for b in big if not b.endswith("num_batches_tracked"))
    decay = {name: (1 - m) ** k for name, m in momenta.items()}
    return MomentumCheck(k, large_batch, epochs, momenta, decay, worst)


@dataclass
class Budget:
    """Large-batch training of each norm, epoch by epoch: training loss (logged) and held-out accuracy."""

    epochs: int
    train_loss: dict[str, list[float]]
    accuracy: dict[str, list[float]]

    def table(self) -> Table:
        rows = [
            (
                e + 1,
                *(f"{self.train_loss[n][e]:.3f}" for n in NORMS),
                *(f"{self.accuracy[n][e]:.2f}" for n in NORMS),
            )
            for e in range(self.epochs)
        ]
        return Table(
            (
                "epoch",
                "BatchNorm train loss",
                "GroupNorm train loss",
                "BatchNorm accuracy",
                "GroupNorm accuracy",
            ),
            rows,
            caption="large batch of 32, SGD lr 0.1 momentum 0.9, 384 training digits, 512 held out",
        )


def held_out(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits(None, image=True).tensors
    return x[-512:].to(device), y[-512:].to(device)


def training_budget(
    epochs: int = 6, large_batch: int = 32, n: int = 384, lr: float = 0.1, device: str | torch.device = "auto"
) -> Budget:
    """Train each norm with the large batch for ``epochs``, measuring after every epoch.

    Shows where GroupNorm's lower accuracy after 3 epochs comes from: its *training* loss is
    higher too, so it is behind in optimization (slower at this learning rate), not worse at generalizing.
    """
    epochs = check_int("epochs", epochs, low=1)
    large_batch = check_int("large_batch", large_batch, low=1)
    n = check_int("n", n, low=large_batch, high=1797 - 512, why="the last 512 digits are held out")
    lr = check_float("lr", lr, low=0.0, low_open=True)
    dev = resolve_device(device)
    data = digits(n, image=True)
    x_test, y_test = held_out(dev)
    train_loss: dict[str, list[float]] = {}
    accuracy: dict[str, list[float]] = {}
    for norm in NORMS:
        task = task_for(norm)
        torch.manual_seed(0)
        model = task.make_model(0).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
        train_loss[norm], accuracy[norm] = [], []
        for _ in range(epochs):
            logged = large_batch_loop(
                model,
                opt,
                task.loader(large_batch, dataset=data),
                task.item_losses,
                accum_steps=1,
                device=dev,
            )
            train_loss[norm].append(sum(logged) / len(logged))
            model.eval()
            with torch.no_grad():
                accuracy[norm].append(float((model(x_test).argmax(1) == y_test).float().mean()))
            model.train()
    return Budget(epochs, train_loss, accuracy)
