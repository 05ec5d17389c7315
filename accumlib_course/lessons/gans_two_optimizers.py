"""Lesson 6: GANs and two optimizers (seed: "Gradient Accumulation in PyTorch, GANs and other Nightmares").

A generator G and a discriminator D share one autograd graph: ``D(G(z))``. The
generator's backward therefore also writes ``.grad`` of every D parameter (the *leak*),
and the discriminator's backward through an undetached fake writes G's ``.grad``.
Each optimizer must step on exactly its own loss's gradient:

    G's step:  grad_G  mean_z  bce(D(G(z)), 1)
    D's step:  grad_D  mean over fakes and reals of  bce(D(G(z)), 0) / bce(D(x), 1)

The step functions below are the seed's orderings (made to run, see ``seed_as_written``)
and accumulation with two optimizers; ``check_step`` and ``check_accumulation`` compare
each optimizer's gradient, at its ``step``, with ``accumlib.true_gradient``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from accumlib import compare, grads_of, true_gradient
from accumlib.checks import check_choice, check_int
from accumlib.text import Table
from accumlib.tolerances import FLOAT32_RTOL

from .. import _style
from ._exercise import Exercise
from ._gans_two_optimizers_exercise import (  # noqa: F401 (the notebook reads them here)
    GanFinding,
    GanReport,
    GanSetup,
    d_loss,
    exercise,
    g_loss,
    leak_share,
    verify_gan_exercise,
)
from ._gans_two_optimizers_model import bce, d_item_losses, g_item_losses, make_gan, noise, real_points
from ._gans_two_optimizers_steps import (  # noqa: F401 (the notebook and tests read them here)
    ACCUMULATIONS,
    STEPS,
    accumulate_interleaved_leaky,
    accumulate_interleaved_zero_d,
    accumulate_two_phase,
    d_first_detach,
    leaky,
    requires_grad_toggle,
    seed_as_written,
    zero_grad_after_g,
)

# --- the check: each optimizer's gradient at its step vs the oracle --------------------------------


@dataclass
class GanCheck:
    """Relative error of each optimizer's gradient at its step (``None`` if it never stepped), or the error
    raised.
    """

    rel_error: dict[str, float | None]
    error: str | None = None

    def exact(self, tol: float = FLOAT32_RTOL) -> bool:
        return self.error is None and all(e is not None and e <= tol for e in self.rel_error.values())


def _run_checked(
    fn: Callable[..., None],
    G,
    D,
    z_batches: list[torch.Tensor],
    real_batches: list[torch.Tensor],
    args: tuple,
) -> GanCheck:
    g_opt = torch.optim.Adam(G.parameters(), lr=1e-3)
    d_opt = torch.optim.Adam(D.parameters(), lr=1e-3)
    with torch.no_grad():
        fakes = [G(z) for z in z_batches]  # the fakes D trains on, from G before any step
    seen: dict[str, float | None] = {"D": None, "G": None}

    def check_d(opt: Any, a: Any, kw: Any) -> None:
        batches = [(f, torch.zeros(len(f))) for f in fakes] + [(x, torch.ones(len(x))) for x in real_batches]
        seen["D"] = compare(grads_of(D), true_gradient(D, batches, d_item_losses)).rel_error

    def check_g(opt: Any, a: Any, kw: Any) -> None:  # at D's parameters when G steps
        seen["G"] = compare(grads_of(G), true_gradient(G, z_batches, g_item_losses(D))).rel_error

    d_opt.register_step_pre_hook(check_d)
    g_opt.register_step_pre_hook(check_g)
    try:
        fn(G, D, g_opt, d_opt, *args)
    except RuntimeError as e:
        return GanCheck(seen, error=str(e).split(":")[0])
    return GanCheck(seen)


def leak_norm(seed: int = 0, n: int = 64) -> float:
    """Norm of what G's backward writes into D's ``.grad`` (relative to D's own gradient)."""
    G, D = make_gan(seed)
    z, x = noise(n, seed + 1), real_points(n, seed)
    bce(D(G(z)), 1.0).mean().backward()
    leak = grads_of(D)
    with torch.no_grad():
        fake = G(z)
    own = true_gradient(D, [(fake, torch.zeros(n)), (x, torch.ones(n))], d_item_losses)
    return compare(leak, own).norm_ratio


def check_step(step: str | Callable[..., None], seed: int = 0, n: int = 64) -> GanCheck:
    """One GAN step with ``step`` (a name in ``STEPS`` or a function) on fresh G, D; each gradient vs the
    oracle.
    """
    fn = STEPS[step] if isinstance(step, str) else step
    G, D = make_gan(seed)
    z, x = noise(n, seed + 1), real_points(n, seed)
    return _run_checked(fn, G, D, [z], [x], (z, x))


def check_accumulation(
    accumulate: str | Callable[..., None], accum_steps: int = 4, batch_size: int = 16, seed: int = 0
) -> GanCheck:
    """One window of ``accum_steps`` micro-batches of ``batch_size`` through ``accumulate``; each optimizer
    vs its oracle.

    >>> check_accumulation("interleaved, leaky", accum_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: accum_steps must be an integer between 1 and 64 (got 0)
    """
    k = check_int("accum_steps", accum_steps, low=1, high=64)
    b = check_int("batch_size", batch_size, low=1, high=256)
    fn = ACCUMULATIONS[accumulate] if isinstance(accumulate, str) else accumulate
    G, D = make_gan(seed)
    z, x = noise(k * b, seed + 1), real_points(k * b, seed)
    z_batches, real_batches = list(z.split(b)), list(x.split(b))
    return _run_checked(fn, G, D, z_batches, real_batches, (z_batches, real_batches))


@dataclass
class GanTable:
    k: int
    micro_batch: int
    n: int
    steps: dict[str, GanCheck]
    accumulations: dict[str, GanCheck]

    def table(self, part: str = "steps") -> Table:
        """``part``: "steps" (one GAN step per ordering) or "accumulations" (k micro-batches per window)."""
        check_choice("part", part, ("steps", "accumulations"))
        fmt = lambda e: f"< {FLOAT32_RTOL:g}" if e < FLOAT32_RTOL else f"{e:.2f}"  # noqa: E731  below: float32 rounding
        rows = []
        for name, c in (self.steps if part == "steps" else self.accumulations).items():
            if c.error:
                rows.append((name, "-", "-", f"RuntimeError: {c.error}"))
            else:
                rows.append(
                    (name, fmt(c.rel_error["D"]), fmt(c.rel_error["G"]), "exact" if c.exact() else "WRONG")
                )
        what = (
            f"one step on {self.n} noise vectors and {self.n} real points"
            if part == "steps"
            else f"one window of k = {self.k} micro-batches of {self.micro_batch}"
        )
        return Table(
            ("ordering", "D's error at its step", "G's error at its step", "verdict"),
            rows,
            caption=f"{what}: each optimizer's gradient vs its own true gradient",
        )


@functools.lru_cache(maxsize=8)
def _steps(seed: int, n: int) -> dict[str, GanCheck]:
    return {name: check_step(name, seed, n) for name in STEPS}


@functools.lru_cache(maxsize=128)
def _accumulations(k: int, b: int, seed: int) -> dict[str, GanCheck]:
    return {name: check_accumulation(name, k, b, seed) for name in ACCUMULATIONS}


def compute(accum_steps: int = 4, batch_size: int = 16, seed: int = 0, n: int = 64) -> GanTable:
    """Every single-step ordering (n points) and every accumulation scheme (k x batch_size), checked
    (cached).
    """
    k = check_int("accum_steps", accum_steps, low=1, high=64)
    b = check_int("batch_size", batch_size, low=1, high=256)
    n = check_int("n", n, low=1)
    return GanTable(k, b, n, _steps(seed, n), _accumulations(k, b, seed))


@_style.styled
def plot(table: GanTable) -> Figure:
    """Two bars per ordering: D's and G's gradient error at their steps (log scale)."""
    rows = [(name, c) for name, c in table.steps.items()] + [
        (f"k={table.k}: {name}", c) for name, c in table.accumulations.items()
    ]
    fig, ax = _style.figure(
        width=11,
        height=5.2,
        title="Does each optimizer step on its own gradient? Error vs the true gradient, per ordering",
    )
    y = range(len(rows))
    for dy, who, role in ((-0.2, "G", "correct"), (0.2, "D", "other")):
        # 0 shows as 1e-8
        vals = [max(c.rel_error[who] or 0.0, 1e-8) if c.error is None else 0 for _, c in rows]
        ax.barh(
            [i + dy for i in y],
            vals,
            height=0.4,
            color=_style.ROLE[role]["color"],
            hatch=_style.HATCH[role],
            edgecolor="black",
            linewidth=0.5,
            label=f"{who}'s gradient at {who.lower()}_opt.step()",
        )
    for i, (_, c) in enumerate(rows):
        if c.error:
            ax.text(
                2e-9,
                i,
                "raises RuntimeError (in-place change)",
                va="center",
                color=_style.ROLE["buggy"]["color"],
            )
    ax.set_yticks(list(y), [name for name, _ in rows])
    ax.set_xscale("log")
    ax.set_xlim(1e-9, 30)
    ax.axvline(FLOAT32_RTOL, **{**_style.ROLE["oracle"], "linewidth": 1}, label="float32 tolerance")
    ax.invert_yaxis()
    ax.set_xlabel("relative error vs the true gradient (log scale; an exact 0 is drawn at 1e-8)")
    fig.legend(loc="outside lower center", ncols=3)
    return fig


def widget(initial: GanTable | None = None) -> Any:
    """Sliders for k and the micro-batch size; re-runs ``compute`` and redraws the bars."""
    import ipywidgets as w

    from ._explorer import Explorer

    style = dict(style={"description_width": "initial"}, continuous_update=False)
    return Explorer(
        lambda accum_steps, batch_size: compute(accum_steps, batch_size),
        plot,
        initial=initial,
        accum_steps=w.IntSlider(value=4, min=1, max=8, description="k (accum_steps)", **style),
        batch_size=w.IntSlider(value=16, min=1, max=64, description="micro-batch size", **style),
    )


explorer = widget


EXERCISE = Exercise(
    "06-keep-g-out-of-d",
    "Accumulate a GAN with two optimizers",
    run=verify_gan_exercise,
    call="gan.EXERCISE",
    hints={
        "leak-into-D": (
            "G's backward runs through D, so it writes into D's .grad too, and in this loop it does so in "
            "every micro-batch, before D steps.",
            "Section 2 shows three ways to keep G's loss out of D's .grad. One of them, a zero_grad, would "
            "also wipe the part of D's window already accumulated; look for one that stops autograd from "
            "writing into D's parameters while G's loss goes backward, and undo it afterwards.",
            "Around G's backward: D.requires_grad_(False); (gan.g_loss(D, fake) / k).backward(); "
            "D.requires_grad_(True).",
        ),
        "zero-grad-inside-window": (
            "D's .grad was cleared between micro-batches of its window: that removes the leak and D's "
            "earlier micro-batches with it (section 3's 'interleaved, zero_grad(D) per micro-batch').",
            "Keep G's loss out of D's .grad without clearing it: stop autograd from writing there instead.",
            "Remove the zero_grad inside the window; freeze D (requires_grad_(False)) around G's backward.",
        ),
        "g-unscaled-sum": (
            "D is right now, but G's steps are k times too long: G's loss reaches backward undivided.",
            "G accumulates over the same k micro-batches as D: each of its micro-batch means weighs 1/k too.",
            "(gan.g_loss(D, fake) / k).backward().",
        ),
        "g-misscaled": (
            "D is right now, but G's steps are scaled by one factor c.",
            "G's loss is a mean over a micro-batch's fakes: divide it by k, once.",
            "(gan.g_loss(D, fake) / k).backward().",
        ),
        "g-never-stepped": (
            "D is right, but G never trained: g_opt never stepped.",
            "A GAN trains two players; each window ends with a step of each optimizer.",
            "Inside the if: d_opt.step(); g_opt.step(); d_opt.zero_grad(); g_opt.zero_grad().",
        ),
        "g-no-gradient": (
            "g_opt stepped, but G's parameters had no gradient: G's loss never went backward.",
            "G's gradient comes from G's loss, through D, back to G's parameters.",
            "Keep (gan.g_loss(D, fake) / k).backward() in every micro-batch, with D frozen around it.",
        ),
        "g-no-zero-grad": (
            "G's gradient of the previous window was still in G's .grad at its next step.",
            "backward() adds into .grad for G as for D.",
            "Call g_opt.zero_grad() after g_opt.step(), once per window.",
        ),
        "g-early-step": "G stepped more often than once per window of k micro-batches: step G inside the if, "
        "with D.",
        "unexplained": (
            "D's step matches neither its own window gradient nor its own gradient plus the leak. Check that "
            "D's loss is divided by k, that the fakes D sees are detached, and that G steps after D (the "
            "oracle makes each window's fakes with G as it was before the window's steps)."
        ),
        "unscaled-sum": "D's loss reaches the step undivided: divide each micro-batch's loss by k, as the "
        "starting loop did.",
        "no-zero-grad": "D's gradients of an earlier window leaked into this step: zero D's .grad after "
        "every D step.",
        "early-step": "D steps more often than once per k micro-batches.",
        "tail-dropped": "Some pairs never reached a D step: every micro-batch must end up in a window that "
        "steps.",
        "error": (
            "Your code raised an error. 'modified by an inplace operation' means a backward ran through a "
            "network whose weights a step had already changed (section 2's 'the article as written'): step "
            "only after both backward passes of the window."
        ),
    },
    default_hint="At d_opt.step(), D's .grad must hold D's own loss over the window and nothing else: what "
    "else writes into it?",
)
