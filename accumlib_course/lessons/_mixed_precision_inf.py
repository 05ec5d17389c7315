"""Lesson 4's skipped steps: an inf injected into chosen windows, and GradScaler backing off and growing
its scale again, recorded step by step.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import amp, get_task, resolve_device
from accumlib.checks import check_float, check_int
from accumlib.data import digits
from accumlib.text import Table

from .. import _style

TASK = "mlp-digits"  # the task of every measurement in lesson 4


# --- skipped steps: inject an inf and watch the scaler back off ------------------------------------


class _RecordingScaler(torch.amp.GradScaler):
    """A GradScaler that records its scale before and after every ``update``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.before: list[float] = []
        self.after: list[float] = []

    def update(self, new_scale: Any = None) -> None:
        self.before.append(self.get_scale())
        super().update(new_scale)
        self.after.append(self.get_scale())


@dataclass
class InfRun:
    """Per window of one ``accumlib.amp`` epoch: the scale used, whether the optimizer stepped."""

    scale: list[float]
    scale_after: list[float]
    stepped: list[bool]
    params_moved: list[bool]
    inf_windows: tuple[int, ...]
    growth_interval: int
    n_samples: int
    micro_batch: int
    accum_steps: int
    logged: list[float] = field(default_factory=list)

    @property
    def skipped(self) -> list[int]:
        return [i for i, s in enumerate(self.stepped) if not s]


def inf_run(
    inf_windows: tuple[int, ...] = (3,),
    *,
    growth_interval: int = 2,
    init_scale: float = 2.0**10,
    accum_steps: int = 2,
    batch_size: int = 8,
    n_samples: int = 160,
    device: str | torch.device = "auto",
) -> InfRun:
    """One ``accumlib.amp`` epoch on digits with an inf injected into one gradient of each window in
    ``inf_windows``.

    A tensor hook on the first layer's weight replaces its gradient by inf during the
    first micro-batch of those windows (what an overflow in float16 produces). The
    scaler finds it at ``step``, skips ``optimizer.step()`` and multiplies the scale by
    0.5; every ``growth_interval`` clean windows in a row double it. Cached per argument set.

    >>> inf_run((12,))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: inf_windows[0] must be an integer between 0 and 9; 160 digits ... make 10 windows (got 12)
    """
    growth_interval = check_int("growth_interval", growth_interval, low=1)
    init_scale = check_float("init_scale", init_scale, low=0.0, low_open=True)
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    batch_size = check_int("batch_size", batch_size, low=1)
    n_samples = check_int(
        "n_samples", n_samples, low=1, high=1797, why="scikit-learn's digits hold 1797 images"
    )
    n_windows = math.ceil(math.ceil(n_samples / batch_size) / accum_steps)  # the last ones may be partial
    if isinstance(inf_windows, int) or not hasattr(inf_windows, "__iter__"):
        raise ValueError(f"inf_windows must be a tuple of window indices (got {inf_windows!r})")
    why = (
        f"{n_samples} digits in micro-batches of {batch_size}, {accum_steps} per window, "
        f"make {n_windows} windows"
    )
    inf_windows = tuple(
        check_int(f"inf_windows[{i}]", w, low=0, high=n_windows - 1, why=why)
        for i, w in enumerate(inf_windows)
    )
    return _inf_run(
        inf_windows,
        growth_interval,
        init_scale,
        accum_steps,
        batch_size,
        n_samples,
        str(resolve_device(device)),
    )


@functools.lru_cache(maxsize=64)
def _inf_run(
    inf_windows: tuple[int, ...],
    growth_interval: int,
    init_scale: float,
    accum_steps: int,
    batch_size: int,
    n_samples: int,
    device: str,
) -> InfRun:
    dev = torch.device(device)
    t = get_task(TASK)
    model = t.make_model(0).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _RecordingScaler(dev.type, init_scale=init_scale, growth_interval=growth_interval)
    loader = t.loader(batch_size, dataset=digits(n_samples))
    micro = {"i": -1}
    stepped_at: list[int] = []
    params: list[torch.Tensor] = []

    def count(module: Any, args: Any) -> None:
        micro["i"] += 1
        if micro["i"] % accum_steps == 0:  # a window starts: remember its parameters
            params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())

    def poison(grad: torch.Tensor) -> torch.Tensor:
        i = micro["i"]
        if i % accum_steps == 0 and i // accum_steps in inf_windows:
            return torch.full_like(grad, math.inf)
        return grad

    model.register_forward_pre_hook(count)
    first = next(model.parameters())
    first.register_hook(poison)
    opt.register_step_post_hook(lambda o, a, kw: stepped_at.append(micro["i"] // accum_steps))
    logged = amp(model, opt, loader, t.item_losses, accum_steps=accum_steps, device=dev, scaler=scaler)
    params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    n_windows = len(logged)
    moved = [not torch.equal(params[i], params[i + 1]) for i in range(n_windows)]
    return InfRun(
        scale=scaler.before,
        scale_after=scaler.after,
        stepped=[w in stepped_at for w in range(n_windows)],
        params_moved=moved,
        inf_windows=tuple(inf_windows),
        growth_interval=growth_interval,
        n_samples=n_samples,
        micro_batch=batch_size,
        accum_steps=accum_steps,
        logged=logged,
    )


def inf_table(run: InfRun) -> Table:
    """One row per window: the scale it used, whether it stepped, whether the parameters moved."""
    rows = [
        (i, f"{s:g}", "yes" if st else "no (skipped)", "yes" if mv else "no", f"{sa:g}")
        for i, (s, st, mv, sa) in enumerate(zip(run.scale, run.stepped, run.params_moved, run.scale_after))
    ]
    return Table(
        ("window", "scale used", "stepped", "parameters moved", "scale after update()"),
        rows,
        caption=f"{run.n_samples} digits, micro-batch {run.micro_batch}, k = {run.accum_steps}: "
        f"{len(run.scale)} windows; inf injected in window(s) {list(run.inf_windows)}",
    )


@_style.styled
def plot_inf_run(run: InfRun) -> Figure:
    """The scale each window used, with the windows GradScaler skipped marked."""
    fig, ax = _style.figure(
        width=8,
        height=3.4,
        title=f"GradScaler's scale per window: inf in window(s) {list(run.inf_windows)}, "
        f"growth_interval {run.growth_interval}",
    )
    steps = range(len(run.scale))
    ax.step(steps, run.scale, where="post", label="scale used by the window", **_style.ROLE["correct"])
    skipped = run.skipped
    ax.plot(
        skipped,
        [run.scale[i] for i in skipped],
        linestyle="none",
        marker="X",
        markersize=12,
        color=_style.ROLE["buggy"]["color"],
        zorder=3,
        label="inf found: step skipped, scale halved",
    )
    ax.set_yscale("log", base=2)
    ax.set_xticks(list(steps))
    ax.set_xlabel("window (one optimizer step each)")
    ax.set_ylabel("GradScaler scale (log2)")
    ax.legend(loc="upper left")
    return fig
