"""Lesson 3's token counts: micro-batches of sequences with different token counts, where the mean of
per-micro-batch means is not the window's mean (``compute_tokens``, ``plot_tokens``).

A part of ``ragged_windows_and_tokens.py``, which re-exports every name here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import get_task, normalized, ragged
from accumlib.batches import to_device
from accumlib.checks import check_int, resolve_device
from accumlib.data import count_tokens
from accumlib.harness import trace_loop
from accumlib.text import Table, fmt_error
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style

LM_TASK = "lm-tokens"  # sequences of 4 to 40 tokens


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
        """(window, tokens per micro-batch, mean of means, token mean, normalized rel err, ragged rel err),
        rounded.
        """
        a, b = self.rel_error.values()
        return [
            (
                i + 1,
                " ".join(map(str, w.tokens)),
                round(w.mean_of_means, 4),
                round(w.token_mean, 4),
                fmt_error(a[i]),
                fmt_error(b[i]),
            )
            for i, w in enumerate(self.windows)
        ]

    def table(self) -> Table:
        return Table(
            (
                "window",
                "tokens per micro-batch",
                "mean of means",
                "token mean",
                "grad rel. err: loss / k",
                "grad rel. err: per token",
            ),
            self.rows(),
            caption=f"tiny LM, k = {self.accum_steps}, {self.batch_size} sequences per micro-batch",
        )


def compute_tokens(
    accum_steps: int = 4, batch_size: int = 4, *, seed: int = 0, device: Any = "auto"
) -> TokenResult:
    """The tiny LM's windows at its initial parameters, and ``normalized`` vs ``ragged`` for one epoch.

    Sequences of 4 to 40 tokens make the micro-batches' token counts differ, so a mean of
    per-micro-batch means weighs a token in a short micro-batch more than one in a long one.

    >>> compute_tokens(accum_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer >= 1 (got 0)
    """
    n_sequences = len(get_task(LM_TASK).make_dataset())
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    batch_size = check_int(
        "batch_size", batch_size, low=1, high=n_sequences, why=f"the task holds {n_sequences} sequences"
    )
    seed = check_int("seed", seed, low=0)
    dev = resolve_device(device)
    task = dataclasses.replace(get_task(LM_TASK), batch_size=batch_size, accum_steps=accum_steps)
    model = task.make_model(seed).to(dev)
    batches = list(task.loader())
    windows = []
    with torch.no_grad():
        for start in range(0, len(batches), accum_steps):
            window = batches[start : start + accum_steps]
            losses = [task.item_losses(model, to_device(b, dev)) for b in window]
            means = [float(item.mean()) for item in losses]
            windows.append(
                TokenWindow(
                    tuple(count_tokens(b) for b in window),
                    sum(means) / len(means),
                    float(torch.cat(losses).mean()),
                )
            )
    rel = {}
    for name, loop in (
        ("loss / k (accumlib.normalized)", normalized),
        ("per token (accumlib.ragged)", ragged),
    ):
        trace = trace_loop(loop, task, seed=seed, device=dev)
        rel[name] = tuple(c.rel_error for c in trace.comparisons)
    return TokenResult(accum_steps, batch_size, tuple(windows), rel)


@_style.styled
def plot_tokens(result: TokenResult) -> Figure:
    """Left: per window, the mean of means vs the token mean. Right: gradient error per step, both loops."""
    fig, (ax, bx) = _style.figure(
        2,
        width=11.5,
        height=4.4,
        title=(
            f"Tiny LM, k = {result.accum_steps}, {result.batch_size} sequences per micro-batch: "
            "a mean of micro-batch means is not the mean over tokens"
        ),
    )
    idx = range(1, len(result.windows) + 1)
    ax.plot(
        idx,
        [w.token_mean for w in result.windows],
        label="true: mean over all tokens",
        **_style.ROLE["correct"],
    )
    ax.plot(
        idx,
        [w.mean_of_means for w in result.windows],
        label="mean of micro-batch means",
        **_style.ROLE["buggy"],
    )
    ax.set_xlabel("window")
    ax.set_xticks(list(idx))
    ax.set_ylabel("loss at the initial parameters")
    ax.set_title("The window's loss, two ways")
    ax.legend()
    for (name, errs), role in zip(result.rel_error.items(), ("buggy", "correct")):
        bx.plot(range(1, len(errs) + 1), [max(e, 1e-8) for e in errs], label=name, **_style.ROLE[role])
    bx.set_yscale("log")
    bx.set_ylim(1e-8, 10)
    bx.axhline(FLOAT32_RTOL, color=_style.BLACK, ls=":", lw=1, label="float32 rounding bound")
    bx.set_xlabel("optimizer step")
    bx.set_xticks(list(idx))
    bx.set_ylabel("relative error vs large batch (log)")
    bx.set_title("Gradient error at optimizer.step()")
    bx.legend(loc="center right")
    return fig
