"""Lesson 5: BatchNorm vs GroupNorm under gradient accumulation.

BatchNorm normalizes each micro-batch with *its own* mean and variance, so the loss of a
window split into k micro-batches is a different function from the loss of the large
batch: no accumulation loop can reproduce the large-batch gradient. Its running
statistics are also updated k times per window, from small, noisy batches. GroupNorm
normalizes within each sample, so splitting the batch changes nothing: ``ragged`` is exact.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from .. import digits, get_task, ragged, resolve_device, trace_loop
from .. import large_batch as large_batch_loop  # the loop; ``large_batch`` below is a batch size
from ..tolerances import FLOAT32_RTOL
from . import _style
from ._common import Table, check_float, check_int, check_ints
from ._exercise import Exercise

NORMS = ("batch", "group")
MOMENTUM = 0.9  # SGD momentum for the training curves: a realistic optimizer, still deterministic


def task_for(norm: str) -> Any:
    """The built-in task: ``cnn-batchnorm`` or ``cnn-groupnorm`` (the same CNN and 128 images)."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS} (got {norm!r})")
    return get_task(f"cnn-{norm}norm")


def _check_split(accum_steps: Any, large_batch: Any) -> tuple[int, int]:
    large_batch = check_int("large_batch", large_batch, low=1)
    k = check_int("accum_steps", accum_steps, low=1, high=large_batch, why=f"it splits a large batch of {large_batch}")
    if large_batch % k:
        raise ValueError(f"accum_steps must divide large_batch={large_batch}, so every micro-batch holds "
                         f"{large_batch}/accum_steps images (got {k})")
    return k, large_batch


@dataclass
class ErrorVsK:
    """Worst relative gradient error vs the large batch over one epoch, per norm and k."""

    large_batch: int
    ks: list[int]
    errors: dict[str, list[float]]

    def micro_batch(self, k: int) -> int:
        return self.large_batch // k

    def table(self) -> Table:
        fmt = lambda e: f"< {FLOAT32_RTOL:g}" if e < FLOAT32_RTOL else f"{e:.2f}"  # noqa: E731  below: float32 rounding
        return Table(("k", "micro-batch", "BatchNorm error", "GroupNorm error"),
                     [(k, self.micro_batch(k), fmt(b), fmt(g)) for k, b, g in zip(self.ks, self.errors["batch"], self.errors["group"])],
                     caption=f"worst relative gradient error vs one large batch of {self.large_batch}, per split")


def error_vs_k(
    accum_steps: tuple[int, ...] = (1, 2, 4, 8, 16), large_batch: int = 32, device: str | torch.device = "auto", n_images: int = 64
) -> ErrorVsK:
    """Split a large batch of ``large_batch`` images into k micro-batches; trace ``ragged`` against the oracle.

    The large batch stays the same, only the split changes, so k = 1 is the large batch
    itself and every error is the price of splitting it. One epoch over the first
    ``n_images`` digits of the task (64: two large batches of 32, enough to see the trend).
    Each (norm, k) is cached, so a widget returning to a value redraws at once.

    >>> error_vs_k((3,), large_batch=32)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must divide large_batch=32, so every micro-batch holds 32/accum_steps images (got 3)
    """
    large_batch = check_int("large_batch", large_batch, low=1)
    ks = [_check_split(k, large_batch)[0] for k in check_ints("accum_steps", accum_steps, low=1)]
    n_images = check_int("n_images", n_images, low=large_batch, high=1797, why="at least one large batch of the 1797 digits")
    dev = str(resolve_device(device))
    errors = {norm: [_split_error(norm, k, large_batch, n_images, dev) for k in ks] for norm in NORMS}
    return ErrorVsK(large_batch, ks, errors)


compute = error_vs_k  # the lesson's main computation, under the name every lesson uses


@functools.lru_cache(maxsize=128)
def _split_error(norm: str, k: int, large_batch: int, n_images: int, device: str) -> float:
    task = dataclasses.replace(task_for(norm), make_dataset=functools.partial(digits, n_images, image=True))
    tr = trace_loop(ragged, task, accum_steps=k, batch_size=large_batch // k, device=torch.device(device))
    return max(c.rel_error for c in tr.comparisons)


_NORM_ROLE = {"batch": "buggy", "group": "correct"}  # BatchNorm is the one accumulation cannot match


@_style.styled
def plot(result: ErrorVsK) -> Figure:
    """Worst gradient error against k, per norm, with the float32 tolerance."""
    fig, ax = _style.figure(width=7.5, height=3.8,
                            title=f"Splitting a batch of {result.large_batch}: BatchNorm's gradient drifts, GroupNorm's stays exact")
    for norm in NORMS:
        ax.plot(result.ks, [max(e, 1e-9) for e in result.errors[norm]], label=f"{norm} norm", **_style.ROLE[_NORM_ROLE[norm]])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(result.ks, [f"{k}\n(mb {result.micro_batch(k)})" for k in result.ks])
    ax.minorticks_off()
    ax.axhline(FLOAT32_RTOL, **{**_style.ROLE["oracle"], "linewidth": 1}, label="float32 tolerance")
    ax.set_xlabel(f"k micro-batches (micro-batch size) per large batch of {result.large_batch}")
    ax.set_ylabel("worst relative error vs large batch")
    ax.legend(loc="center right")
    return fig


plot_error_vs_k = plot


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
    return float((a.double() - b.double()).norm() / b.double().norm())


def _frozen_epochs(loop: Any, k: int, large_batch: int, bn_momentum: float, epochs: int, device: torch.device) -> torch.nn.Module:
    """``epochs`` of ``loop`` at lr = 0 (weights never move) with every BatchNorm's momentum set to ``bn_momentum``."""
    task = task_for("batch")
    model = task.make_model(0).to(device)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = bn_momentum
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights frozen: only the statistics move
    for _ in range(epochs):
        loop(model, opt, task.loader(large_batch // k), task.item_losses, accum_steps=k, device=device)
    return model


def running_stats(accum_steps: int = 8, large_batch: int = 32, device: str | torch.device = "auto") -> RunningStats:
    """One epoch of ``ragged`` and of ``large_batch`` at lr = 0, so the weights never move.

    Any difference left in ``running_mean``/``running_var`` is then due to the statistics
    alone: k updates per window from micro-batches of ``large_batch // k`` instead of one
    update from the large batch. ``eval_loss`` shows what that does to the model in eval mode.
    """
    k, large_batch = _check_split(accum_steps, large_batch)
    dev = resolve_device(device)
    task = task_for("batch")
    models = {name: _frozen_epochs(loop, k, large_batch, 0.1, 1, dev)
              for name, loop in (("accumulated", ragged), ("large batch", large_batch_loop))}
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
    """Running statistics after accumulation with several BatchNorm momenta, vs one large batch with momentum 0.1.

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
        rows = [(name, f"{m:.5f}", f"{self.decay[name]:.4f}", f"{self.worst[name]:.4f}") for name, m in self.momenta.items()]
        return Table(("accumulated with momentum", "m", "(1 - m)^k (large batch: 0.9000)", "worst buffer difference"), rows,
                     caption=f"BatchNorm running statistics after {self.epochs} epoch(s), k = {self.k} micro-batches of "
                             f"{self.large_batch // self.k}, weights frozen")


def momentum_check(accum_steps: int = 8, large_batch: int = 32, epochs: int = 1, device: str | torch.device = "auto") -> MomentumCheck:
    """Which BatchNorm momentum makes k micro-batch updates agree with one large-batch update at momentum 0.1?

    One window multiplies the old statistics by ``(1 - m) ** k`` under accumulation and by
    0.9 in the large batch. ``0.1 / k`` makes them agree to first order only
    (``(1 - 0.1/k) ** k -> exp(-0.1) = 0.905``); ``1 - 0.9 ** (1/k)`` makes them agree exactly,
    and what is left is that the k micro-batch means are weighted ``m (1 - m) ** (k - j)``,
    not equally, and that a micro-batch's variance is not the large batch's.
    """
    k, large_batch = _check_split(accum_steps, large_batch)
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
        rows = [(e + 1, *(f"{self.train_loss[n][e]:.3f}" for n in NORMS), *(f"{self.accuracy[n][e]:.2f}" for n in NORMS))
                for e in range(self.epochs)]
        return Table(("epoch", "BatchNorm train loss", "GroupNorm train loss", "BatchNorm accuracy", "GroupNorm accuracy"), rows,
                     caption="large batch of 32, SGD lr 0.1 momentum 0.9, 384 training digits, 512 held out")


def _held_out(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits(None, image=True).tensors
    return x[-512:].to(device), y[-512:].to(device)


def training_budget(epochs: int = 6, large_batch: int = 32, n: int = 384, lr: float = 0.1, device: str | torch.device = "auto") -> Budget:
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
    x_test, y_test = _held_out(dev)
    train_loss: dict[str, list[float]] = {}
    accuracy: dict[str, list[float]] = {}
    for norm in NORMS:
        task = task_for(norm)
        torch.manual_seed(0)
        model = task.make_model(0).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
        train_loss[norm], accuracy[norm] = [], []
        for _ in range(epochs):
            logged = large_batch_loop(model, opt, task.loader(large_batch, dataset=data), task.item_losses, accum_steps=1, device=dev)
            train_loss[norm].append(sum(logged) / len(logged))
            model.eval()
            with torch.no_grad():
                accuracy[norm].append(float((model(x_test).argmax(1) == y_test).float().mean()))
            model.train()
    return Budget(epochs, train_loss, accuracy)


@dataclass
class Curves:
    """Logged loss per optimizer step and final eval accuracy, per (norm, loop)."""

    k: int
    micro_batch: int
    losses: dict[tuple[str, str], list[float]]
    accuracy: dict[tuple[str, str], float]
    n_train: int
    n_test: int
    epochs: int
    momentum: float

    def max_gap(self, norm: str) -> float:
        a, b = self.losses[(norm, "accumulated")], self.losses[(norm, "large batch")]
        return max(abs(x - y) for x, y in zip(a, b))

    def table(self) -> Table:
        fmt = lambda g: f"< {FLOAT32_RTOL:g}" if g < FLOAT32_RTOL else f"{g:.2f}"  # noqa: E731
        rows = [(f"{norm} norm", fmt(self.max_gap(norm)), f"{self.accuracy[(norm, 'accumulated')]:.2f}",
                 f"{self.accuracy[(norm, 'large batch')]:.2f}") for norm in NORMS]
        return Table(("model", "largest gap between loss curves", "accuracy, accumulated", "accuracy, large batch"), rows,
                     caption=f"{self.n_train} training digits, {self.n_test} held out, {self.epochs} epochs, "
                             f"k = {self.k} micro-batches of {self.micro_batch}, SGD momentum {self.momentum}")


def training_curves(
    accum_steps: int = 8, large_batch: int = 32, epochs: int = 3, n: int = 384, lr: float = 0.1, device: str | torch.device = "auto"
) -> Curves:
    """Train the CNN with each norm for ``epochs`` on ``n`` digits, accumulated (``ragged``) vs large batch.

    Both runs see the same images in the same windows; only the split into micro-batches
    differs. Accuracy is measured in eval mode on 512 digits the runs never trained on.
    Each run is cached, and the large-batch run does not depend on k (the same windows,
    merged), so a new k trains only the two accumulated runs.
    """
    k, large_batch = _check_split(accum_steps, large_batch)
    epochs = check_int("epochs", epochs, low=1)
    n = check_int("n", n, low=large_batch, high=1797 - 512, why="the last 512 digits are held out")
    lr = check_float("lr", lr, low=0.0, low_open=True)
    dev = str(resolve_device(device))
    losses, accuracy = {}, {}
    for norm in NORMS:
        for name in ("accumulated", "large batch"):
            # the large batch merges each window: its run is the same for every k, so it is trained once (k = 1)
            kk = k if name == "accumulated" else 1
            losses[(norm, name)], accuracy[(norm, name)] = _train(norm, name, kk, large_batch, epochs, n, lr, dev)
    n_test = 512
    return Curves(k, large_batch // k, losses, accuracy, n, n_test, epochs, MOMENTUM)


@functools.lru_cache(maxsize=64)
def _train(norm: str, name: str, k: int, large_batch: int, epochs: int, n: int, lr: float, device: str) -> tuple[list[float], float]:
    dev = torch.device(device)
    loop = ragged if name == "accumulated" else large_batch_loop
    data = digits(n, image=True)
    x_test, y_test = _held_out(dev)
    task = task_for(norm)
    torch.manual_seed(0)
    model = task.make_model(0).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    logged: list[float] = []
    for _ in range(epochs):
        logged += loop(model, opt, task.loader(large_batch // k, dataset=data), task.item_losses, accum_steps=k, device=dev)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    return logged, accuracy


@_style.styled
def plot_curves(curves: Curves) -> Figure:
    """The logged loss per step, accumulated vs large batch, one panel per norm."""
    fig, axes = _style.figure(2, width=10, height=3.8,
                              title=f"Training with k = {curves.k} micro-batches of {curves.micro_batch} vs one batch of "
                                    f"{curves.k * curves.micro_batch}: GroupNorm's curves coincide, BatchNorm's drift apart")
    axes[1].sharey(axes[0])
    for ax, norm in zip(axes, NORMS):
        for name, role in (("large batch", "oracle"), ("accumulated", _NORM_ROLE[norm])):
            acc = curves.accuracy[(norm, name)]
            ax.plot(curves.losses[(norm, name)], label=f"{name} (accuracy {acc:.2f})", markevery=6, **_style.ROLE[role])
        ax.set_title(f"{norm} norm")
        ax.set_xlabel("optimizer step")
        ax.legend(loc="upper right")
    axes[0].set_ylabel("logged window loss")
    return fig


def error_explorer(device: str | torch.device = "auto", initial: ErrorVsK | None = None, **settings: Any) -> Any:
    """A slider for the large batch; re-runs ``error_vs_k`` and redraws the error curves.

    ``initial``: a result already computed with the default large batch of 32, shown without recomputing;
    ``settings`` go to ``error_vs_k`` unchanged (e.g. fewer ``accum_steps`` in a test).
    """
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        lambda large_batch: error_vs_k(large_batch=large_batch, device=device, **settings),
        plot,
        initial=initial,
        large_batch=w.SelectionSlider(options=[16, 32, 64], value=32, description="large batch",
                                      style={"description_width": "initial"}, continuous_update=False),
    )


widget = error_explorer


def curves_explorer(device: str | torch.device = "auto", initial: Curves | None = None, precompute: bool = False, **settings: Any) -> Any:
    """A slider for k (the large batch stays 32); re-runs ``training_curves``; ``initial``, ``settings`` as above (k = 8).

    ``precompute``: train every k of the slider now, so each move of the slider only redraws.
    """
    import ipywidgets as w

    from ._explorer import Explorer

    options = [1, 2, 4, 8, 16]
    if precompute:
        for k in options:
            training_curves(accum_steps=k, device=device, **settings)
    return Explorer(
        lambda accum_steps: training_curves(accum_steps=accum_steps, device=device, **settings),
        plot_curves,
        initial=initial,
        accum_steps=w.SelectionSlider(options=options, value=8, description="k (accum_steps)",
                                      style={"description_width": "initial"}, continuous_update=False),
    )


# --- the exercise: accumulate exactly with a model that holds BatchNorm ----------------------------


def calibrated_cnn(n_images: int = 64) -> torch.nn.Module:
    """A BatchNorm CNN whose running statistics were estimated on the exercise's images (as after pretraining).

    One forward pass in training mode, without gradients, over all ``n_images`` at once, with
    ``momentum=None`` (a plain cumulative average): the buffers then hold the data's statistics.
    """
    model = task_for("batch").make_model(0)
    x, _ = digits(n_images, image=True).tensors
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        model(x)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.1
    return model


EXERCISE = Exercise(
    "05-accumulate-with-batchnorm",
    "Make a BatchNorm model accumulate exactly",
    task="cnn-batchnorm",  # its losses; the model arrives calibrated, on 64 images
    make_model=functools.partial(calibrated_cnn, 64),
    make_dataset=functools.partial(digits, 64, image=True),
    accum_steps=4,
    batch_size=4,
    hints={
        "batchnorm": (
            "No division or step placement fixes this one: the difference is in the forward pass. In training mode a "
            "BatchNorm layer normalizes each image with the mean and variance of the micro-batch it sits in, so an "
            "image's loss depends on which images share its micro-batch. This model arrives with running statistics "
            "already estimated on the data. Which mode makes BatchNorm use those instead, and how can you put only "
            "the BatchNorm layers into it, inside train_fn, before the first forward?"),
        "unscaled-sum": "Each micro-batch's loss must still be divided so that every image of the window weighs 1/N.",
        "mean-of-means": "Weigh images, not micro-batches: divide each micro-batch's summed loss by the window's image count.",
        "misscaled": "Every step is off by one factor: check what you divide by.",
        "zero-grad-inside-window": "Gradients are cleared between micro-batches of one window: zero them only after a step.",
        "no-zero-grad": "Gradients of the previous window are still in .grad: zero them right after every step.",
        "early-step": "The optimizer steps more often than once per k micro-batches.",
        "tail-dropped": "Some images never reached a step: every micro-batch must end up in a window that steps.",
        "error": "Your code raised an error: read its last line, fix it, and run the cell again.",
    },
    default_hint=(
        "The loop's arithmetic is already right for full windows; what differs from the large batch is how the "
        "BatchNorm layers compute their output for a micro-batch."),
)
