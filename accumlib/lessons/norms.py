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

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from .. import digits, get_task, ragged, resolve_device, trace_loop
from .. import large_batch as large_batch_loop  # the loop; ``large_batch`` below is a batch size
from ..tolerances import FLOAT32_RTOL

NORMS = ("batch", "group")
MOMENTUM = 0.9  # SGD momentum for the training curves: a realistic optimizer, still deterministic


def task_for(norm: str) -> Any:
    """The built-in task: ``cnn-batchnorm`` or ``cnn-groupnorm`` (the same CNN and 128 images)."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS} (got {norm!r})")
    return get_task(f"cnn-{norm}norm")


@dataclass
class ErrorVsK:
    """Worst relative gradient error vs the large batch over one epoch, per norm and k."""

    large_batch: int
    ks: list[int]
    errors: dict[str, list[float]]

    def micro_batch(self, k: int) -> int:
        return self.large_batch // k


def error_vs_k(
    ks: tuple[int, ...] = (1, 2, 4, 8, 16), large_batch: int = 32, device: str | torch.device = "auto", n_images: int = 64
) -> ErrorVsK:
    """Split a large batch of ``large_batch`` images into k micro-batches; trace ``ragged`` against the oracle.

    The large batch stays the same, only the split changes, so k = 1 is the large batch
    itself and every error is the price of splitting it. One epoch over the first
    ``n_images`` digits of the task (64: two large batches of 32, enough to see the trend).
    """
    dev = resolve_device(device)
    ks = [k for k in ks if large_batch % k == 0]
    if not ks:
        raise ValueError(f"ks must hold at least one divisor of large_batch={large_batch} (got {ks})")
    errors: dict[str, list[float]] = {}
    for norm in NORMS:
        errors[norm] = []
        for k in ks:
            task = dataclasses.replace(task_for(norm), make_dataset=functools.partial(digits, n_images, image=True))
            tr = trace_loop(ragged, task, accum_steps=k, batch_size=large_batch // k, device=dev)
            errors[norm].append(max(c.rel_error for c in tr.comparisons))
    return ErrorVsK(large_batch, ks, errors)


def plot_error_vs_k(result: ErrorVsK) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for norm, style in zip(NORMS, ("o-", "s-")):
        ax.plot(result.ks, [max(e, 1e-9) for e in result.errors[norm]], style, label=f"{norm} norm")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(result.ks, [f"{k}\n(mb {result.micro_batch(k)})" for k in result.ks])
    ax.axhline(FLOAT32_RTOL, color="gray", ls="--", lw=1)
    ax.text(result.ks[0], 1.3e-4, "float32 tolerance", color="gray", fontsize=8)
    ax.set_xlabel(f"k micro-batches per large batch of {result.large_batch}")
    ax.set_ylabel("worst relative error vs large batch")
    ax.legend()
    fig.tight_layout()
    return fig


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


def running_stats(k: int = 8, large_batch: int = 32, device: str | torch.device = "auto") -> RunningStats:
    """One epoch of ``ragged`` and of ``large_batch`` at lr = 0, so the weights never move.

    Any difference left in ``running_mean``/``running_var`` is then due to the statistics
    alone: k updates per window from micro-batches of ``large_batch // k`` instead of one
    update from the large batch. ``eval_loss`` shows what that does to the model in eval mode.
    """
    dev = resolve_device(device)
    task = task_for("batch")
    models = {}
    for name, loop in (("accumulated", ragged), ("large batch", large_batch_loop)):
        model = task.make_model(0).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights frozen: only the statistics move
        loop(model, opt, task.loader(large_batch // k), task.item_losses, accum_steps=k, device=dev)
        models[name] = model
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


def training_curves(
    k: int = 8, large_batch: int = 32, epochs: int = 3, n: int = 384, lr: float = 0.1, device: str | torch.device = "auto"
) -> Curves:
    """Train the CNN with each norm for ``epochs`` on ``n`` digits, accumulated (``ragged``) vs large batch.

    Both runs see the same images in the same windows; only the split into micro-batches
    differs. Accuracy is measured in eval mode on 512 digits the runs never trained on.
    """
    dev = resolve_device(device)
    if large_batch % k:
        raise ValueError(f"k must divide large_batch={large_batch} (got {k})")
    data = digits(n, image=True)
    held_out = digits(None, image=True).tensors
    x_test, y_test = held_out[0][-512:].to(dev), held_out[1][-512:].to(dev)
    losses, accuracy = {}, {}
    for norm in NORMS:
        task = task_for(norm)
        for name, loop in (("accumulated", ragged), ("large batch", large_batch_loop)):
            torch.manual_seed(0)
            model = task.make_model(0).to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
            logged: list[float] = []
            for _ in range(epochs):
                loader = task.loader(large_batch // k, dataset=data)
                logged += loop(model, opt, loader, task.item_losses, accum_steps=k, device=dev)
            model.eval()
            with torch.no_grad():
                accuracy[(norm, name)] = float((model(x_test).argmax(1) == y_test).float().mean())
            losses[(norm, name)] = logged
    return Curves(k, large_batch // k, losses, accuracy, n, len(y_test), epochs, MOMENTUM)


def plot_curves(curves: Curves) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, norm in zip(axes, NORMS):
        for name, style in (("large batch", "-"), ("accumulated", "--")):
            acc = curves.accuracy[(norm, name)]
            ax.plot(curves.losses[(norm, name)], style, label=f"{name} (eval acc {acc:.2f})")
        ax.set_title(f"{norm} norm: k={curves.k} micro-batches of {curves.micro_batch}")
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("logged window loss")
    fig.tight_layout()
    return fig


def error_explorer(device: str | torch.device = "auto", initial: ErrorVsK | None = None, **settings: Any) -> Any:
    """A slider for the large batch; re-runs ``error_vs_k`` and redraws the error curves.

    ``initial``: a result already computed with the default large batch of 32, shown without recomputing;
    ``settings`` go to ``error_vs_k`` unchanged (e.g. fewer ``ks`` in a test).
    """
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        lambda large_batch: error_vs_k(large_batch=large_batch, device=device, **settings),
        plot_error_vs_k,
        initial=initial,
        large_batch=w.SelectionSlider(options=[16, 32, 64], value=32, description="large batch", continuous_update=False),
    )


def curves_explorer(device: str | torch.device = "auto", initial: Curves | None = None, **settings: Any) -> Any:
    """A slider for k (the large batch stays 32); re-runs ``training_curves``; ``initial``, ``settings`` as above (k = 8)."""
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        lambda k: training_curves(k=k, device=device, **settings),
        plot_curves,
        initial=initial,
        k=w.SelectionSlider(options=[1, 2, 4, 8, 16], value=8, description="k", continuous_update=False),
    )
