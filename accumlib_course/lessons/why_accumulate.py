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

from accumlib import get_task, naive, normalized, resolve_device
from accumlib.checks import check_int
from accumlib.data import N_DIGITS, digits_subset
from accumlib.harness import trace_loop
from accumlib.text import Table, fmt_error
from accumlib_course.memory import activation_bytes

from .. import _style
from ._common import gallery_rows, gallery_table  # noqa: F401 (the notebooks read them here)
from ._exercise import Exercise
from ._explorer import Explorer
from ._why_accumulate_training import (  # noqa: F401 (the notebook reads them here)
    N_TRAIN,
    OPTIMIZERS,
    TASK,
    Run,
    SweepResult,
    TrainResult,
    lr_sweep,
    plot_sweep,
    plot_training,
    train,
    training_widget,
)

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

    def memory_rows(
        self, ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    ) -> list[tuple[int, int, float, float, float]]:
        """(k, items per step, large-batch KiB, accumulated KiB, ratio), rounded for printing."""
        return [
            (
                k,
                k * self.batch_size,
                round(self.large_bytes[k - 1] / 1024, 1),
                round(self.micro_bytes / 1024, 1),
                round(self.large_bytes[k - 1] / self.micro_bytes, 2),
            )
            for k in ks
            if k <= len(self.ks)
        ]

    def memory_table(self) -> Table:
        return Table(
            ("k", "items per step", "large batch KiB", "accumulated KiB", "large / accumulated"),
            self.memory_rows(),
            caption=f"Activation memory of the digits MLP, micro-batches of b = {self.batch_size}",
        )

    def rows(self) -> list[tuple[str, str, float]]:
        """(loop, relative error vs the large batch, norm ratio), rounded for printing."""
        return [
            (name, fmt_error(self.rel_error[name]), round(self.norm_ratio[name], 3))
            for name in self.rel_error
        ]

    def table(self) -> Table:
        return Table(
            ("loop", "relative error vs large batch", "|grad| / |large-batch grad|"),
            self.rows(),
            caption=f"One window of k = {self.accum_steps} micro-batches of {self.batch_size} digits",
        )


def _check_window(accum_steps: Any, batch_size: Any, max_k: Any, seed: Any) -> tuple[int, int, int, int]:
    max_k = check_int("max_k", max_k, low=1, high=N_DIGITS)
    accum_steps = check_int(
        "accum_steps", accum_steps, low=1, high=max_k, why="the memory sweep measures k = 1..max_k"
    )
    batch_size = check_int(
        "batch_size",
        batch_size,
        low=1,
        high=N_DIGITS // max_k,
        why=f"max_k x batch_size digits must exist ({N_DIGITS} in all)",
    )
    return accum_steps, batch_size, max_k, check_int("seed", seed, low=0)


@functools.lru_cache(maxsize=64)
def _memory(batch_size: int, max_k: int, seed: int, device: str) -> tuple[tuple[int, ...], int]:
    """Activation bytes of one forward over k * b digits for k = 1..max_k, and of one micro-batch of b."""
    dev = torch.device(device)
    base = get_task(TASK)
    model = base.make_model(seed).to(dev)
    x, y = digits_subset(seed=seed)[: max_k * batch_size]
    large = tuple(
        activation_bytes(model, (x[: k * batch_size], y[: k * batch_size]), base.item_losses, device=dev)
        for k in range(1, max_k + 1)
    )
    return large, large[0]


@functools.lru_cache(maxsize=256)
def _window(
    accum_steps: int, batch_size: int, seed: int, device: str
) -> tuple[dict[str, float], dict[str, float]]:
    """One window of k micro-batches through each loop, its gradient at the step against the oracle."""
    n = accum_steps * batch_size
    task = dataclasses.replace(
        get_task(TASK),
        make_dataset=functools.partial(digits_subset, n, seed),
        batch_size=batch_size,
        accum_steps=accum_steps,
    )
    rel, ratio = {}, {}
    for name, loop in [(NORMALIZED, normalized), (NAIVE, naive)]:
        trace = trace_loop(loop, task, seed=seed, device=torch.device(device))
        assert len(trace.comparisons) == 1  # exactly one window of k micro-batches
        rel[name], ratio[name] = trace.comparisons[0].rel_error, trace.comparisons[0].norm_ratio
    return rel, ratio


def compute(
    accum_steps: int = 2, batch_size: int = 32, *, max_k: int = 16, seed: int = 0, device: Any = "auto"
) -> WhyResult:
    """Measure activation memory for k = 1..``max_k`` and check one window of ``accum_steps`` micro-batches.

    The window is the first ``accum_steps * batch_size`` digits; each loop's gradient at
    ``optimizer.step()`` is compared with the oracle (``accumlib.harness.trace_loop``). Both parts
    are cached by their arguments, so a widget recomputes only the part a control changes.

    >>> compute(accum_steps=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer between 1 and 16; the memory sweep measures ... (got 0)
    """
    accum_steps, batch_size, max_k, seed = _check_window(accum_steps, batch_size, max_k, seed)
    dev = str(resolve_device(device))
    large, micro = _memory(batch_size, max_k, seed, dev)
    rel, ratio = _window(accum_steps, batch_size, seed, dev)
    return WhyResult(
        accum_steps, batch_size, tuple(range(1, max_k + 1)), large, micro, dict(rel), dict(ratio)
    )


@_style.styled
def plot(result: WhyResult) -> Figure:
    """Left: activation memory vs k. Right: the window's gradient length vs the large batch's."""
    k, b = result.accum_steps, result.batch_size
    fig, (ax, bx) = _style.figure(
        2,
        width=11.5,
        height=4.4,
        title=f"Accumulating k micro-batches of b = {b}: memory of one micro-batch, gradient of the large "
        f"batch",
    )
    kib = [x / 1024 for x in result.large_bytes]
    ax.plot(result.ks, kib, label=f"one large batch of k x {b} items", **_style.ROLE["other"])
    ax.plot(
        result.ks,
        [result.micro_bytes / 1024] * len(result.ks),
        label=f"k micro-batches of {b}, accumulated",
        **_style.ROLE["correct"],
    )
    ax.axvline(k, color=_style.BLACK, ls=":", lw=1)
    ax.annotate(
        f"k = {k}: {result.memory_ratio:.1f} x less",
        (k, result.micro_bytes / 1024),
        xytext=(6, 12),
        textcoords="offset points",
    )
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("activations kept for backward (KiB)")
    ax.set_title("Activation memory grows with the batch,\nnot with k")
    ax.legend(loc="upper left")
    labels = ["loss / k\n(normalized)", "not divided\n(naive)"]
    values = [result.norm_ratio[NORMALIZED], result.norm_ratio[NAIVE]]
    for x, (value, role) in enumerate(zip(values, ("correct", "buggy"))):
        bx.bar(
            x, value, 0.6, color=_style.ROLE[role]["color"], hatch=_style.HATCH[role], edgecolor=_style.BLACK
        )
        bx.text(x, value, f"{value:.2f}", ha="center", va="bottom")
    bx.set_xticks([0, 1], labels)
    bx.axhline(1.0, label="large batch (oracle) = 1", **{**_style.ROLE["oracle"], "lw": 1.5})
    bx.set_ylim(0, max(values) * 1.2)
    bx.set_ylabel("|grad at step| / |large-batch grad|")
    bx.set_title(f"Gradient length at the step, k = {k}:\nnot dividing makes it k times too long")
    bx.legend(loc="upper left")
    return fig


def widget(
    accum_steps: int = 2, batch_size: int = 32, *, device: Any = "auto", initial: WhyResult | None = None
) -> Explorer:
    """Sliders for k and the micro-batch size; each change re-runs ``compute`` (cached parts) and ``plot``.

    ``initial``: the notebook's ``compute(accum_steps, batch_size)`` result, shown first instead of
    recomputing it.
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
    call="why.EXERCISE",
    hints={
        "unscaled-sum": (
            "Every micro-batch's loss is the mean over its 32 digits, and backward() adds its gradient to "
            "what .grad already holds. After k of them, how many times the large batch's mean gradient does "
            ".grad hold?",
            "The large batch weighs each of its 64 digits 1/64; each micro-batch's mean weighs its 32 "
            "digits 1/32. Change one line so that each micro-batch contributes its share: half of its mean.",
            "Call backward on the micro-batch mean divided by k: (loss / k).backward().",
        ),
        "misscaled": (
            "Every step is now too small (or too large) by the one factor c shown above: the division is "
            "there, but by the wrong number.",
            "A mean is already divided by its 32 items. Count how many times your loop divides, and by "
            "what; keep only the division that turns k means into one mean.",
            "Divide the micro-batch mean by k = 2 once, and by nothing else: (loss / k).backward().",
        ),
        "early-step": (
            "The optimizer stepped before the window's k micro-batches were all in .grad.",
            "Which micro-batches should the condition around optimizer.step() let through? Count i from 0.",
            "Step (and zero) only after the k-th backward of a window: if (i + 1) % k == 0.",
        ),
        "late-step": (
            "Your loop waited for more micro-batches than k = 2 before stepping: each step averaged more "
            "micro-batches of 32 than the 2 x 32 = 64 digits the exercise asks for, a larger batch.",
            "Check the k your loop uses, and where optimizer.step() sits: inside the loop, under a condition "
            "that lets every k-th micro-batch through, or after the loop, once per epoch?",
            "Use k = 2 and step (and zero) inside the loop: if (i + 1) % k == 0.",
        ),
        "zero-grad-inside-window": (
            ".grad is emptied between the micro-batches of one window, so only the last one reaches the "
            "step.",
            "optimizer.zero_grad() belongs to the step, not to the micro-batch.",
            "Zero the gradients only right after optimizer.step(), inside the same if.",
        ),
        "no-zero-grad": (
            "Gradients of the previous window are still in .grad when the next window starts.",
            "backward() adds to .grad; only zero_grad empties it. Where does the window begin?",
            "Call optimizer.zero_grad() right after optimizer.step(), once per window.",
        ),
        "frozen-parameter": (
            "Your loop froze parameters of the model (requires_grad=False): the verdict names them.",
            "The large batch trains every parameter; a frozen one never moves, so the accumulated model can "
            "no longer match it, however the loss is divided.",
            "Remove the requires_grad_(False) lines: leave every parameter trainable and only divide the "
            "loss.",
        ),
        "error": "Your code raised an error: read its last line, fix it, and run the cell again.",
    },
)


__all__ = [
    "EXERCISE",
    "N_TRAIN",
    "Run",
    "SweepResult",
    "TrainResult",
    "WhyResult",
    "compute",
    "digits_subset",
    "exercise_dataset",
    "fmt_error",
    "gallery_rows",
    "gallery_table",
    "lr_sweep",
    "plot",
    "plot_sweep",
    "plot_training",
    "train",
    "training_widget",
    "widget",
]
