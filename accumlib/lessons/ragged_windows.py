"""Lesson 3: ragged windows and token counts. When k does not divide the data, and items are tokens.

The Stack Overflow question in the seeds: 110 samples, micro-batch 8, accumulation 4.
That is 14 micro-batches (13 of 8 and a last one of 6), so three full windows of 32
samples and a tail window of 2 micro-batches holding 14 samples. Four ways to handle it (the thread's
three loops are ported once, in ``accumlib.gallery``, and imported here):

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

from .. import count_tokens, get_task, normalized, ragged, resolve_device, trace_loop
from .._batch import to_device
from ..gallery import divide_by_window_batches, step_at_end, step_every_k
from ._explorer import Explorer
from .why import digits_subset, fmt_error
from ..tolerances import FLOAT32_RTOL

TASK = "mlp-digits"
LM_TASK = "lm-tokens"


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
        """(strategy, steps taken/expected, samples stepped/all, tail-step rel error, worst rel error), rounded."""
        out = []
        for s in self.strategies.values():
            full_tail = s.steps == s.expected_steps
            tail = fmt_error(s.rel_error[-1]) if full_tail else "never steps"
            out.append((s.name, f"{s.steps}/{s.expected_steps}", f"{s.items_stepped}/{s.items}", tail, fmt_error(s.worst)))
        return out


def compute(n: int = 110, batch_size: int = 8, accum_steps: int = 4, *, seed: int = 0, device: Any = "auto") -> WindowsResult:
    """Each strategy for one epoch over the first ``n`` digits, every step compared with the oracle."""
    dev = resolve_device(device)
    task = dataclasses.replace(
        get_task(TASK), make_dataset=functools.partial(digits_subset, n, seed), batch_size=batch_size, accum_steps=accum_steps
    )
    micro = math.ceil(n / batch_size)
    out = {}
    for name, loop in STRATEGIES.items():
        trace = trace_loop(loop, task, seed=seed, device=dev)
        out[name] = Strategy(
            name, len(trace.comparisons), math.ceil(micro / accum_steps), sum(trace.window_items), trace.n_items,
            tuple(c.rel_error for c in trace.comparisons), tuple(c.norm_ratio for c in trace.comparisons), tuple(trace.window_items),
        )
    return WindowsResult(n, batch_size, accum_steps, micro, out)


def plot(result: WindowsResult) -> Figure:
    """Left: relative error of every optimizer step per strategy. Right: samples that reached a step."""
    fig = Figure(figsize=(11, 3.8))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.7, 1]})
    colors = ["tab:gray", "tab:orange", "tab:purple", "tab:green"]
    n_steps = max(s.expected_steps for s in result.strategies.values())
    width = 0.8 / len(result.strategies)
    floor = 1e-8  # float32 rounding shows as a short bar instead of vanishing on the log axis
    for j, (s, color) in enumerate(zip(result.strategies.values(), colors)):
        xs = [t + (j - 1.5) * width for t in range(len(s.rel_error))]
        ax.bar(xs, [max(e, floor) for e in s.rel_error], width, color=color, label=s.name)
        if s.steps < s.expected_steps:
            ax.text(n_steps - 1 + (j - 1.5) * width, floor * 3, "x", ha="center", color=color, fontsize=12, fontweight="bold")
    ax.set_yscale("log")
    ax.set_ylim(floor, 10)
    ax.axhline(FLOAT32_RTOL, color="black", ls=":", lw=1)
    ax.set_xticks(range(n_steps), [f"step {t + 1}" for t in range(n_steps)])
    ax.set_ylabel("relative error vs large batch (log)")
    ax.set_title(f"{result.n} samples, batch {result.batch_size}, k = {result.accum_steps} (x: no step)")
    ax.legend(fontsize=7, loc="upper left")
    names = list(result.strategies)
    bx.barh(names, [s.items_stepped for s in result.strategies.values()], color=colors)
    bx.axvline(result.n, color="black", lw=1)
    bx.invert_yaxis()
    bx.set_xlabel("samples that reached an optimizer step")
    bx.set_title(f"of {result.n}")
    bx.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    return fig


def widget(device: Any = "auto", initial: WindowsResult | None = None) -> Explorer:
    """Sliders for dataset size, micro-batch size and k; re-runs ``compute`` and ``plot``.

    ``initial``: the notebook's ``compute(110, 8, 4)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    return Explorer(
        lambda n, batch_size, accum_steps: compute(n, batch_size, accum_steps, device=device),
        plot,
        initial=initial,
        n=w.IntSlider(value=110, min=8, max=400, description="samples"),
        batch_size=w.IntSlider(value=8, min=1, max=32, description="micro-batch"),
        accum_steps=w.IntSlider(value=4, min=1, max=8, description="k"),
    )


# --- token counts: the mean of per-micro-batch means ---------------------------------------------------


@dataclass(frozen=True)
class TokenWindow:
    tokens: tuple[int, ...]  # non-padding target tokens per micro-batch
    mean_of_means: float  # what loss.mean() / k per micro-batch adds up to
    token_mean: float  # the true loss of the window: the mean over all its tokens


@dataclass(frozen=True)
class TokenResult:
    accum_steps: int
    batch_size: int
    windows: tuple[TokenWindow, ...]
    rel_error: dict[str, tuple[float, ...]]  # per optimizer step, per loop

    def rows(self) -> list[tuple[Any, ...]]:
        """(window, tokens per micro-batch, mean of means, token mean, normalized rel err, ragged rel err), rounded."""
        a, b = self.rel_error.values()
        return [
            (i + 1, " ".join(map(str, w.tokens)), round(w.mean_of_means, 4), round(w.token_mean, 4), fmt_error(a[i]), fmt_error(b[i]))
            for i, w in enumerate(self.windows)
        ]


def compute_tokens(accum_steps: int = 4, batch_size: int = 4, *, seed: int = 0, device: Any = "auto") -> TokenResult:
    """The tiny LM's windows at its initial parameters, and ``normalized`` vs ``ragged`` for one epoch.

    Sequences of 4 to 40 tokens make the micro-batches' token counts differ, so a mean of
    per-micro-batch means weighs a token in a short micro-batch more than one in a long one.
    """
    dev = resolve_device(device)
    task = dataclasses.replace(get_task(LM_TASK), batch_size=batch_size, accum_steps=accum_steps)
    model = task.make_model(seed).to(dev)
    batches = list(task.loader())
    windows = []
    with torch.no_grad():
        for start in range(0, len(batches), accum_steps):
            window = batches[start : start + accum_steps]
            losses = [task.item_losses(model, to_device(b, dev)) for b in window]
            means = [float(l.mean()) for l in losses]
            windows.append(TokenWindow(
                tuple(count_tokens(b) for b in window), sum(means) / len(means), float(torch.cat(losses).mean()),
            ))
    rel = {}
    for name, loop in (("loss / k (accumlib.normalized)", normalized), ("per token (accumlib.ragged)", ragged)):
        trace = trace_loop(loop, task, seed=seed, device=dev)
        rel[name] = tuple(c.rel_error for c in trace.comparisons)
    return TokenResult(accum_steps, batch_size, tuple(windows), rel)


def plot_tokens(result: TokenResult) -> Figure:
    """Left: per window, the mean of means vs the token mean. Right: gradient error per step, both loops."""
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2)
    idx = range(1, len(result.windows) + 1)
    ax.plot(idx, [w.token_mean for w in result.windows], "o-", color="tab:green", label="true: mean over all tokens")
    ax.plot(idx, [w.mean_of_means for w in result.windows], "s--", color="tab:red", label="mean of micro-batch means")
    ax.set_xlabel("window")
    ax.set_xticks(list(idx))
    ax.set_ylabel("loss at the initial parameters")
    ax.set_title(f"tiny LM, k = {result.accum_steps}, {result.batch_size} sequences per micro-batch")
    ax.legend(fontsize=8)
    for (name, errs), color, style in zip(result.rel_error.items(), ("tab:red", "tab:green"), ("s--", "o-")):
        bx.plot(range(1, len(errs) + 1), [max(e, 1e-8) for e in errs], style, color=color, label=name)
    bx.set_yscale("log")
    bx.set_ylim(1e-8, 10)
    bx.axhline(FLOAT32_RTOL, color="black", ls=":", lw=1)
    bx.set_xlabel("optimizer step")
    bx.set_xticks(list(idx))
    bx.set_ylabel("relative error vs large batch (log)")
    bx.set_title("gradient at optimizer.step()")
    bx.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- the exercise: what should each micro-batch be divided by? ---------------------------------------


def exercise_loop(divide_by: str, accum_steps: int = 4) -> Callable[..., None]:
    """The accepted answer's shape with a choice of divisor: ``"k"``, ``"batches"`` (in the window) or ``"items"``.

    Returns ``train_fn(model, optimizer, loader)`` for ``accumlib.verify``.
    """
    if divide_by not in ("k", "batches", "items"):
        raise ValueError(f"divide_by must be 'k', 'batches' or 'items' (got {divide_by!r})")

    def train_fn(model, optimizer, loader):
        device = next(model.parameters()).device
        batches = list(loader)
        for start in range(0, len(batches), accum_steps):
            window = batches[start : start + accum_steps]
            n_items = sum(len(y) for _, y in window)
            for x, y in window:
                loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device), reduction="sum")
                divisor = {"k": accum_steps * len(y), "batches": len(window) * len(y), "items": n_items}[divide_by]
                (loss / divisor).backward()
            optimizer.step()
            optimizer.zero_grad()

    return train_fn


def exercise_dataset(seed: int = 0) -> Any:
    """The question's 110 samples."""
    return digits_subset(110, seed)


__all__ = [
    "STRATEGIES", "Strategy", "TokenResult", "TokenWindow", "WindowsResult", "compute", "compute_tokens",
    "divide_by_window_batches", "exercise_dataset", "exercise_loop", "plot", "plot_tokens", "step_at_end", "step_every_k",
    "widget",
]
