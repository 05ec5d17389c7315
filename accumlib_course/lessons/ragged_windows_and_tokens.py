"""Lesson 3: ragged windows and token counts. When k does not divide the data, and items are tokens.

The Stack Overflow question in the seeds: 110 samples, micro-batch 8, accumulation 4.
That is 14 micro-batches (13 of 8 and a last one of 6), so three full windows of 32
samples and a tail window of 2 micro-batches holding 14 samples. Four ways to handle it (the thread's
three loops are ported once, in ``accumlib_course.gallery``, and imported here):

- ``step_every_k``: the PyTorch-docs loop from the question, ``(i + 1) % k``: the tail never steps;
- ``step_at_end``: the question's fix, ``or (i + 1) == len(data)``: the tail steps, still divided by k;
- ``divide_by_window_batches``: the accepted answer, ``loss / (nbi - bi)``: right for the number of
  micro-batches, wrong for a smaller last micro-batch (the comment under the answer);
- ``accumlib.ragged``: every item weighs 1 / (items in its window), the exact loop.

The same mistake in token form, the mean of per-micro-batch means instead of the mean over
all tokens, is the gradient-accumulation bug fixed in the Hugging Face Transformers Trainer in 2024.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import get_task, ragged
from accumlib.checks import check_int, resolve_device
from accumlib.data import N_DIGITS, digits_subset
from accumlib.harness import trace_loop
from accumlib.text import Table, fmt_error
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from ..gallery import divide_by_window_batches, step_at_end, step_every_k
from ._exercise import Exercise
from ._explorer import Explorer
from ._ragged_windows_and_tokens_counts import LM_TASK, TokenResult, TokenWindow, compute_tokens, plot_tokens  # noqa: F401 (the notebook and tests read them here)

TASK = "mlp-digits"


STRATEGIES: dict[str, Callable[..., Any]] = {
    "drop the tail: (i + 1) % k": step_every_k,
    "step the tail, loss / k": step_at_end,
    "loss / micro-batches in window": divide_by_window_batches,
    "exact: accumlib.ragged": ragged,
}


@dataclass(frozen=True)
class Strategy:
    """One loop on one epoch: what reached an optimizer step and how each step compares with the oracle."""

    name: str
    steps: int
    expected_steps: int
    items_stepped: int
    items: int
    rel_error: tuple[float, ...]
    norm_ratio: tuple[float, ...]
    window_items: tuple[int, ...]

    @property
    def worst(self) -> float:
        return max(self.rel_error) if self.rel_error else math.nan


@dataclass(frozen=True)
class WindowsResult:
    n: int
    batch_size: int
    accum_steps: int
    micro_batches: int
    strategies: dict[str, Strategy]

    def rows(self) -> list[tuple[Any, ...]]:
        """(strategy, steps taken/expected, samples stepped/all, tail-step rel error, worst rel error),
        rounded.
        """
        out = []
        for s in self.strategies.values():
            full_tail = s.steps == s.expected_steps
            tail = fmt_error(s.rel_error[-1]) if full_tail else "never steps"
            out.append(
                (
                    s.name,
                    f"{s.steps}/{s.expected_steps}",
                    f"{s.items_stepped}/{s.items}",
                    tail,
                    fmt_error(s.worst),
                )
            )
        return out

    def table(self) -> Table:
        return Table(
            (
                "strategy",
                "steps taken/expected",
                "samples stepped",
                "tail step: rel. error",
                "worst rel. error",
            ),
            self.rows(),
            caption=f"{self.n} samples, micro-batch {self.batch_size}, k = {self.accum_steps}: "
            f"{self.micro_batches} micro-batches",
        )


@functools.lru_cache(maxsize=1024)
def _strategy(name: str, n: int, batch_size: int, accum_steps: int, seed: int, device: str) -> Strategy:
    """One strategy for one epoch, every step against the oracle; cached, so a widget revisits settings for
    free.
    """
    task = dataclasses.replace(
        get_task(TASK),
        make_dataset=functools.partial(digits_subset, n, seed),
        batch_size=batch_size,
        accum_steps=accum_steps,
    )
    trace = trace_loop(STRATEGIES[name], task, seed=seed, device=torch.device(device))
    micro = math.ceil(n / batch_size)
    return Strategy(
        name,
        len(trace.comparisons),
        math.ceil(micro / accum_steps),
        sum(trace.window_items),
        trace.n_items,
        tuple(c.rel_error for c in trace.comparisons),
        tuple(c.norm_ratio for c in trace.comparisons),
        tuple(trace.window_items),
    )


def compute(
    accum_steps: int = 4, batch_size: int = 8, *, n: int = 110, seed: int = 0, device: Any = "auto"
) -> WindowsResult:
    """Each strategy for one epoch over the first ``n`` digits, every step compared with the oracle.

    >>> compute(accum_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer >= 1 (got 0)
    """
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    batch_size = check_int("batch_size", batch_size, low=1)
    n = check_int("n", n, low=1, high=N_DIGITS, why="the number of digits to train on")
    seed = check_int("seed", seed, low=0)
    dev = str(resolve_device(device))
    out = {name: _strategy(name, n, batch_size, accum_steps, seed, dev) for name in STRATEGIES}
    return WindowsResult(n, batch_size, accum_steps, math.ceil(n / batch_size), out)


ROLES = ("other", "buggy", "alternative", "correct")  # one look per strategy, in the order of STRATEGIES


@_style.styled
def plot(result: WindowsResult) -> Figure:
    """Top: relative error of every optimizer step per strategy. Bottom: samples that reached a step.

    Strategies are named on the bottom panel's axis and in the top panel's legend (above the bars),
    in one colour, hatch and order each; a strategy that never stepped the last window says so
    in a vertical label at that step.
    """
    fig, (ax, bx) = _style.figure(
        1,
        2,
        width=10,
        height=8.4,
        title=(
            f"{result.n} samples in micro-batches of {result.batch_size}, k = {result.accum_steps}: "
            "which strategy gets the last, partial window right?"
        ),
    )
    names = list(result.strategies)
    n_steps = max(s.expected_steps for s in result.strategies.values())
    width = 0.8 / len(names)
    offset = (len(names) - 1) / 2
    floor = 1e-8  # float32 rounding shows as a short bar instead of vanishing on the log axis
    for j, (s, role) in enumerate(zip(result.strategies.values(), ROLES)):
        xs = [t + (j - offset) * width for t in range(len(s.rel_error))]
        color = _style.ROLE[role]["color"]
        ax.bar(
            xs,
            [max(e, floor) for e in s.rel_error],
            width,
            color=color,
            hatch=_style.HATCH[role],
            edgecolor=_style.BLACK,
            lw=0.5,
            label=s.name,
        )
        if s.steps < s.expected_steps:
            ax.text(
                n_steps - 1 + (j - offset) * width,
                floor * 2,
                "no step",
                ha="center",
                va="bottom",
                color=color,
                fontweight="bold",
                rotation=90,
            )
    ax.set_yscale("log")
    ax.set_ylim(floor, 1e6)  # room above the bars for the legend
    ax.set_yticks([1e-7, 1e-5, 1e-3, 1e-1, 1e1])
    ax.axhline(FLOAT32_RTOL, color=_style.BLACK, ls=":", lw=1, label="float32 rounding bound")
    ax.set_xticks(
        range(n_steps), [f"{t + 1}" + (" (partial)" if t == n_steps - 1 else "") for t in range(n_steps)]
    )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("relative error\nvs large batch")
    ax.set_title("Gradient error at each optimizer step")
    ax.legend(loc="upper left", ncols=2, fontsize=_style.MIN_FONT_PT, columnspacing=1.0)
    stepped = [s.items_stepped for s in result.strategies.values()]
    for i, (value, role) in enumerate(zip(stepped, ROLES)):
        bx.barh(
            i,
            value,
            color=_style.ROLE[role]["color"],
            hatch=_style.HATCH[role],
            edgecolor=_style.BLACK,
            lw=0.5,
        )
        bx.text(value, i, f" {value}", va="center")
    bx.set_yticks(range(len(names)), names)
    bx.axvline(result.n, color=_style.BLACK, lw=1, ls=":")
    bx.set_xlim(0, result.n * 1.2)
    bx.invert_yaxis()
    bx.set_xlabel(f"samples that reached an optimizer step (of {result.n}, dotted line)")
    bx.set_title("Samples used per epoch")
    return fig


def widget(
    accum_steps: int = 4,
    batch_size: int = 8,
    n: int = 110,
    *,
    device: Any = "auto",
    initial: WindowsResult | None = None,
) -> Explorer:
    """Sliders for dataset size, micro-batch size and k; re-runs ``compute`` (cached per strategy) and
    ``plot``.

    ``initial``: the notebook's ``compute(4, 8, n=110)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    check_int("accum_steps", accum_steps, low=1, high=8)
    check_int("batch_size", batch_size, low=1, high=32)
    check_int("n", n, low=8, high=400)
    return Explorer(
        lambda n, batch_size, accum_steps: compute(accum_steps, batch_size, n=n, device=device),
        plot,
        initial=initial,
        n=w.IntSlider(value=n, min=8, max=400, description="samples"),
        batch_size=w.IntSlider(value=batch_size, min=1, max=32, description="micro-batch"),
        accum_steps=w.IntSlider(value=accum_steps, min=1, max=8, description="k"),
    )


# --- the exercise: weigh every item of the partial window ---------------------------------------------


def exercise_dataset(seed: int = 0) -> Any:
    """The question's 110 samples."""
    return digits_subset(110, seed)


EXERCISE = Exercise(
    "03-weigh-every-item",
    "Step the partial window with every sample weighed 1 / (samples in its window)",
    accum_steps=4,
    batch_size=8,
    make_dataset=exercise_dataset,
    call="ragged_windows.EXERCISE",
    hints={
        "tail-misscaled": (
            "The full windows are right; the last window holds 2 micro-batches (8 and 6 samples), not k = "
            "4, yet each of its losses is still divided as if the window were full, so its step is about "
            "half as long as it should be.",
            "What should each sample of a window weigh, and how many samples does each window hold? The "
            "loader can tell you the micro-batch sizes before training starts.",
            "Collect sizes = [len(y) for _, y in loader] first; for micro-batch i, n_window = sum(sizes[i - "
            "i % k:i - i % k + k]); backward F.cross_entropy(model(x), y, reduction='sum') / n_window.",
        ),
        "mean-of-means": (
            "The window's micro-batches hold different numbers of samples (8 and 6), and your loop weighs "
            "each micro-batch's mean equally, so the 6 samples count more than the 8.",
            "Weigh samples, not micro-batches: a sum of item losses divided by the window's sample count "
            "weighs each sample the same, whatever micro-batch it sits in.",
            "Use reduction='sum' and divide by the number of samples in the whole window (32, or 14 for the "
            "tail).",
        ),
        "tail-dropped": (
            "Some samples never reached an optimizer step: the last, partial window is never stepped.",
            "(i + 1) % k == 0 never holds for the last micro-batch when k does not divide the count.",
            "Step also at the last micro-batch of the loader: if (i + 1) % k == 0 or i + 1 == len(loader).",
        ),
        "misscaled@last": (
            "Only the last step is off, by the factor c shown: the full windows are right, the tail's "
            "divisor is not.",
            "The tail holds 14 samples (8 + 6), not 16 and not 32: what does your loop divide the tail's "
            "losses by?",
            "Divide each tail micro-batch's summed loss by the tail's own sample count, sum(sizes[12:14]) = "
            "14.",
        ),
        "misscaled": (
            "Every step the verdict names is off by one factor c: the division is there, but by the wrong "
            "number.",
            "A window's summed item losses should be divided by the number of samples in that window, once.",
            "backward F.cross_entropy(..., reduction='sum') / n_window, n_window the samples of the "
            "micro-batch's window.",
        ),
        "late-step": (
            "Your loop waited for more micro-batches than k = 4 before stepping: each step averaged more "
            "micro-batches than the exercise's k, so the windows are larger than asked, and the short last "
            "window this exercise is about never appears.",
            "Check the k your loop uses, and where optimizer.step() sits: every k-th micro-batch and the "
            "loader's last, or less often (a larger k, once per epoch)?",
            "Use k = 4 and step when (i + 1) % k == 0 or i + 1 == len(loader), each window's samples divided "
            "by that window's own sample count.",
        ),
        "early-step": (
            "The optimizer stepped before a full window of k micro-batches (other than the last one) was in "
            ".grad.",
            "Only a window's k-th micro-batch, or the loader's last, may step.",
            "if (i + 1) % k == 0 or i + 1 == len(loader): step and zero.",
        ),
        "unscaled-sum": (
            "Each step is the sum of its micro-batch gradients: the losses are not divided.",
            "Each sample of a window should weigh 1 / (samples in its window).",
            "backward F.cross_entropy(..., reduction='sum') / n_window.",
        ),
        "error": "Your code raised an error: read its last line, fix it, and run the cell again.",
    },
)


__all__ = [
    "EXERCISE",
    "STRATEGIES",
    "Strategy",
    "TokenResult",
    "TokenWindow",
    "WindowsResult",
    "compute",
    "compute_tokens",
    "divide_by_window_batches",
    "exercise_dataset",
    "plot",
    "plot_tokens",
    "step_at_end",
    "step_every_k",
    "widget",
]
