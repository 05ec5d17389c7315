"""Lesson 1: why accumulate. Memory per micro-batch, and k micro-batches == one large batch.

Autograd keeps a micro-batch's activations until its backward; accumulation runs k
micro-batches of b items one after the other, so the activations alive at once are
those of b items, not of the k * b items the optimizer step averages over. The step
is the same because the gradient is linear in the items:

    grad (1/N) sum_i l_i  ==  sum_j grad( mean_{i in b_j} l_i / k )      (k equal micro-batches)

``compute`` measures both on digits; ``train`` repeats the MindSpore tutorial's
experiment (batch 64 vs 2 x 32 accumulated) on scikit-learn's offline digits, and
``lr_sweep`` shows why the undivided loop can *look* better: it is the large batch at
k times the learning rate. Everywhere ``batch_size`` is the micro-batch size b (what the
DataLoader hands out) and ``accum_steps`` is k.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import Subset

from .. import (
    activation_bytes, classification_losses, digits, get_task, large_batch, naive, normalized, resolve_device,
    trace_loop,
)
from ..tolerances import FLOAT32_RTOL
from . import _style
from ._common import N_DIGITS, Table, check_choice, check_float, check_int, digits_subset, fmt_error, gallery_rows, gallery_table  # noqa: F401 (the notebooks read them here)
from ._exercise import Exercise
from ._explorer import Explorer

TASK = "mlp-digits"
N_TRAIN = 1280  # 20 windows of 64: no partial window, so batch 64 and 2 x 32 see identical windows
OPTIMIZERS = ("sgd", "adam")


# --- memory and the one-window proof -----------------------------------------------------------

NORMALIZED = "accumulated, loss / k (accumlib.normalized)"
NAIVE = "accumulated, not divided (accumlib.naive)"


@dataclass(frozen=True)
class WhyResult:
    """Activation bytes and the gradient of one window, accumulated vs the large batch.

    ``large_bytes[i]``: activations of one forward over ``ks[i] * batch_size`` items;
    ``micro_bytes``: activations of one micro-batch, all that accumulation holds at once.
    """

    accum_steps: int
    batch_size: int
    ks: tuple[int, ...]
    large_bytes: tuple[int, ...]
    micro_bytes: int
    rel_error: dict[str, float]
    norm_ratio: dict[str, float]

    @property
    def memory_ratio(self) -> float:
        """Large-batch activations / accumulated activations at ``accum_steps``."""
        return self.large_bytes[self.ks.index(self.accum_steps)] / self.micro_bytes

    def memory_rows(self, ks: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[tuple[int, int, float, float, float]]:
        """(k, items per step, large-batch KiB, accumulated KiB, ratio), rounded for printing."""
        return [
            (k, k * self.batch_size, round(self.large_bytes[k - 1] / 1024, 1), round(self.micro_bytes / 1024, 1),
             round(self.large_bytes[k - 1] / self.micro_bytes, 2))
            for k in ks if k <= len(self.ks)
        ]

    def memory_table(self) -> Table:
        return Table(("k", "items per step", "large batch KiB", "accumulated KiB", "large / accumulated"), self.memory_rows(),
                     caption=f"Activation memory of the digits MLP, micro-batches of b = {self.batch_size}")

    def rows(self) -> list[tuple[str, str, float]]:
        """(loop, relative error vs the large batch, norm ratio), rounded for printing."""
        return [(name, fmt_error(self.rel_error[name]), round(self.norm_ratio[name], 3)) for name in self.rel_error]

    def table(self) -> Table:
        return Table(("loop", "relative error vs large batch", "|grad| / |large-batch grad|"), self.rows(),
                     caption=f"One window of k = {self.accum_steps} micro-batches of {self.batch_size} digits")


def _check_window(accum_steps: Any, batch_size: Any, max_k: Any, seed: Any) -> tuple[int, int, int, int]:
    max_k = check_int("max_k", max_k, low=1, high=N_DIGITS)
    accum_steps = check_int("accum_steps", accum_steps, low=1, high=max_k, why="the memory sweep measures k = 1..max_k")
    batch_size = check_int("batch_size", batch_size, low=1, high=N_DIGITS // max_k,
                           why=f"max_k x batch_size digits must exist ({N_DIGITS} in all)")
    return accum_steps, batch_size, max_k, check_int("seed", seed, low=0)


@functools.lru_cache(maxsize=64)
def _memory(batch_size: int, max_k: int, seed: int, device: str) -> tuple[tuple[int, ...], int]:
    """Activation bytes of one forward over k * b digits for k = 1..max_k, and of one micro-batch of b."""
    dev = torch.device(device)
    base = get_task(TASK)
    model = base.make_model(seed).to(dev)
    x, y = digits_subset(seed=seed)[: max_k * batch_size]
    large = tuple(activation_bytes(model, (x[: k * batch_size], y[: k * batch_size]), base.item_losses, dev)
                  for k in range(1, max_k + 1))
    return large, large[0]


@functools.lru_cache(maxsize=256)
def _window(accum_steps: int, batch_size: int, seed: int, device: str) -> tuple[dict[str, float], dict[str, float]]:
    """One window of k micro-batches through each loop, its gradient at the step against the oracle."""
    n = accum_steps * batch_size
    task = dataclasses.replace(
        get_task(TASK), make_dataset=functools.partial(digits_subset, n, seed), batch_size=batch_size, accum_steps=accum_steps
    )
    rel, ratio = {}, {}
    for name, loop in [(NORMALIZED, normalized), (NAIVE, naive)]:
        trace = trace_loop(loop, task, seed=seed, device=torch.device(device))
        assert len(trace.comparisons) == 1  # exactly one window of k micro-batches
        rel[name], ratio[name] = trace.comparisons[0].rel_error, trace.comparisons[0].norm_ratio
    return rel, ratio


def compute(accum_steps: int = 2, batch_size: int = 32, *, max_k: int = 16, seed: int = 0, device: Any = "auto") -> WhyResult:
    """Measure activation memory for k = 1..``max_k`` and check one window of ``accum_steps`` micro-batches.

    The window is the first ``accum_steps * batch_size`` digits; each loop's gradient at
    ``optimizer.step()`` is compared with the oracle (``accumlib.trace_loop``). Both parts
    are cached by their arguments, so a widget recomputes only the part a control changes.

    >>> compute(accum_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer between 1 and 16; the memory sweep measures k = 1..max_k (got 0)
    """
    accum_steps, batch_size, max_k, seed = _check_window(accum_steps, batch_size, max_k, seed)
    dev = str(resolve_device(device))
    large, micro = _memory(batch_size, max_k, seed, dev)
    rel, ratio = _window(accum_steps, batch_size, seed, dev)
    return WhyResult(accum_steps, batch_size, tuple(range(1, max_k + 1)), large, micro, dict(rel), dict(ratio))


@_style.styled
def plot(result: WhyResult) -> Figure:
    """Left: activation memory vs k. Right: the window's gradient length vs the large batch's."""
    k, b = result.accum_steps, result.batch_size
    fig, (ax, bx) = _style.figure(2, width=11.5, height=4.4,
                                  title=f"Accumulating k micro-batches of b = {b}: memory of one micro-batch, gradient of the large batch")
    kib = [x / 1024 for x in result.large_bytes]
    ax.plot(result.ks, kib, label=f"one large batch of k x {b} items", **_style.ROLE["other"])
    ax.plot(result.ks, [result.micro_bytes / 1024] * len(result.ks), label=f"k micro-batches of {b}, accumulated",
            **_style.ROLE["correct"])
    ax.axvline(k, color=_style.BLACK, ls=":", lw=1)
    ax.annotate(f"k = {k}: {result.memory_ratio:.1f} x less", (k, result.micro_bytes / 1024), xytext=(6, 12),
                textcoords="offset points")
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("activations kept for backward (KiB)")
    ax.set_title("Activation memory grows with the batch,\nnot with k")
    ax.legend(loc="upper left")
    labels = ["loss / k\n(normalized)", "not divided\n(naive)"]
    values = [result.norm_ratio[NORMALIZED], result.norm_ratio[NAIVE]]
    for x, (label, value, role) in enumerate(zip(labels, values, ("correct", "buggy"))):
        bx.bar(x, value, 0.6, color=_style.ROLE[role]["color"], hatch=_style.HATCH[role], edgecolor=_style.BLACK)
        bx.text(x, value, f"{value:.2f}", ha="center", va="bottom")
    bx.set_xticks([0, 1], labels)
    bx.axhline(1.0, label="large batch (oracle) = 1", **{**_style.ROLE["oracle"], "lw": 1.5})
    bx.set_ylim(0, max(values) * 1.2)
    bx.set_ylabel("|grad at step| / |large-batch grad|")
    bx.set_title(f"Gradient length at the step, k = {k}:\nnot dividing makes it k times too long")
    bx.legend(loc="upper left")
    return fig


def widget(accum_steps: int = 2, batch_size: int = 32, *, device: Any = "auto", initial: WhyResult | None = None) -> Explorer:
    """Sliders for k and the micro-batch size; each change re-runs ``compute`` (cached parts) and ``plot``.

    ``initial``: the notebook's ``compute(accum_steps, batch_size)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    _check_window(accum_steps, batch_size, 16, 0)
    return Explorer(
        lambda accum_steps, batch_size: compute(accum_steps, batch_size, device=device),
        plot,
        initial=initial,
        accum_steps=w.IntSlider(value=accum_steps, min=1, max=16, description="k"),
        batch_size=w.IntSlider(value=batch_size, min=1, max=64, description="micro-batch"),
    )


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
        return Table(("run", "optimizer steps", "test accuracy %", "test loss"), self.rows(),
                     caption=f"{self.optimizer.upper()} at lr {self.lr:g}, {self.epochs} epochs on {N_TRAIN} digits")


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        losses = classification_losses(model, (x, y))
        correct = (model(x).argmax(1) == y).float().mean()
    return float(correct), float(losses.mean())


def _batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator_seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True, generator=...)`` yields, without its per-item cost.

    A DataLoader draws one int64 from its generator (its workers' base seed) before its
    sampler draws the permutation; doing the same gives the same items in the same order.
    """
    g = torch.Generator().manual_seed(generator_seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    perm = torch.randperm(len(y), generator=g)
    return [(x[perm[i : i + batch_size]], y[perm[i : i + batch_size]]) for i in range(0, len(y), batch_size)]


_LOOPS = {"large_batch": large_batch, "normalized": normalized, "naive": naive}


@functools.lru_cache(maxsize=512)
def _run(name: str, loop: str, batch_size: int, accum_steps: int, lr: float, epochs: int, optimizer: str, seed: int,
         device: str) -> Run:
    """One training run from the task's initial model; cached, so a widget recomputes only runs a control changed."""
    dev = torch.device(device)
    data = digits_subset(seed=seed)
    x, y = (t.to(dev) for t in data[:N_TRAIN])
    x_test, y_test = (t.to(dev) for t in data[N_TRAIN:])
    model = get_task(TASK).make_model(seed).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd" else torch.optim.Adam(model.parameters(), lr=lr)
    curve, acc, tl = [], [], []
    for epoch in range(epochs):
        loader = _batches(x, y, batch_size, seed * 1000 + epoch)  # one shuffle per epoch, shared by every run
        curve += _LOOPS[loop](model, opt, loader, classification_losses, accum_steps=accum_steps, device=dev)
        a, l = _evaluate(model, x_test, y_test)
        acc.append(a)
        tl.append(l)
    return Run(name, tuple(curve), tuple(acc), tuple(tl))


def _check_train(accum_steps: Any, batch_size: Any, lr: Any, epochs: Any, optimizer: Any, seed: Any) -> None:
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    check_int("batch_size", batch_size, low=1, high=N_TRAIN // accum_steps,
              why=f"one window of accum_steps x batch_size must fit in the {N_TRAIN} training digits")
    check_float("lr", lr, low=0, low_open=True)
    check_int("epochs", epochs, low=1)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_int("seed", seed, low=0)


def train(
    accum_steps: int = 2, batch_size: int = 32, *, lr: float = 0.1, epochs: int = 3, optimizer: str = "sgd", seed: int = 0,
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
    runs = {name: _run(name, loop, size, steps, rate, epochs, optimizer, seed, dev) for name, loop, size, steps, rate in plans}
    return TrainResult(accum_steps, batch_size, lr, epochs, optimizer, runs)


@_style.styled
def plot_training(result: TrainResult) -> Figure:
    """Loss per optimizer step of every run, and test accuracy after each epoch."""
    k, big = result.accum_steps, result.large_batch_size
    fig, (ax, bx) = _style.figure(2, width=11.5, height=4.4, title=(
        f"{result.optimizer.upper()}, lr {result.lr:g}: batch {big} and {k} x {result.batch_size} accumulated train alike; "
        f"the undivided loop trains like lr x {k}"))
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


def training_widget(accum_steps: int = 2, lr: float = 0.1, *, large_batch_size: int = 64, device: Any = "auto",
                    initial: TrainResult | None = None) -> Explorer:
    """k and the learning rate for the batch-64 experiment (b = 64 / k); re-runs ``train`` (cached runs) and ``plot_training``.

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
    """Final test accuracy per learning rate, for plain micro-batch training, the accumulated loop and the naive one."""

    accum_steps: int
    batch_size: int
    epochs: int
    lrs: tuple[float, ...]
    accuracy: dict[str, tuple[float, ...]]  # per run name, per lr

    def best_lr(self, name: str) -> float:
        acc = self.accuracy[name]
        return self.lrs[acc.index(max(acc))]

    def rows(self) -> list[tuple[Any, ...]]:
        return [(f"{lr:g}", *(round(100 * self.accuracy[n][i], 1) for n in self.accuracy)) for i, lr in enumerate(self.lrs)]

    def table(self) -> Table:
        return Table(("lr", *(f"{n}: test acc. %" for n in self.accuracy)), self.rows(),
                     caption=f"SGD, {self.epochs} epochs, final accuracy on {N_DIGITS - N_TRAIN} held-out digits")

    def amplified(self, lr: float, factors: tuple[int, ...] = (1, 2, 4)) -> Table:
        """The MindSpore advice, "amplify the learning rate": each loop at ``lr x factor``, from this sweep's runs."""
        lrs = [lr * f for f in factors]
        missing = [x for x in lrs if not any(abs(x - y) <= 1e-12 * y for y in self.lrs)]
        if missing:
            raise ValueError(f"lr x factors must be learning rates of the sweep {self.lrs} (missing {missing})")
        at = [min(range(len(self.lrs)), key=lambda i: abs(self.lrs[i] - x)) for x in lrs]
        rows = [(f"x {f} (lr {x:g})", *(round(100 * self.accuracy[n][i], 1) for n in self.accuracy)) for f, x, i in zip(factors, lrs, at)]
        return Table(("learning rate amplified", *(f"{n}: test acc. %" for n in self.accuracy)), rows,
                     caption=f"Each loop at lr {lr:g} x factor, {self.epochs} epochs (from the sweep above)")


def lr_sweep(accum_steps: int = 2, batch_size: int = 32, *, lrs: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6),
             epochs: int = 3, seed: int = 0, device: Any = "auto") -> SweepResult:
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
    plans = [(f"batch {b}, no accumulation", "large_batch", b, 1), (f"{k} x {b} accumulated (loss / k)", "normalized", b, k),
             (f"{k} x {b} naive (not divided)", "naive", b, k)]
    accuracy = {name: tuple(_run(name, loop, b, steps, lr, epochs, "sgd", seed, dev).test_accuracy[-1] for lr in lrs)
                for name, loop, b, steps in plans}
    return SweepResult(accum_steps, batch_size, epochs, lrs, accuracy)


@_style.styled
def plot_sweep(result: SweepResult) -> Figure:
    """Final test accuracy vs learning rate, one curve per loop."""
    k = result.accum_steps
    fig, ax = _style.figure(1, width=8, height=4.4,
                            title=f"Test accuracy vs learning rate: the naive curve is the accumulated one shifted left by k = {k}")
    for (name, acc), role in zip(result.accuracy.items(), ("other", "correct", "buggy")):
        ax.plot(result.lrs, [100 * a for a in acc], label=name, **_style.ROLE[role])
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel(f"test accuracy after {result.epochs} epochs (%)")
    ax.legend()
    return fig


# --- the exercise --------------------------------------------------------------------------------


def exercise_dataset(seed: int = 0) -> Any:
    """128 digits: 2 windows of 2 x 32, nothing left over."""
    return digits_subset(128, seed)


EXERCISE = Exercise(
    "01-divide-the-loss",
    "Make 2 x 32 accumulated match batch 64",
    accum_steps=2,
    batch_size=32,
    make_dataset=exercise_dataset,
    hints={
        "unscaled-sum": (
            "Every micro-batch's loss is the mean over its 32 digits, and backward() adds its gradient to what .grad "
            "already holds. After k of them, how many times the large batch's mean gradient does .grad hold? The "
            "large batch weighs each of its 64 digits 1/64; change one line so each micro-batch contributes its share."),
        "misscaled": (
            "Every step is now too small by the one factor c shown above. A mean is already divided by its items; "
            "count how many times your loop divides, and by what, then keep only the division that turns k means "
            "into one mean."),
        "early-step": (
            "The optimizer stepped before the window's k micro-batches were all in .grad. Step (and zero) only after "
            "the k-th backward of a window."),
        "zero-grad-inside-window": (
            ".grad is emptied between the micro-batches of one window, so only the last one reaches the step. "
            "Zero the gradients only right after optimizer.step()."),
        "no-zero-grad": (
            "Gradients of the previous window are still in .grad when the next window starts. Empty .grad once per "
            "window, right after the step."),
    },
)


__all__ = [
    "EXERCISE", "N_TRAIN", "Run", "SweepResult", "TrainResult", "WhyResult", "compute", "digits_subset", "exercise_dataset",
    "fmt_error", "gallery_rows", "gallery_table", "lr_sweep", "plot", "plot_sweep", "plot_training", "train",
    "training_widget", "widget",
]
