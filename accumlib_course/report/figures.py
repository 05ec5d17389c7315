"""The report's figures, each with alt text built from the numbers it plots, in the lessons' one style."""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from accumlib.loops import CONTRACTS, Contract
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from .compute import Cell, ReportResult

# A bit-exact 0 on a log axis is drawn here and labelled "0": float32 rounding (~1e-7) stays visibly above it.
ZERO = 1e-10
# Extra markers for a loop whose role another loop of the same figure already has: same colour (its
# role), its own marker, so no two lines of an axes differ by nothing.
_SPARE_MARKERS = ("v", "P", "X", "*", "<", ">", "h", "p")


def role_of(contract: Contract) -> str:
    """A loop's style role, read from its contract's verdicts (``Contract.role``), so a new loop file is
    styled without an edit here.

    >>> from accumlib.loops import CONTRACTS
    >>> [role_of(CONTRACTS[name]) for name in ("naive", "ragged", "large_batch")]
    ['buggy', 'correct', 'oracle']
    """
    return contract.role


def _contract(label: str) -> Contract | None:
    """The contract behind a figure's label: a loop's name, or "<name> (<dtype>)" for a low-precision run."""
    return CONTRACTS.get(label) or CONTRACTS.get(label.split(" (", 1)[0])


def styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """Each label's line style: its role's, or a spare marker in that colour where the role is taken."""
    out: dict[str, dict[str, Any]] = {}
    taken: set[tuple[str, str]] = set()
    spare = iter(_SPARE_MARKERS)
    for label in labels:
        contract = _contract(label)
        style = dict(_style.ROLE[role_of(contract) if contract else "other"])
        while (style["marker"], str(style["linestyle"])) in taken:
            style["marker"] = next(spare)
        taken.add((style["marker"], str(style["linestyle"])))
        out[label] = style
    return out


def _zero(value: float) -> float:
    return max(value, ZERO)


def _log_axis_with_zero(ax: Any, values: list[float]) -> None:
    """Log y axis in whole decades, with a bit-exact 0 drawn at ``ZERO`` and labelled "0"."""
    top = math.ceil(math.log10(max([*values, 1.0])))
    decades = list(range(-8, top + 1, 2 if top + 8 > 6 else 1))
    ax.set_yscale("log")
    ax.set_ylim(ZERO / 3, 10.0**top * 3)
    ax.set_yticks([ZERO] + [10.0**d for d in decades], ["0 (bit-exact)"] + [f"{10.0**d:g}" for d in decades])
    ax.yaxis.set_minor_locator(NullLocator())
    # a gap in the axis: 0 is not a decade below 1e-8
    ax.axhline(ZERO * 10, color="white", linewidth=3, zorder=1)


def _tolerance_band(ax: Any) -> None:
    """Grey below the float32 bound: a point inside the band is exact, one above it is a wrong gradient."""
    ax.axhspan(
        ZERO / 3,
        FLOAT32_RTOL,
        color="0.88",
        zorder=0,
        label=f"exact: within float32 rounding (<= {FLOAT32_RTOL:g})",
    )


def _k_axis(ax: Any, ks: tuple[int, ...]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("accumulation steps k")


def _ks(ks: list[int]) -> str:
    return ", ".join(map(str, ks))


def title_errors(result: ReportResult) -> str:
    """The error figure's title: which loops its numbers show exact at every k (their verdicts)."""
    exact = result.exact_loops
    headline = (
        (
            f"exact at every k: {', '.join(exact)}"
            if len(exact) < len(result.loops)
            else "every loop exact at every k"
        )
        if exact
        else "no loop exact at every k"
    )
    return f"Each loop's worst step against the large batch ({result.task}),\n{headline}"


def title_memory_and_norm(result: ReportResult) -> str:
    """The memory and norm figure's title: what accumulation saves at the largest k, and whether the exact
    loop stays exact with the report's norm layer (``ReportResult.norm_inexact_ks``, the findings' rule)."""
    k = max(result.ks)
    m, big = result.memory[k]
    layer = "no norm layer" if result.norm == "none" else f"{result.norm} norm"
    off = result.norm_inexact_ks
    norm = (
        f"and what it keeps exact: {layer}, at every k"
        if not off
        else f"and what it cannot fix: {layer}, off at k = {_ks(off)}"
    )
    return f"What accumulation saves: {big / m:.1f}x less activation memory at k = {k},\n{norm}"


def _norm_panel_title(result: ReportResult) -> str:
    off = result.norm_inexact_ks
    verdict = (
        "exact at every k" if not off else f"off by up to {_alt_number(max(result.norm_errors.values()))}"
    )
    return f"ragged, SmallCNN, {result.norm} norm:\n{verdict}"


@_style.styled
def plot_errors(result: ReportResult) -> Figure:
    """Each loop's worst step: relative gradient error against the large batch vs k (log axis, 0 drawn as
    "0")."""
    fig, ax = _style.figure(width=9, height=6.5, title=title_errors(result))
    values = []
    style = styles(result.loops)
    for name in result.loops:
        ys = [result.cells[(name, k)].max_rel_error for k in result.ks]
        values += ys
        ax.plot(result.ks, [_zero(y) for y in ys], label=name, **style[name])
    _tolerance_band(ax)
    _log_axis_with_zero(ax, values)
    _k_axis(ax, result.ks)
    ax.set_ylabel("relative error ||g - g*|| / ||g*||")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)  # two columns fit 14 pt text in 9 inches
    return fig


def alt_errors(result: ReportResult) -> str:
    """Alt text of ``plot_errors``: what it shows, with its numbers."""
    lines = "; ".join(
        f"{name}: "
        + ", ".join(f"{_alt_number(result.cells[(name, k)].max_rel_error)} at k = {k}" for k in result.ks)
        for name in result.loops
    )
    return (
        f"{_sentence(title_errors(result))} Line chart, log scale: the worst optimizer step's relative "
        f"gradient error against the large batch, for k = {', '.join(map(str, result.ks))} on {result.task} "
        f"with micro-batches of {result.batch_size}. {lines}."
    )


def _sentence(title: str) -> str:
    """A two-line figure title as the sentence an alt text opens with."""
    return title.replace(",\n", ", ").replace("\n", ": ") + "."


def _alt_number(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def _tail_label(steps: int, cell: Cell) -> list[str]:
    labels = [str(i) for i in range(1, steps + 1)]
    if cell.window_batches and cell.window_batches[-1] < cell.k:
        labels[-1] += f"\ntail: {cell.window_batches[-1]} of {cell.k}"
    return labels


@_style.styled
def plot_steps(result: ReportResult, k: int | None = None) -> Figure:
    """Step by step at ``k`` (default: the largest): the gradient error of each step, and each loop's
    logged loss minus the large-batch run's, so the effect is on the axis rather than hidden in an offset."""
    k = k or max(result.ks)
    ref = result.cells[("large_batch", k)]
    fig, (ax, bx) = _style.figure(
        2,
        width=10,
        height=6,
        title=f"Step by step at k = {k} ({result.task}, micro-batches of {result.batch_size}, "
        f"{ref.steps} optimizer steps)",
    )
    steps = list(range(1, ref.steps + 1))
    values = []
    style = styles(result.loops)
    for name in result.loops:
        cell = result.cells[(name, k)]
        values += cell.rel_errors
        ax.plot(steps, [_zero(e) for e in cell.rel_errors], label=name, **style[name])
        bx.plot(steps, [a - b for a, b in zip(cell.logged, ref.logged)], label=name, **style[name])
    _tolerance_band(ax)
    _log_axis_with_zero(ax, values)
    ax.set_title("Gradient error of each step")
    ax.set_ylabel("relative error vs large batch")
    bx.set_title("Logged loss minus\nthe large batch's")
    bx.set_ylabel("loss difference (nats)")
    bx.ticklabel_format(axis="y", useOffset=False)
    for a in (ax, bx):
        a.set_xticks(steps, _tail_label(len(steps), ref))
        a.xaxis.set_minor_locator(NullLocator())
        a.set_xlabel("optimizer step")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    return fig


def alt_steps(result: ReportResult, k: int | None = None) -> str:
    """Alt text of ``plot_steps``."""
    k = k or max(result.ks)
    ref = result.cells[("large_batch", k)]
    errors = "; ".join(
        f"{name}: " + ", ".join(_alt_number(e) for e in result.cells[(name, k)].rel_errors)
        for name in result.loops
    )
    gaps = "; ".join(
        f"{name}: "
        + ", ".join(
            f"{a - b:+.2g}" if a != b else "0" for a, b in zip(result.cells[(name, k)].logged, ref.logged)
        )
        for name in result.loops
    )
    return (
        f"Two line charts over the {ref.steps} optimizer steps at k = {k} (the last window holds "
        f"{ref.window_batches[-1]} of {k} micro-batches). Left, log scale: each step's relative gradient "
        f"error against the large batch, {errors}. Right: each loop's logged loss minus the large-batch "
        f"run's, {gaps}."
    )


@_style.styled
def plot_memory_and_norm(result: ReportResult) -> Figure:
    """Left: activation memory vs k. Right: ragged's error with the chosen norm layer vs k."""
    fig, (ax, bx) = _style.figure(2, width=10, height=6.5, title=title_memory_and_norm(result))
    ax.plot(
        result.ks,
        [big / 1024 for _, big in result.memory.values()],
        label="one large batch of k micro-batches",
        **_style.ROLE["other"],
    )
    ax.plot(
        result.ks,
        [m / 1024 for m, _ in result.memory.values()],
        label="one micro-batch (accumulation)",
        **_style.ROLE["correct"],
    )
    _k_axis(ax, result.ks)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("activations saved for backward (KiB)")
    ax.set_title(f"Activation memory\n(micro-batches of {result.batch_size})")
    errors = list(result.norm_errors.values())
    bx.plot(
        result.ks,
        [_zero(e) for e in errors],
        label=f"accumlib.ragged, {result.norm} norm",
        **_style.ROLE["correct"],
    )
    _tolerance_band(bx)
    _log_axis_with_zero(bx, errors)
    _k_axis(bx, result.ks)
    bx.set_ylabel("relative error vs large batch")
    bx.set_title(_norm_panel_title(result))
    handles, labels = ax.get_legend_handles_labels()  # one legend below both panels: none covers a line
    more, names = bx.get_legend_handles_labels()
    fig.legend(handles + more, labels + names, loc="outside lower center", ncols=2)
    return fig


def alt_memory_and_norm(result: ReportResult) -> str:
    """Alt text of ``plot_memory_and_norm``."""
    memory = ", ".join(
        f"k = {k}: {m / 1024:.1f} against {big / 1024:.1f} KiB" for k, (m, big) in result.memory.items()
    )
    norm = ", ".join(f"{_alt_number(e)} at k = {k}" for k, e in result.norm_errors.items())
    return (
        f"{_sentence(title_memory_and_norm(result))} Two line charts against k. Left: activation memory of "
        f"one micro-batch against one large batch, {memory}. Right, log scale: worst relative gradient error "
        f"of accumlib.ragged on SmallCNN with {result.norm} norm, {norm}."
    )


def show(fig: Figure, alt: str) -> None:
    """Display ``fig`` as an ``<img>`` with ``alt`` text (the report's HTML keeps it)."""
    _style.show(fig, alt=alt)
