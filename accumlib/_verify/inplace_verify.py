"""``verify(train_fn, ...)`` judged in place: the in-place engine's figures (``inplace.py``) for every step,
the recompute oracle (``window_oracle.py``) only where the engine cannot vouch for them.

verify runs the loop once on its copy. The Recorder still follows the data (which micro-batches, where a
pass ends, what the loop returns, what no step used) but replays nothing: each step's large-batch gradient
is read from the loop's own backward, as ``accumlib run`` reads it. Two checks make those figures verify's:

1. The engine's items are the loop's loss calls' items; verify's truth is ``item_losses``'. The run's first
   group of micro-batches with items, alone in the engine's sum (else its first window, at the step), is
   replayed once through ``item_losses`` before the optimizer moves, and the two must agree: the same item
   count, and ||O - O'|| / ||O|| at most ``ROUNDING_FLOOR``, the rounding the verdict itself allows.
2. Every step is one the engine judges: no limit of its own (a loss it cannot see, a second loss term, a
   gradient hook, BatchNorm in training mode), no autocast (the float32 figure the report shows is the
   recompute oracle's), one backward per micro-batch group, the same clips.

Where 2 fails at a window's first backward (``take_over``: the engine reads a backward's loss calls before
it runs), the recompute oracle takes the run over from that window, in the same run. Where 1 fails, or 2
fails later in a window, ``Fallback`` ends the run and verify runs the loop again, from the start and from
the same random state, on the recompute oracle. ``Report.oracle`` says which oracle judged the run, and why
the recompute one did.

In a job (``ranks="all"``) a rank cannot run again alone: its reason waits for the step's exchange
(``Recorder.give_up``), where every rank learns it and raises ``Fallback`` together (``Ranks.agree``). A
take-over at a window's first backward stays the rank's own: its replayed sum meets the others' in the
same exchange.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Protocol

import torch

from ..batches import ItemLosses, checked_losses, to_device
from ..tolerances import ROUNDING_FLOOR
from .errors import Fallback
from .inplace import InPlace
from .measure import dist
from .ranks import Ranks
from .step_numbers import MicroBatch, StepNumbers
from .window_oracle import Replay, exact, gram, scratch_for


class Recorder(Protocol):
    """What these checks read of verify's recorder (``record.Recorder``), which calls them: the window it
    followed and the oracle it would replay (a Protocol, so the recorder's module is not imported back)."""

    engine: InPlace | None
    groups: list[tuple[int, int]]  # (micro-batches, rows) per backward
    how: Replay
    mbs: dict[int, MicroBatch]
    params: list[torch.nn.Parameter]
    ranks: Ranks | None
    shadow: torch.nn.Module
    steps: list[StepNumbers]
    switched: str
    trainable: tuple[bool, ...]
    window: list[int]

    @property
    def item_losses(self) -> ItemLosses: ...

    def give_up(self, reason: str) -> None: ...

    def replay_from_here(self) -> None: ...

    def sync(self) -> list[torch.Tensor]: ...


def take(numbers: StepNumbers, eng: InPlace, optimizer: torch.optim.Optimizer, rec: Recorder) -> None:
    """Fill ``numbers``' oracle figures (items, loss, per-micro-batch fits and weights, the gradient's
    distance from the large batch's) from the engine's capture of this step, or raise ``Fallback``."""
    no_autocast(rec)
    t = len(eng.steps)
    eng.capture(optimizer)
    if len(eng.steps) == t:
        raise Fallback(f"step {t}: the engine saw no parameter of this optimizer")
    got = eng.steps[t]
    limits = sorted(
        set(eng.unjudged.get(t, ())) | set(eng.problems) | ({"batchnorm"} if eng.batchnorm else set())
    )
    if limits:
        raise Fallback(f"step {t}: {', '.join(limits)}")
    if not (got.finite and math.isfinite(got.gg) and math.isfinite(got.tt)) or got.items == 0:
        raise Fallback(
            f"step {t}: {'no item' if got.items == 0 else 'inf or nan in the gradient or its scale'}"
        )
    groups = rec.groups  # (micro-batches, rows) per backward, as the recorder saw them
    if len(got.fits) != len(groups) and len(got.fits) == numbers.micro_batches:
        # forwards run ahead of their backwards (a loop that counts its window's items first): one each
        groups = [(1, rec.mbs[b].rows) for b in rec.window]
    if len(got.fits) != len(groups):
        raise Fallback(f"step {t}: {len(got.fits)} backwards for {len(groups)} groups of micro-batches")
    if not math.isclose(got.unclip, numbers.unclip, rel_tol=1e-6):
        raise Fallback(f"step {t}: clips read {got.unclip} and {numbers.unclip}")
    numbers.items, numbers.loss_sum, numbers.own_items = got.items, got.loss_sum, True
    numbers.sequences = sum(rows for _, rows in groups)
    numbers.fits = [replace(f, batches=b, sequences=rows) for f, (b, rows) in zip(got.fits, groups)]
    # the engine's weights hold everything .grad took but a clip, as the recompute oracle's fit does; a
    # change after the last backward that is no single factor is what only a replay can weigh
    if rec.ranks is None and not math.isfinite(numbers.rescaled):
        raise Fallback(f"step {t}: .grad changed after the last backward by no single factor")
    numbers.weights = list(got.weights)  # the scales are the recorder's own (record.py)
    numbers.leak, numbers.leak_coef = got.leak, got.leak_coef
    numbers.rel, numbers.factor, numbers.factor_resid = got.rel, got.factor, got.factor_resid
    numbers.gg, numbers.gt, numbers.tt = got.gg, got.gt, got.tt


def autocast_said(rec: Recorder) -> list[str]:
    """Autocast, as a reason the engine's figures are not verify's (the float32 figure is the replay's)."""
    return [] if rec.how.autocast is None else [f"the loop ran under autocast ({rec.how.autocast[1]})"]


def no_autocast(rec: Recorder) -> None:
    for why in autocast_said(rec):
        raise Fallback(why)


def take_over(rec: Recorder, first: bool) -> bool:
    """Told of each backward once the engine has read it (``first``: its window's first): where the engine
    cannot judge it (a limit of its own, or autocast), the recompute oracle takes the run over from this
    window, which has not reached .grad yet, with no second run; later in a window, only a second run can
    (``Fallback``). Returns True where the recompute oracle took over."""
    eng = rec.engine
    assert eng is not None  # the engine calls this only while it judges (a paused one does not)
    why = list(eng.blind) + autocast_said(rec)
    if not why:
        return False
    if not first:
        rec.give_up(f"step {len(rec.steps)}: {', '.join(why)}")
        return False  # a job goes on in place until its next exchange, where every rank gives it up
    n = len(rec.steps)
    rec.switched = f"recompute{f' from step {n}' if n else ''} ({', '.join(why)})"
    rec.replay_from_here()
    return True


def same_oracle(eng: InPlace, rec: Recorder, items: int, batches: list[Any]) -> None:
    """Check 1 of the module docstring: replay ``batches`` through ``item_losses`` on the shadow (the
    parameters the window started from: the optimizer has not stepped) and compare the replay's gradient
    with the engine's sum O, which holds exactly these batches' backwards. Each parameter's replayed
    gradient is consumed as it arrives (a post-accumulate hook takes its float64 dot products with O and
    frees it): no second parameter-sized buffer. Raises ``Fallback`` where the two differ."""
    no_autocast(rec)  # the replay is float32: under autocast the two would differ by its rounding
    leaves = rec.sync()
    pairs = []
    for p, leaf, on in zip(rec.params, leaves, rec.trainable):
        leaf.requires_grad_(on)  # what the loop's forward differentiated
        if on:
            pairs.append((leaf, eng.sum_of(p)))  # None: the run's backward never reached it
    dots = torch.zeros(2, 2, dtype=torch.float64)  # <O,O>, <O,O'>, <O',O'>
    scratch = scratch_for(2, leaves[0].device)
    reached: set[int] = set()  # the leaves whose <O,O> came with their replayed gradient

    def into(buf: torch.Tensor | None) -> Any:
        def seen(leaf: torch.Tensor) -> None:
            g = gram([[buf], [leaf.grad]], scratch=scratch)
            if id(leaf) in reached:  # <O,O> once per parameter, however many batches the replay runs
                g[0, 0] = 0.0
            dots.add_(g)  # <O,O> from the same pass as <O,O'> and <O',O'>: O read once, not twice
            reached.add(id(leaf))
            leaf.grad = None

        return seen

    handles = [leaf.register_post_accumulate_grad_hook(into(buf)) for leaf, buf in pairs]  # type: ignore[no-untyped-call]  # unannotated in torch
    eng.paused, replayed = True, 0
    try:
        with exact(Replay()):
            for batch in batches:
                losses = checked_losses(
                    rec.item_losses, rec.shadow, to_device(batch, leaves[0].device), check_finite=False
                )
                replayed += losses.numel()
                total = losses.sum()
                if total.requires_grad:
                    torch.autograd.backward(total, inputs=[leaf for leaf, _ in pairs])
    finally:
        eng.paused = False
        for h in handles:
            h.remove()
        for leaf, _ in pairs:
            leaf.grad = None
    for leaf, buf in pairs:  # a parameter the replay never reached still has its <O,O>
        if buf is not None and id(leaf) not in reached:
            dots[0, 0] += float(gram([[buf]], scratch=scratch[:1])[0, 0])
    oo, oq, qq = float(dots[0, 0]), float(dots[0, 1]), float(dots[1, 1])
    gap = dist(oo, oq, qq, 1.0) / math.sqrt(oo) if oo > 0 else (0.0 if qq == 0 else math.inf)
    if replayed != items or not gap <= ROUNDING_FLOOR:
        raise Fallback(
            f"the loop's loss calls held {items} items and item_losses {replayed}, their gradients {gap:.1e} "
            "apart: the loop's loss is not item_losses' mean"
        )


def rng_state() -> dict[str, Any]:
    """The random state a rerun starts from: torch's (CPU and CUDA), Python's, NumPy's where imported."""
    import random
    import sys

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # unannotated in torch
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random
    import sys

    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


__all__ = ["rng_state", "same_oracle", "set_rng_state", "take", "take_over"]
