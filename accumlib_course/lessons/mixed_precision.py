"""Lesson 4: mixed precision with ``GradScaler`` inside an accumulation window.

The correct order is the one ``accumlib.amp`` uses, once per window:

    scale(loss_j / N).backward()  for every micro-batch j   (.grad holds S * g)
    unscale_(optimizer)           once, after the last micro-batch   (.grad holds g)
    clip_grad_norm_               on true magnitudes
    step(optimizer)               skipped when .grad holds inf/nan
    update()                      once: the scale may change only between windows

The two functions ``clip_before_unscale`` and ``scale_changes_mid_window`` are the
bugs this lesson shows, written out so they can be measured against the oracle.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import amp, compare, get_task, grads_of, resolve_device, true_gradient
from accumlib.batches import to_device
from accumlib.checks import check_float, check_int
from accumlib.data import digits
from accumlib.text import Table
from accumlib.tolerances import BF16_RTOL

from .. import _style
from ._exercise import Exercise
from ._mixed_precision_bugs import clip_before_unscale, scale_changes_mid_window
from ._mixed_precision_floats import amp_vs_oracle, autocast_dtype, underflow  # noqa: F401 (the notebook and tests read them here)
from ._mixed_precision_inf import TASK, InfRun, inf_run, inf_table, plot_inf_run  # noqa: F401 (the notebook reads them here)

# --- one window, measured: the oracle, the reference loop, and the two bugs ------------------------


def _window(
    task: str, accum_steps: int, batch_size: int | None, device: torch.device
) -> tuple[torch.nn.Module, list[Any], Any]:
    t = get_task(task)
    batches = list(t.loader(batch_size) if batch_size else t.loader())[:accum_steps]
    return t.make_model(0).to(device), batches, t


def _clipped(g: dict[str, torch.Tensor], max_norm: float | None) -> dict[str, torch.Tensor]:
    if max_norm is None:
        return g
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in g.values()))
    return {k: v * min(1.0, max_norm / (norm + 1e-6)) for k, v in g.items()}


def _captured_at_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> list[dict[str, torch.Tensor]]:
    seen: list[dict[str, torch.Tensor]] = []
    optimizer.register_step_pre_hook(lambda opt, a, kw: seen.append(grads_of(model)))
    return seen


@dataclass
class WindowResult:
    """Relative error of the gradient each variant hands to ``optimizer.step`` vs the (clipped) oracle."""

    rel_error: dict[str, float]
    norm_ratio: dict[str, float]
    max_norm: float | None
    oracle_norm: float
    scale: float
    change_after: int
    factor: float
    micro_batches: int
    items: int


def one_window(
    max_norm: float | None = 0.25,
    *,
    init_scale: float = 2.0**16,
    change_after: int = 2,
    factor: float = 2.0,
    accum_steps: int = 4,
    batch_size: int = 8,
    device: str | torch.device = "auto",
    task: str = TASK,
) -> WindowResult:
    """The first window of ``task``, stepped three ways, each gradient compared with the oracle.

    'unscale_ then clip' is ``accumlib.amp`` itself; the other two are the bugs above.
    The oracle is the true large-batch gradient, clipped to ``max_norm`` like the loops clip.
    Results are cached per argument set, so a widget that returns to a value redraws at once.

    >>> one_window(accum_steps=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer >= 2; a scale can only change inside a window ... (got 1)
    """
    if max_norm is not None:
        max_norm = check_float("max_norm", max_norm, low=0.0, low_open=True)
    init_scale = check_float("init_scale", init_scale, low=0.0, low_open=True)
    accum_steps = check_int(
        "accum_steps",
        accum_steps,
        low=2,
        why="a scale can only change inside a window of 2 or more micro-batches",
    )
    batch_size = check_int("batch_size", batch_size, low=1)
    n_items = len(get_task(task).make_dataset())
    if accum_steps * batch_size > n_items:
        raise ValueError(
            f"accum_steps * batch_size must be <= {n_items}, the items of {task}, so the first window is "
            f"full (got {accum_steps} * {batch_size} = {accum_steps * batch_size})"
        )
    change_after = check_int(
        "change_after",
        change_after,
        low=1,
        high=accum_steps - 1,
        why="the scale changes after one micro-batch and before the window's last",
    )
    factor = check_float("factor", factor, low=0.0, low_open=True)
    return _one_window(
        max_norm, init_scale, change_after, factor, accum_steps, batch_size, str(resolve_device(device)), task
    )


@functools.lru_cache(maxsize=64)
def _one_window(
    max_norm: float | None,
    init_scale: float,
    change_after: int,
    factor: float,
    accum_steps: int,
    batch_size: int,
    device: str,
    task: str,
) -> WindowResult:
    dev = torch.device(device)
    dtype = autocast_dtype(dev)
    model0, window, t = _window(task, accum_steps, batch_size, dev)
    oracle = true_gradient(model0, window, t.item_losses, device=dev)
    runs = {
        "unscale_ then clip (accumlib.amp)": lambda m, o, s: amp(
            m, o, window, t.item_losses, accum_steps=accum_steps, device=dev, scaler=s, max_norm=max_norm
        ),
        "clip before unscale_": lambda m, o, s: clip_before_unscale(
            m,
            o,
            window,
            t.item_losses,
            scaler=s,
            max_norm=max_norm if max_norm is not None else math.inf,
            dtype=dtype,
        ),
        f"scale x{factor:g} after micro-batch {change_after}": lambda m, o, s: scale_changes_mid_window(
            m, o, window, t.item_losses, scaler=s, change_after=change_after, factor=factor, dtype=dtype
        ),
    }
    rel, ratio = {}, {}
    for name, run in runs.items():
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = _captured_at_step(model, opt)
        run(model, opt, torch.amp.GradScaler(dev.type, init_scale=init_scale))
        # the scale-change bug does not clip, so it is judged against the unclipped oracle
        ref = oracle if name.startswith("scale") else _clipped(oracle, max_norm)
        c = compare(seen[0], ref)
        rel[name], ratio[name] = c.rel_error, c.norm_ratio
    oracle_norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in oracle.values()))
    items = sum(t.count_items(b) for b in window)
    return WindowResult(
        rel, ratio, max_norm, oracle_norm, init_scale, change_after, factor, len(window), items
    )


compute = one_window  # the lesson's main computation, under the name every lesson uses

_ROLES = ("correct", "buggy", "other")  # amp, clip-first, scale change: one role (colour + hatch) each


def window_table(result: WindowResult) -> Table:
    """The three loops' errors, as a table (errors below bfloat16's tolerance show as a bound)."""
    rows = []
    for name, err in result.rel_error.items():
        shown = f"{err:.2f}" if err > BF16_RTOL else f"< {BF16_RTOL:g} (bf16 rounding)"
        rows.append((name, shown, f"{result.norm_ratio[name]:.2f}"))
    return Table(
        ("loop", "relative error vs oracle", "norm ratio |g|/|g*|"),
        rows,
        caption=f"first window: {result.micro_batches} micro-batches, {result.items} items; oracle norm "
        f"{result.oracle_norm:.3f}, max_norm {result.max_norm}, scale {result.scale:g}",
    )


@_style.styled
def plot(result: WindowResult) -> Figure:
    """One bar per loop: how far the gradient it hands to ``optimizer.step()`` is from the oracle."""
    names = list(result.rel_error)
    clip = "no clipping" if result.max_norm is None else f"max_norm {result.max_norm:.3g}"
    fig, ax = _style.figure(
        width=8.5,
        height=3.4,
        title=f"Error of the stepped gradient vs the true gradient ({clip}, scale {result.scale:g})",
    )
    values = [max(result.rel_error[n], 1e-8) for n in names]
    for i, (n, v, role) in enumerate(zip(names, values, _ROLES)):
        ax.barh(
            i, v, color=_style.ROLE[role]["color"], hatch=_style.HATCH[role], edgecolor="black", linewidth=0.6
        )
        ax.text(v * 1.3, i, f"{result.rel_error[n]:.2g}", va="center")
    ax.set_yticks(range(len(names)), names)
    ax.set_xscale("log")
    ax.set_xlim(1e-6, 30)
    ax.axvline(BF16_RTOL, **{**_style.ROLE["oracle"], "linewidth": 1})
    ax.set_ylim(len(names) - 0.5, -1.0)  # top to bottom, with a free row for the tolerance's label
    ax.text(BF16_RTOL * 1.2, -0.72, "bfloat16 tolerance", ha="left", va="center")
    ax.set_xlabel("relative error |g - g*| / |g*| (log scale)")
    return fig


plot_window = plot


def unscale_twice_error(device: str | torch.device = "auto") -> str:
    """GradScaler refuses a second ``unscale_`` before ``update``: the message it raises."""
    dev = resolve_device(device)
    model, window, t = _window(TASK, 1, None, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(dev.type)
    scaler.scale(t.item_losses(model, to_device(window[0], dev)).mean()).backward()
    scaler.unscale_(opt)
    try:
        scaler.unscale_(opt)  # e.g. unscaling after every micro-batch
    except RuntimeError as e:
        return str(e)
    return "no error"


def _slider_style() -> dict[str, Any]:
    """Wide enough for the whole description (ipywidgets cuts long labels at 80 px otherwise)."""
    import ipywidgets as w

    return dict(
        style={"description_width": "initial"}, layout=w.Layout(width="420px"), continuous_update=False
    )


def inf_explorer(device: str | torch.device = "auto", initial: InfRun | None = None) -> Any:
    """Sliders for the window that overflows and the growth interval; re-runs ``inf_run``.

    ``initial``: a result already computed for the start values (window 3, growth_interval 2).
    """
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        lambda inf_window, growth_interval: inf_run(
            (inf_window,), growth_interval=growth_interval, device=device
        ),
        plot_inf_run,
        initial=initial,
        inf_window=w.IntSlider(value=3, min=0, max=9, description="inf in window", **_slider_style()),
        growth_interval=w.IntSlider(value=2, min=1, max=5, description="growth_interval", **_slider_style()),
    )


def widget(device: str | torch.device = "auto", initial: WindowResult | None = None) -> Any:
    """Sliders for max_norm and log2 of the scale; re-runs ``compute`` and redraws its bars (``initial``:
    max_norm 0.25, 2**16).
    """
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        lambda max_norm, log2_scale: compute(max_norm, init_scale=2.0**log2_scale, device=device),
        plot,
        initial=initial,
        max_norm=w.FloatLogSlider(
            value=0.25, base=10, min=-2, max=2, step=0.25, description="max_norm", **_slider_style()
        ),
        log2_scale=w.IntSlider(value=16, min=0, max=24, description="log2 of the scale S", **_slider_style()),
    )


clip_explorer = widget


def window_source(loop: Any = amp) -> str:
    """The lines of a reference loop that handle one window, from ``for window`` to the logged loss."""
    import inspect

    lines = inspect.getsource(loop).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("for window"))
    end = next(i for i, line in enumerate(lines) if line.strip().startswith("logged.append"))
    indent = len(lines[start]) - len(lines[start].lstrip())
    return "\n".join(line[indent:] for line in lines[start : end + 1])


# --- the exercise: the learner's own AMP accumulation loop, graded by accumlib.verify ----------------


EXERCISE = Exercise(
    "04-unscale-before-clipping",
    "Clip the true gradient of an AMP window",
    make_dataset=functools.partial(digits, 128),  # every window full: only the AMP order is judged
    accum_steps=4,
    batch_size=8,
    call="mp.EXERCISE",
    clip_each_step=True,  # the exercise clips every window's gradient, before the step
    hints={
        "clip-before-unscale": (
            "After the window's last scaler.scale(loss).backward(), .grad holds S times the window's "
            "gradient (S = scaler.get_scale(), 65536 here), so your clip compares S|g| with max_norm and "
            "shrinks every step to max_norm / S.",
            "One GradScaler call turns .grad back into the true gradient, in place; it has to run, once per "
            "window, before anything reads the gradient's size.",
            "Add scaler.unscale_(optimizer) right above your clip, in the same if (scaler.step then does not "
            "unscale again).",
        ),
        "clip-after-step": (
            "Your clip runs after scaler.step: the step has already used the unclipped gradient.",
            "A clip changes .grad; only a step that comes after it sees the change. What order do unscale, "
            "clip and step need?",
            "Move your clip up, between scaler.unscale_(optimizer) and scaler.step(optimizer): unscale_, "
            "clip (max_norm=0.1), step, update, zero_grad.",
        ),
        "no-clip": (
            "At the steps the verdict names, no clip by norm ran between the window's last backward and the "
            "step: those steps used the unclipped gradient, where the exercise clips every window's gradient "
            "at max_norm=0.1.",
            "If your loop has a clip, it did not run there: is it under a condition of its own, outside the "
            "window's if, or a clip by value (clip_grad_value_) rather than by norm?",
            "In the if that steps: scaler.unscale_(optimizer) (add it if it is missing), then a clip by norm "
            "at max_norm=0.1 (clip_grad_norm_ however imported, or get_total_norm + clip_grads_with_norm_), "
            "then scaler.step(optimizer).",
        ),
        "clip-per-micro-batch": (
            "Your clip runs for every micro-batch, before the window's gradient is complete: it clips a "
            "partial sum.",
            "The window's gradient is complete only after its k-th backward.",
            "Move your clip into the if, after scaler.unscale_(optimizer) and right above "
            "scaler.step(optimizer): once per window.",
        ),
        "non-finite": "A step saw inf or nan: the scaler must step (and may skip), not the optimizer "
        "directly.",
        "zero-grad-inside-window": "Gradients are cleared between micro-batches of one window: zero them "
        "only after a step.",
        "no-zero-grad": "Gradients of the previous window are still in .grad: zero them right after every "
        "step.",
        "early-step": "The optimizer steps more often than once per k micro-batches: keep the step inside "
        "the `if`.",
        "unscaled-sum": "Each micro-batch's loss must still be divided so the window's items weigh 1/N each.",
        "error": (
            "GradScaler refuses a second unscale_ for an optimizer before update(): unscale once per window, "
            "after the window's last backward, not after every micro-batch."
        ),
    },
    default_hint=(
        "Compare your window with the order of section 1: scaled backward per micro-batch; then, once per "
        "window, make .grad hold true magnitudes, clip, let the scaler step, update the scale, zero the "
        "gradients."
    ),
)
