"""Lesson 1: why accumulate. Memory per micro-batch, and k micro-batches == one large batch.

Autograd keeps a micro-batch's activations until its backward; accumulation runs k
micro-batches of b items one after the other, so the activations alive at once are
those of b items, not of the k * b items the optimizer step averages over. The step
is the same because the gradient is linear in the items:

    grad (1/N) sum_i l_i  ==  sum_j grad( mean_{i in b_j} l_i / k )      (k equal micro-batches)

``compute`` measures both on digits; ``train`` repeats the MindSpore tutorial's
experiment (batch 64 vs 2 x 32 accumulated) on scikit-learn's offline digits.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader, Subset

from .. import (
    activation_bytes, classification_losses, digits, get_task, large_batch, naive, normalized, resolve_device,
    trace_loop,
)
from ..tolerances import FLOAT32_RTOL
from ._explorer import Explorer

TASK = "mlp-digits"
N_TRAIN = 1280  # 20 windows of 64: no partial window, so batch 64 and 2 x 32 see identical windows


@functools.lru_cache(maxsize=4)
def _all_digits(seed: int) -> Any:
    return digits(seed=seed)


def digits_subset(n: int | None = None, seed: int = 0) -> Any:
    """``accumlib.digits(n, seed=seed)`` (the same items in the same order), read from disk once per seed."""
    data = _all_digits(seed)
    if n is None:
        return data
    if not 1 <= n <= len(data):
        raise ValueError(f"n must be between 1 and {len(data)} for digits (got {n})")
    return Subset(data, range(n))


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A fixed-width text table: what the lessons print, so nbval compares plain text.

    >>> print(table(("k", "ratio"), [(1, 1.0), (16, 16.0)]))
    k   ratio
    --  -----
    1   1.0
    16  16.0
    """
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), line(tuple("-" * w for w in widths))] + [line(r) for r in cells[1:]])


def fmt_error(rel_error: float) -> str:
    """A relative error as printed in the lessons: float32 rounding shows as a bound, stable across machines.

    >>> fmt_error(3e-8), fmt_error(0.51296)
    ('<= 1e-04 (float32 rounding)', '0.513')
    """
    if rel_error <= FLOAT32_RTOL:
        return f"<= {FLOAT32_RTOL:.0e} (float32 rounding)"
    return f"{rel_error:.3g}"


# --- memory and the one-window proof -----------------------------------------------------------


@dataclass(frozen=True)
class WhyResult:
    """Activation bytes and the gradient of one window, accumulated vs the large batch.

    ``large_bytes[i]``: activations of one forward over ``ks[i] * micro_batch_size`` items;
    ``micro_bytes``: activations of one micro-batch, all that accumulation holds at once.
    """

    accum_steps: int
    micro_batch_size: int
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
            (k, k * self.micro_batch_size, round(self.large_bytes[k - 1] / 1024, 1), round(self.micro_bytes / 1024, 1),
             round(self.large_bytes[k - 1] / self.micro_bytes, 2))
            for k in ks if k <= len(self.ks)
        ]

    def rows(self) -> list[tuple[str, str, float]]:
        """(loop, relative error vs the large batch, norm ratio), rounded for printing."""
        return [(name, fmt_error(self.rel_error[name]), round(self.norm_ratio[name], 3)) for name in self.rel_error]


def compute(accum_steps: int = 2, micro_batch_size: int = 32, *, max_k: int = 16, seed: int = 0, device: Any = "auto") -> WhyResult:
    """Measure activation memory for k = 1..``max_k`` and check one window of ``accum_steps`` micro-batches.

    The window is the first ``accum_steps * micro_batch_size`` digits; each loop's gradient at
    ``optimizer.step()`` is compared with the oracle (``accumlib.trace_loop``).
    """
    if accum_steps > max_k:
        raise ValueError(f"accum_steps must be <= max_k={max_k} (got {accum_steps})")
    dev = resolve_device(device)
    base = get_task(TASK)
    model = base.make_model(seed).to(dev)
    x, y = digits_subset(seed=seed)[: max_k * micro_batch_size]
    ks = tuple(range(1, max_k + 1))
    large = tuple(activation_bytes(model, (x[: k * micro_batch_size], y[: k * micro_batch_size]), base.item_losses, dev) for k in ks)
    micro = activation_bytes(model, (x[:micro_batch_size], y[:micro_batch_size]), base.item_losses, dev)

    n = accum_steps * micro_batch_size
    task = dataclasses.replace(
        base, make_dataset=functools.partial(digits_subset, n, seed), batch_size=micro_batch_size, accum_steps=accum_steps
    )
    rel, ratio = {}, {}
    for name, loop in [("accumulated, loss / k (accumlib.normalized)", normalized), ("accumulated, not divided (accumlib.naive)", naive)]:
        trace = trace_loop(loop, task, seed=seed, device=dev)
        assert len(trace.comparisons) == 1  # exactly one window of k micro-batches
        rel[name], ratio[name] = trace.comparisons[0].rel_error, trace.comparisons[0].norm_ratio
    return WhyResult(accum_steps, micro_batch_size, ks, large, micro, rel, ratio)


def plot(result: WhyResult) -> Figure:
    """Left: activation memory vs k. Right: the window's gradient vs the large batch's."""
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    kib = lambda b: b / 1024  # noqa: E731
    ax.plot(result.ks, [kib(b) for b in result.large_bytes], "o-", color="tab:red", label="one large batch of k x b")
    ax.plot(result.ks, [kib(result.micro_bytes)] * len(result.ks), "o-", color="tab:green", label="k micro-batches of b, accumulated")
    ax.axvline(result.accum_steps, color="gray", ls="--", lw=1)
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("activation memory (KiB)")
    ax.set_title(f"activations saved for backward, b = {result.micro_batch_size}")
    ax.legend(fontsize=8)
    names = list(result.norm_ratio)
    bars = bx.bar(["loss / k", "not divided"], [result.norm_ratio[n] for n in names], color=["tab:green", "tab:red"])
    bx.axhline(1.0, color="black", lw=1)
    for bar, n in zip(bars, names):
        bx.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{result.norm_ratio[n]:.2f}", ha="center", va="bottom")
    bx.set_ylabel("|accumulated grad| / |large-batch grad|")
    bx.set_title(f"one window, k = {result.accum_steps}")
    fig.tight_layout()
    return fig


def widget(device: Any = "auto", initial: WhyResult | None = None) -> Explorer:
    """Sliders for k and the micro-batch size; each change re-runs ``compute`` and ``plot``.

    ``initial``: the notebook's ``compute(2, 32)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    return Explorer(
        lambda accum_steps, micro_batch_size: compute(accum_steps, micro_batch_size, device=device),
        plot,
        initial=initial,
        accum_steps=w.IntSlider(value=2, min=1, max=16, description="k"),
        micro_batch_size=w.IntSlider(value=32, min=1, max=64, description="micro-batch"),
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
    batch_size: int
    accum_steps: int
    lr: float
    epochs: int
    runs: dict[str, Run]

    def max_curve_gap(self, a: str, b: str) -> float:
        """Largest |difference| between two runs' logged losses, step by step."""
        return max(abs(u - v) for u, v in zip(self.runs[a].loss_per_step, self.runs[b].loss_per_step))

    def rows(self) -> list[tuple[str, int, float, float]]:
        """(run, optimizer steps, final test accuracy %, final test loss), rounded for printing."""
        return [
            (r.name, len(r.loss_per_step), round(100 * r.test_accuracy[-1], 1), round(r.test_loss[-1], 3))
            for r in self.runs.values()
        ]


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        losses = classification_losses(model, (x, y))
        correct = (model(x).argmax(1) == y).float().mean()
    return float(correct), float(losses.mean())


def train(
    batch_size: int = 64, accum_steps: int = 2, *, lr: float = 0.1, epochs: int = 3, seed: int = 0, device: Any = "auto"
) -> TrainResult:
    """The MindSpore tutorial's experiment on digits: SGD, ``epochs`` epochs, four runs from one initial model.

    - ``batch B``: plain training, one step per batch of ``batch_size`` (``accumlib.large_batch``, k = 1);
    - ``k x B/k accumulated (loss / k)``: ``accumlib.normalized``, the tutorial's ``loss / accumulate_step``;
    - ``k x B/k naive``: ``accumlib.naive``, the loss never divided;
    - ``batch B, lr x k``: plain training at k times the learning rate, what naive really does.

    Every run shuffles with the same seeded order per epoch, so batch B holds exactly the
    items of the k micro-batches that replace it.
    """
    if batch_size % accum_steps:
        raise ValueError(f"batch_size must be divisible by accum_steps (got batch_size={batch_size}, accum_steps={accum_steps})")
    dev = resolve_device(device)
    data = digits_subset(seed=seed)
    train_set, test_set = Subset(data, range(N_TRAIN)), Subset(data, range(N_TRAIN, len(data)))
    x_test, y_test = (t.to(dev) for t in data[N_TRAIN:])
    micro = batch_size // accum_steps
    k = accum_steps
    plans = [
        (f"batch {batch_size}", large_batch, batch_size, 1, lr),
        (f"{k} x {micro} accumulated (loss / k)", normalized, micro, k, lr),
        (f"{k} x {micro} naive (not divided)", naive, micro, k, lr),
        (f"batch {batch_size}, lr x {k}", large_batch, batch_size, 1, lr * k),
    ]
    runs = {}
    for name, loop, b, steps, rate in plans:
        model = get_task(TASK).make_model(seed).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=rate)
        curve, acc, tl = [], [], []
        for epoch in range(epochs):
            order = torch.Generator().manual_seed(seed * 1000 + epoch)  # one shuffle per epoch, shared by every run
            loader = DataLoader(train_set, batch_size=b, shuffle=True, generator=order)
            curve += loop(model, opt, loader, classification_losses, accum_steps=steps, device=dev)
            a, l = _evaluate(model, x_test, y_test)
            acc.append(a)
            tl.append(l)
        runs[name] = Run(name, tuple(curve), tuple(acc), tuple(tl))
    assert len(test_set) == len(y_test)
    return TrainResult(batch_size, accum_steps, lr, epochs, runs)


def plot_training(result: TrainResult) -> Figure:
    """Loss per optimizer step of every run, and test accuracy after each epoch."""
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    styles = [("tab:blue", "-", 3.5), ("tab:orange", "--", 1.5), ("tab:red", "-", 1.2), ("tab:gray", ":", 2.0)]
    for (color, ls, lw), run in zip(styles, result.runs.values()):
        ax.plot(range(1, len(run.loss_per_step) + 1), run.loss_per_step, ls, color=color, lw=lw, label=run.name)
        bx.plot(range(1, result.epochs + 1), [100 * a for a in run.test_accuracy], "o" + ls, color=color, lw=lw, label=run.name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss of the step's window")
    ax.set_title(f"SGD lr={result.lr:g} on digits ({N_TRAIN} train)")
    ax.legend(fontsize=8)
    bx.set_xlabel("epoch")
    bx.set_ylabel("test accuracy (%)")
    bx.set_xticks(range(1, result.epochs + 1))
    bx.set_title("held-out digits")
    fig.tight_layout()
    return fig


def training_widget(device: Any = "auto", initial: TrainResult | None = None) -> Explorer:
    """k and the learning rate for the batch-64 experiment; re-runs ``train`` and ``plot_training``.

    ``initial``: the notebook's ``train(64, 2, lr=0.1)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    return Explorer(
        lambda accum_steps, lr: train(64, accum_steps, lr=lr, device=device),
        plot_training,
        initial=initial,
        accum_steps=w.Dropdown(options=[1, 2, 4, 8], value=2, description="k"),
        lr=w.FloatLogSlider(value=0.1, base=10, min=-2, max=0, step=0.25, description="lr"),
    )


# --- the seed loops of the gallery ----------------------------------------------------------------


def gallery_rows(names: list[str]) -> list[tuple[str, str, str, bool]]:
    """Verify ``accumlib.GALLERY[name]`` on its own dataset: (name, what it is, codes found, codes as expected)."""
    from .. import GALLERY

    rows = []
    for name in names:
        entry = GALLERY[name]
        codes = sorted(entry.run().codes)
        rows.append((name, entry.source_note, ", ".join(codes) or "none (ok)", set(codes) == set(entry.expected_codes)))
    return rows


# --- the exercise --------------------------------------------------------------------------------


def exercise_loop(divide_by: float) -> Any:
    """A user-style loop, the MindSpore tutorial's shape: ``loss / divide_by``, step every k-th micro-batch.

    Returns ``train_fn(model, optimizer, loader)`` for ``accumlib.verify``; the lesson asks
    which ``divide_by`` makes 2 x 32 accumulated match batch 64.
    """
    k = 2

    def train_fn(model, optimizer, loader):
        device = next(model.parameters()).device
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            (loss / divide_by).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()

    return train_fn


def exercise_dataset(seed: int = 0) -> Any:
    """128 digits: 2 windows of 2 x 32, nothing left over."""
    return digits_subset(128, seed)


__all__ = [
    "N_TRAIN", "Run", "TrainResult", "WhyResult", "compute", "exercise_dataset", "exercise_loop", "digits_subset", "fmt_error", "gallery_rows", "plot", "table",
    "plot_training", "train", "training_widget", "widget",
]
