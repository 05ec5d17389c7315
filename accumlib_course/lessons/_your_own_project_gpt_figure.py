"""Lesson 10, part: the small GPT's figure. Left, the loss curve every run logs; right, each run's distance
from the large batch's parameters after every step, the float32 line named on it."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from ._your_own_project_gpt import GPTResult


@_style.styled
def plot_gpt(result: GPTResult) -> Figure:
    """Left: the logged loss per optimizer step. Right: the distance from the large batch's parameters."""
    p = result.preset
    fig, (ax, bx) = _style.figure(
        2,
        width=13.0,
        height=6.5,
        title=f"A {result.n_parameters:,}-parameter GPT, {p.steps} steps: each run against 32 x 1",
    )
    steps = range(1, p.steps + 1)
    every = max(1, p.steps // 15)  # a marker every few steps: each run stays recognisable, the line readable
    ax.plot(steps, result.reference.losses, label="32 x 1 (the large batch)", **_style.ROLE["oracle"], lw=2.5)
    colors, markers = _style.PALETTE, _style.MARKERS
    for i, r in enumerate(result.runs[1:]):
        kw = dict(
            color=colors[i % len(colors)],
            marker=markers[i % len(markers)],
            markevery=(i % every, every),  # staggered, so that runs on one curve still show each marker
            label=r.label,
            lw=1.5 if r.correct else 1.2,
            linestyle="--" if r.correct else "-",
        )
        ax.plot(steps, r.losses, **kw)
        bx.plot(steps, r.distances, **kw)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean token loss of the window")
    ax.set_title("The loss curve")
    bx.axhline(FLOAT32_RTOL, **{**_style.ROLE["oracle"], "marker": ""})
    # named on the line itself, at the right end: the figure's legend is as wide as the figure already
    bx.text(
        0.98, FLOAT32_RTOL, "float32 rounding", transform=bx.get_yaxis_transform(), ha="right", va="bottom"
    )
    bx.set_yscale("log")
    bx.set_xlabel("optimizer step")
    bx.set_ylabel("|θ − θ large| / |θ large − θ start|")
    bx.set_title("Distance from the large batch's parameters")
    for axis in (ax, bx):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3)
    return fig
