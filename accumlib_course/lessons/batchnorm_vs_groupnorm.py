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
from matplotlib.figure import Figure

from accumlib import large_batch as large_batch_loop  # the loop; ``large_batch`` below is a batch size
from accumlib import ragged, resolve_device
from accumlib.checks import check_float, check_int, check_ints
from accumlib.data import digits
from accumlib.harness import trace_loop
from accumlib.text import Table
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from ._batchnorm_vs_groupnorm_stats import (  # noqa: F401 (the notebook reads them here)
    MOMENTUM,
    NORMS,
    Budget,
    MomentumCheck,
    RunningStats,
    check_split,
    held_out,
    momentum_check,
    running_stats,
    task_for,
    training_budget,
)
from ._exercise import Exercise


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
        return Table(
            ("k", "micro-batch", "BatchNorm error", "GroupNorm error"),
            [
                (k, self.micro_batch(k), fmt(b), fmt(g))
                for k, b, g in zip(self.ks, self.errors["batch"], self.errors["group"])
            ],
            caption=f"worst relative gradient error vs one large batch of {self.large_batch}, per split",
        )


def error_vs_k(
    accum_steps: tuple[int, ...] = (1, 2, 4, 8, 16),
    large_batch: int = 32,
    device: str | torch.device = "auto",
    n_images: int = 64,
) -> ErrorVsK:
    """Split a large batch of ``large_batch`` images into k micro-batches; trace ``ragged`` vs the oracle.

    The large batch stays the same, only the split changes, so k = 1 is the large batch itself and every
    error is the price of splitting it. One epoch over the first ``n_images`` digits of the task (64: two
    large batches of 32, enough to see the trend). Each (norm, k) is cached: a widget redraws at once.

    >>> error_vs_k((3,), large_batch=32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must divide large_batch=32, so every micro-batch holds 32/accum_steps ... (got 3)
    """
    large_batch = check_int("large_batch", large_batch, low=1)
    ks = [check_split(k, large_batch)[0] for k in check_ints("accum_steps", accum_steps, low=1)]
    n_images = check_int(
        "n_images", n_images, low=large_batch, high=1797, why="at least one large batch of the 1797 digits"
    )
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
    fig, ax = _style.figure(
        width=7.5,
        height=3.8,
        title=f"Splitting a batch of {result.large_batch}: BatchNorm's gradient drifts, GroupNorm's stays "
        f"exact",
    )
    for norm in NORMS:
        ax.plot(
            result.ks,
            [max(e, 1e-9) for e in result.errors[norm]],
            label=f"{norm} norm",
            **_style.ROLE[_NORM_ROLE[norm]],
        )
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
        rows = [
            (
                f"{norm} norm",
                fmt(self.max_gap(norm)),
                f"{self.accuracy[(norm, 'accumulated')]:.2f}",
                f"{self.accuracy[(norm, 'large batch')]:.2f}",
            )
            for norm in NORMS
        ]
        return Table(
            ("model", "largest gap between loss curves", "accuracy, accumulated", "accuracy, large batch"),
            rows,
            caption=f"{self.n_train} training digits, {self.n_test} held out, {self.epochs} epochs, "
            f"k = {self.k} micro-batches of {self.micro_batch}, SGD momentum {self.momentum}",
        )


def training_curves(
    accum_steps: int = 8,
    large_batch: int = 32,
    epochs: int = 3,
    n: int = 384,
    lr: float = 0.1,
    device: str | torch.device = "auto",
) -> Curves:
    """Train the CNN with each norm for ``epochs`` on ``n`` digits, accumulated (``ragged``) vs large batch.

    Both runs see the same images in the same windows; only the split into micro-batches differs. Accuracy
    is measured in eval mode on 512 digits the runs never trained on. Each run is cached, and the
    large-batch run does not depend on k (the same windows, merged): a new k trains only the accumulated runs.
    """
    k, large_batch = check_split(accum_steps, large_batch)
    epochs = check_int("epochs", epochs, low=1)
    n = check_int("n", n, low=large_batch, high=1797 - 512, why="the last 512 digits are held out")
    lr = check_float("lr", lr, low=0.0, low_open=True)
    dev = str(resolve_device(device))
    losses, accuracy = {}, {}
    for norm in NORMS:
        for name in ("accumulated", "large batch"):
            # the large batch merges each window: its run is the same for every k, trained once (k = 1)
            kk = k if name == "accumulated" else 1
            losses[(norm, name)], accuracy[(norm, name)] = _train(
                norm, name, kk, large_batch, epochs, n, lr, dev
            )
    n_test = 512
    return Curves(k, large_batch // k, losses, accuracy, n, n_test, epochs, MOMENTUM)


@functools.lru_cache(maxsize=64)
def _train(
    norm: str, name: str, k: int, large_batch: int, epochs: int, n: int, lr: float, device: str
) -> tuple[list[float], float]:
    dev = torch.device(device)
    loop = ragged if name == "accumulated" else large_batch_loop
    data = digits(n, image=True)
    x_test, y_test = held_out(dev)
    task = task_for(norm)
    torch.manual_seed(0)
    model = task.make_model(0).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    logged: list[float] = []
    for _ in range(epochs):
        logged += loop(
            model,
            opt,
            task.loader(large_batch // k, dataset=data),
            task.item_losses,
            accum_steps=k,
            device=dev,
        )
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    return logged, accuracy


@_style.styled
def plot_curves(curves: Curves) -> Figure:
    """The logged loss per step, accumulated vs large batch, one panel per norm."""
    fig, axes = _style.figure(
        2,
        width=10,
        height=3.8,
        title=f"Training with k = {curves.k} micro-batches of {curves.micro_batch} vs one batch of "
        f"{curves.k * curves.micro_batch}: GroupNorm's curves coincide, BatchNorm's drift apart",
    )
    axes[1].sharey(axes[0])
    for ax, norm in zip(axes, NORMS):
        for name, role in (("large batch", "oracle"), ("accumulated", _NORM_ROLE[norm])):
            acc = curves.accuracy[(norm, name)]
            ax.plot(
                curves.losses[(norm, name)],
                label=f"{name} (accuracy {acc:.2f})",
                markevery=6,
                **_style.ROLE[role],
            )
        ax.set_title(f"{norm} norm")
        ax.set_xlabel("optimizer step")
        ax.legend(loc="upper right")
    axes[0].set_ylabel("logged window loss")
    return fig


def error_explorer(
    device: str | torch.device = "auto", initial: ErrorVsK | None = None, **settings: Any
) -> Any:
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
        large_batch=w.SelectionSlider(
            options=[16, 32, 64],
            value=32,
            description="large batch",
            style={"description_width": "initial"},
            continuous_update=False,
        ),
    )


widget = error_explorer


def curves_explorer(
    device: str | torch.device = "auto",
    initial: Curves | None = None,
    precompute: bool = False,
    **settings: Any,
) -> Any:
    """A slider for k (large batch 32); re-runs ``training_curves``; ``initial``, ``settings``: as above.

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
        accum_steps=w.SelectionSlider(
            options=options,
            value=8,
            description="k (accum_steps)",
            style={"description_width": "initial"},
            continuous_update=False,
        ),
    )


# --- the exercise: accumulate exactly with a model that holds BatchNorm ----------------------------


def calibrated_cnn(n_images: int = 64) -> torch.nn.Module:
    """A BatchNorm CNN whose running statistics were estimated on the exercise's images, as after pretraining:
    one forward in training mode, without gradients, over all ``n_images`` at once, with ``momentum=None``
    (a plain cumulative average), so the buffers hold the data's statistics."""
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
    call="norms.EXERCISE",
    hints={
        "batchnorm": (
            "No division or step placement fixes this one: the difference is in the forward pass. In "
            "training mode a BatchNorm layer normalizes each image with the mean and variance of the "
            "micro-batch it sits in, so an image's loss depends on which images share its micro-batch.",
            "This model arrives with running statistics already estimated on the data. Which mode makes "
            "BatchNorm use those instead, and how can you put only the BatchNorm layers into it, inside "
            "train_fn, before the first forward?",
            "Before the loop: for m in model.modules(): if isinstance(m, torch.nn.BatchNorm2d): m.eval().",
        ),
        "frozen-parameter": (
            "Your loop froze parameters (requires_grad=False): the verdict names them.",
            "eval() changes how BatchNorm normalizes; it does not need BatchNorm's weight and bias frozen, "
            "and the large batch trains them.",
            "Keep m.eval() for the BatchNorm layers and remove requires_grad_(False): every parameter "
            "trains.",
        ),
        "unscaled-sum": (
            "Each micro-batch's loss reaches backward undivided.",
            "Every image of the window should weigh 1/N, N = k x 4 images.",
            "backward F.cross_entropy(..., reduction='sum') / (k * len(y)).",
        ),
        "mean-of-means": "Weigh images, not micro-batches: divide each micro-batch's summed loss by the "
        "window's image count.",
        "misscaled": (
            "Every step is off by one factor c: the division is there, but by the wrong number.",
            "The loss is a sum over 4 images; the window holds k x 4 = 16.",
            "Divide the summed loss by k * len(y), once.",
        ),
        "unexplained": (
            "The loss your loop backpropagated is not the one the model it was handed gives. If the verdict "
            "names layers your loop replaced: GroupNorm accumulates exactly in a model built with it, but "
            "swapped in here it makes another model, whose new parameters the optimizer was never given.",
            "Keep every layer you are handed; change only the mode the BatchNorm layers run in. Which mode "
            "normalizes with the running statistics they already hold?",
            "Remove the swap; before the loop, put every torch.nn.BatchNorm2d of model.modules() in eval().",
        ),
        "zero-grad-inside-window": "Gradients are cleared between micro-batches of one window: zero them "
        "only after a step.",
        "no-zero-grad": "Gradients of the previous window are still in .grad: zero them right after every "
        "step.",
        "early-step": "The optimizer steps more often than once per k micro-batches.",
        "tail-dropped": "Some images never reached a step: every micro-batch must end up in a window that "
        "steps.",
        "error": "Your code raised an error: read its last line, fix it, and run the cell again.",
    },
    default_hint=(
        "The loop's arithmetic is already right for full windows; what differs from the large batch is how "
        "the BatchNorm layers compute their output for a micro-batch."
    ),
)
