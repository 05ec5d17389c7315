"""Lesson 1's training experiments: the MindSpore tutorial's batch 64 against 2 x 32 accumulated (and
undivided), and the learning-rate sweep that explains why the undivided loop can look better.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import get_task, large_batch, naive, normalized, resolve_device
from accumlib.checks import check_choice, check_float, check_int
from accumlib.data import N_DIGITS, digits_subset
from accumlib.tasks import classification_losses
from accumlib.text import Table

from .. import _style
from ._explorer import Explorer

TASK = "mlp-digits"
N_TRAIN = 1280  # 20 windows of 64: no partial window, so batch 64 and 2 x 32 see identical windows
OPTIMIZERS = ("sgd", "adam")


# --- the MindSpore experiment: batch 64 vs 2 x 32 accumulated ----------------------------------


@dataclass(frozen=True)
class Run:
    """One training run: the loss each optimizer step logged, and test metrics after each epoch."""

    name: str
    loss_per_step: tuple[float, ...]
    test_accuracy: tuple[float, ...]
    test_loss: tuple[float, ...]


@dataclass(frozen=True)
class TrainResult:
    accum_steps: int
    batch_size: int  # the micro-batch size b; the large batch is k * b
    lr: float
    epochs: int
    optimizer: str
    runs: dict[str, Run]

    @property
    def large_batch_size(self) -> int:
        return self.accum_steps * self.batch_size

    def max_curve_gap(self, a: str, b: str) -> float:
        """Largest |difference| between two runs' logged losses, step by step."""
        return max(abs(u - v) for u, v in zip(self.runs[a].loss_per_step, self.runs[b].loss_per_step))

    def rows(self) -> list[tuple[str, int, float, float]]:
        """(run, optimizer steps, final test accuracy %, final test loss), rounded for printing."""
        return [
            (r.name, len(r.loss_per_step), round(100 * r.test_accuracy[-1], 1), round(r.test_loss[-1], 3))
            for r in self.runs.values()
        ]

    def table(self) -> Table:
        return Table(
            ("run", "optimizer steps", "test accuracy %", "test loss"),
            self.rows(),
            caption=f"{self.optimizer.upper()} at lr {self.lr:g}, {self.epochs} epochs on {N_TRAIN} digits",
        )


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        losses = classification_losses(model, (x, y))
        correct = (model(x).argmax(1) == y).float().mean()
    return float(correct), float(losses.mean())


def _batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator_seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True, generator=...)`` yields,
    without its per-item cost.

    A DataLoader draws one int64 from its generator (its workers' base seed) before its
    sampler draws the permutation; doing the same gives the same items in the same order.
    """
    g = torch.Generator().manual_seed(generator_seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    perm = torch.randperm(len(y), generator=g)
    return [(x[perm[i : i + batch_size]], y[perm[i : i + batch_size]]) for i in range(0, len(y), batch_size)]


_LOOPS = {"large_batch": large_batch, "normalized": normalized, "naive": naive}


@functools.lru_cache(maxsize=512)
def _run(
    name: str,
    loop: str,
    batch_size: int,
    accum_steps: int,
    lr: float,
    epochs: int,
    optimizer: str,
    seed: int,
    device: str,
) -> Run:
    """One training run from the task's initial model; cached, so a widget recomputes only runs a control
    changed.
    """
    dev = torch.device(device)
    data = digits_subset(seed=seed)
    x, y = (t.to(dev) for t in data[:N_TRAIN])
    x_test, y_test = (t.to(dev) for t in data[N_TRAIN:])
    model = get_task(TASK).make_model(seed).to(dev)
    opt = (
        torch.optim.SGD(model.parameters(), lr=lr)
        if optimizer == "sgd"
        else torch.optim.Adam(model.parameters(), lr=lr)
    )
    curve, acc, tl = [], [], []
    for epoch in range(epochs):
        loader = _batches(x, y, batch_size, seed * 1000 + epoch)  # one shuffle per epoch, shared by every run
        curve += _LOOPS[loop](model, opt, loader, classification_losses, accum_steps=accum_steps, device=dev)
        accuracy, test_loss = _evaluate(model, x_test, y_test)
        acc.append(accuracy)
        tl.append(test_loss)
    return Run(name, tuple(curve), tuple(acc), tuple(tl))


def _check_train(accum_steps: Any, batch_size: Any, lr: Any, epochs: Any, optimizer: Any, seed: Any) -> None:
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    check_int(
        "batch_size",
        batch_size,
        low=1,
        high=N_TRAIN // accum_steps,
        why=f"one window of accum_steps x batch_size must fit in the {N_TRAIN} training digits",
    )
    check_float("lr", lr, low=0, low_open=True)
    check_int("epochs", epochs, low=1)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_int("seed", seed, low=0)


def train(
    accum_steps: int = 2,
    batch_size: int = 32,
    *,
    lr: float = 0.1,
    epochs: int = 3,
    optimizer: str = "sgd",
    seed: int = 0,
    device: Any = "auto",
) -> TrainResult:
    """The MindSpore tutorial's experiment on digits: ``epochs`` epochs, four runs from one initial model.

    With B = ``accum_steps * batch_size``:

    - ``batch B``: plain training, one step per batch of B (``accumlib.large_batch``, k = 1);
    - ``k x b accumulated (loss / k)``: ``accumlib.normalized``, the tutorial's ``loss / accumulate_step``;
    - ``k x b naive``: ``accumlib.naive``, the loss never divided;
    - ``batch B, lr x k``: plain training at k times the learning rate, what naive really does under SGD.

    Every run shuffles with the same seeded order per epoch, so batch B holds exactly the
    items of the k micro-batches that replace it. ``optimizer``: ``"sgd"`` or ``"adam"``.

    >>> train(accum_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer >= 1 (got 0)
    """
    _check_train(accum_steps, batch_size, lr, epochs, optimizer, seed)
    dev = str(resolve_device(device))
    k, b, big = accum_steps, batch_size, accum_steps * batch_size
    plans = [
        (f"batch {big}", "large_batch", big, 1, lr),
        (f"{k} x {b} accumulated (loss / k)", "normalized", b, k, lr),
        (f"{k} x {b} naive (not divided)", "naive", b, k, lr),
        (f"batch {big}, lr x {k}", "large_batch", big, 1, lr * k),
    ]
    runs = {
        name: _run(name, loop, size, steps, rate, epochs, optimizer, seed, dev)
        for name, loop, size, steps, rate in plans
    }
    return TrainResult(accum_steps, batch_size, lr, epochs, optimizer, runs)


@_style.styled
def plot_training(result: TrainResult) -> Figure:
    """Loss per optimizer step of every run, and test accuracy after each epoch."""
    k, big = result.accum_steps, result.large_batch_size
    fig, (ax, bx) = _style.figure(
        2,
        width=11.5,
        height=4.4,
        title=(
            f"{result.optimizer.upper()}, lr {result.lr:g}: batch {big} and {k} x {result.batch_size} "
            f"accumulated train alike; the undivided loop trains like lr x {k}"
        ),
    )
    roles = ["oracle", "correct", "buggy", "other"]
    widths = [4.0, 1.5, 4.0, 1.5]  # each thin line runs on top of the thick one it reproduces
    for role, lw, run in zip(roles, widths, result.runs.values()):
        style = {**_style.ROLE[role], "lw": lw}
        steps = range(1, len(run.loss_per_step) + 1)
        ax.plot(steps, run.loss_per_step, label=run.name, markevery=max(1, len(steps) // 8), **style)
        bx.plot(range(1, result.epochs + 1), [100 * a for a in run.test_accuracy], label=run.name, **style)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss of the step's window")
    ax.set_title(f"Training loss per step ({N_TRAIN} digits)")
    ax.legend()
    bx.set_xlabel("epoch")
    bx.set_ylabel("test accuracy (%)")
    bx.set_xticks(range(1, result.epochs + 1))
    bx.set_title(f"Accuracy on {N_DIGITS - N_TRAIN} held-out digits")
    return fig


def training_widget(
    accum_steps: int = 2,
    lr: float = 0.1,
    *,
    large_batch_size: int = 64,
    device: Any = "auto",
    initial: TrainResult | None = None,
) -> Explorer:
    """k and the learning rate for the batch-64 experiment (b = 64 / k); re-runs ``train`` (cached runs) and
    ``plot_training``.

    ``initial``: the notebook's ``train(2, 32, lr=0.1)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    options = [k for k in (1, 2, 4, 8) if large_batch_size % k == 0]
    check_choice("accum_steps", accum_steps, options)
    return Explorer(
        lambda accum_steps, lr: train(accum_steps, large_batch_size // accum_steps, lr=lr, device=device),
        plot_training,
        initial=initial,
        accum_steps=w.Dropdown(options=options, value=accum_steps, description="k"),
        lr=w.FloatLogSlider(value=lr, base=10, min=-2, max=0, step=0.25, description="lr"),
    )


# --- why the undivided loop can look better: a learning-rate sweep ---------------------------------


@dataclass(frozen=True)
class SweepResult:
    """Final test accuracy per learning rate, for plain micro-batch training, the accumulated loop and the
    naive one.
    """

    accum_steps: int
    batch_size: int
    epochs: int
    lrs: tuple[float, ...]
    accuracy: dict[str, tuple[float, ...]]  # per run name, per lr

    def best_lr(self, name: str) -> float:
        acc = self.accuracy[name]
        return self.lrs[acc.index(max(acc))]

    def rows(self) -> list[tuple[Any, ...]]:
        return [
            (f"{lr:g}", *(round(100 * self.accuracy[n][i], 1) for n in self.accuracy))
            for i, lr in enumerate(self.lrs)
        ]

    def table(self) -> Table:
        return Table(
            ("lr", *(f"{n}: test acc. %" for n in self.accuracy)),
            self.rows(),
            caption=f"SGD, {self.epochs} epochs, final accuracy on {N_DIGITS - N_TRAIN} held-out digits",
        )

    def amplified(self, lr: float, factors: tuple[int, ...] = (1, 2, 4)) -> Table:
        """The MindSpore advice, "amplify the learning rate": each loop at ``lr x factor``, from this sweep's
        runs.
        """
        lrs = [lr * f for f in factors]
        missing = [x for x in lrs if not any(abs(x - y) <= 1e-12 * y for y in self.lrs)]
        if missing:
            raise ValueError(
                f"lr x factors must be learning rates of the sweep {self.lrs} (missing {missing})"
            )
        at = [min(range(len(self.lrs)), key=lambda i: abs(self.lrs[i] - x)) for x in lrs]
        rows = [
            (f"x {f} (lr {x:g})", *(round(100 * self.accuracy[n][i], 1) for n in self.accuracy))
            for f, x, i in zip(factors, lrs, at)
        ]
        return Table(
            ("learning rate amplified", *(f"{n}: test acc. %" for n in self.accuracy)),
            rows,
            caption=f"Each loop at lr {lr:g} x factor, {self.epochs} epochs (from the sweep above)",
        )


def lr_sweep(
    accum_steps: int = 2,
    batch_size: int = 32,
    *,
    lrs: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6),
    epochs: int = 3,
    seed: int = 0,
    device: Any = "auto",
) -> SweepResult:
    """Train at every lr: batch b (no accumulation), k x b accumulated (== batch k b) and k x b naive.

    The naive loop at lr is batch k b at k x lr: its curve is the accumulated curve shifted by a
    factor k along the lr axis. Choose ``lrs`` a factor k apart to see that in the table.
    """
    _check_train(accum_steps, batch_size, 1.0, epochs, "sgd", seed)
    if not lrs:
        raise ValueError(f"lrs must hold at least one learning rate (got {lrs!r})")
    lrs = tuple(check_float(f"lrs[{i}]", lr, low=0, low_open=True) for i, lr in enumerate(lrs))
    dev = str(resolve_device(device))
    k, b = accum_steps, batch_size
    plans = [
        (f"batch {b}, no accumulation", "large_batch", b, 1),
        (f"{k} x {b} accumulated (loss / k)", "normalized", b, k),
        (f"{k} x {b} naive (not divided)", "naive", b, k),
    ]
    accuracy = {
        name: tuple(_run(name, loop, b, steps, lr, epochs, "sgd", seed, dev).test_accuracy[-1] for lr in lrs)
        for name, loop, b, steps in plans
    }
    return SweepResult(accum_steps, batch_size, epochs, lrs, accuracy)


@_style.styled
def plot_sweep(result: SweepResult) -> Figure:
    """Final test accuracy vs learning rate, one curve per loop."""
    k = result.accum_steps
    fig, ax = _style.figure(
        1,
        width=8,
        height=4.4,
        title=f"Test accuracy vs learning rate: the naive curve is the accumulated one shifted left by k = "
        f"{k}",
    )
    for (name, acc), role in zip(result.accuracy.items(), ("other", "correct", "buggy")):
        ax.plot(result.lrs, [100 * a for a in acc], label=name, **_style.ROLE[role])
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel(f"test accuracy after {result.epochs} epochs (%)")
    ax.legend()
    return fig
