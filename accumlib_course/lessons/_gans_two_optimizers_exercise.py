"""Lesson 6's exercise: an accumulated GAN loop, its setup, and how it is graded: verify's verdict on D,
with the GAN's own explanation of a mismatch (the share of G's gradient that leaked into D), and G's
every step against G's own large-batch gradient (``g_findings``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from accumlib import compare, grads_of, true_gradient
from accumlib.tolerances import COEF_RTOL, FIT_RTOL, FLOAT32_RTOL

from ._gans_two_optimizers_model import bce, d_item_losses, discriminator_loss, make_gan, noise, real_points

# --- the exercise: D's side of an accumulated GAN loop, checked by accumlib.verify -------------------


def d_loss(D: nn.Module, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """D's mean loss over a micro-batch of fakes (label 0) and reals (label 1)."""
    return discriminator_loss(D, fake, real)


def g_loss(D: nn.Module, fake: torch.Tensor) -> torch.Tensor:
    """G's mean loss over a micro-batch: D should call every fake real."""
    return bce(D(fake), 1.0).mean()


@dataclass
class GanSetup:
    """What ``accumlib.verify`` needs to judge D's steps in a loop that also trains G."""

    G: nn.Module
    g_opt: torch.optim.Optimizer
    D: nn.Module
    dataset: torch.utils.data.Dataset
    item_losses: Callable[[nn.Module, Any], torch.Tensor]


def exercise(n: int = 64, seed: int = 0) -> GanSetup:
    """A fresh G (with its optimizer), a fresh D, a dataset of (noise, real point) pairs, and D's item losses.

    D's items are the fakes and the reals of a micro-batch; the fakes come from the live G,
    which the loop steps only after D, so a window's fakes are the ones D's oracle sees.
    """
    G, D = make_gan(seed)
    dataset = torch.utils.data.TensorDataset(noise(n, seed + 1), real_points(n, seed))

    def item_losses(D: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        z, x = batch
        with torch.no_grad():
            fake = G(z)
        return torch.cat([bce(D(fake), 0.0), bce(D(x), 1.0)])

    return GanSetup(G, torch.optim.Adam(G.parameters(), lr=1e-3), D, dataset, item_losses)


# --- grading the exercise: verify's verdict on D, with the GAN's own explanation of a mismatch -------

EXERCISE_K, EXERCISE_BATCH, EXERCISE_N = 4, 8, 64  # 64 pairs in micro-batches of 8: two full windows of k = 4


@dataclass(frozen=True)
class GanFinding:
    """A finding in the same shape as verify's (code, message, severity), for what only a GAN can do."""

    code: str
    message: str
    severity: str = "bug"
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class GanReport:
    """verify's report on D's steps, with ``unexplained`` replaced by the GAN mistake that explains it, when
    one does.
    """

    ok: bool
    findings: tuple[Any, ...]
    verify_report: Any

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    @property
    def steps(self) -> Any:
        return self.verify_report.steps


class _Stop(Exception):
    pass


def leak_share(train_fn: Callable[..., Any], seed: int = 0) -> float | None:
    """Run ``train_fn(G, D, g_opt, d_opt, loader)`` to D's first step; how far D's ``.grad`` is from own +
    leak.

    Returns ``|D.grad - (own + leak)| / |own + leak|`` for the first window, where ``own`` is
    the gradient of D's loss over the window and ``leak`` the gradient of G's loss (divided like
    D's) with respect to D; ``None`` if D never stepped. Near 0: D stepped on the leak as well.
    """
    ex = exercise(EXERCISE_N, seed)
    d_opt = torch.optim.SGD(ex.D.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(ex.dataset, batch_size=EXERCISE_BATCH)
    window = [tuple(t) for t, _ in zip(loader, range(EXERCISE_K))]
    with torch.no_grad():
        fakes = [ex.G(z) for z, _ in window]  # G before any step: the fakes of the first window
    seen: dict[str, Any] = {}

    def at_step(opt: Any, a: Any, kw: Any) -> None:
        seen["grad"] = grads_of(ex.D)
        raise _Stop

    d_opt.register_step_pre_hook(at_step)
    try:
        train_fn(ex.G, ex.D, ex.g_opt, d_opt, loader)
    except _Stop:
        pass
    except Exception:  # the learner's code failing is verify's to report, not this explanation's
        return None
    if "grad" not in seen:
        return None
    D = make_gan(seed)[1]  # D before any step, as at the first window
    batches = [(f, torch.zeros(len(f))) for f in fakes] + [(x, torch.ones(len(x))) for _, x in window]
    own = true_gradient(D, batches, d_item_losses)
    leak = true_gradient(D, fakes, lambda D, f: bce(D(f), 1.0))  # G's loss, a mean over the window's fakes
    both = {name: own[name] + leak[name] for name in own}
    return compare(seen["grad"], both).rel_error


def g_findings(train_fn: Callable[..., Any], seed: int = 0) -> list[GanFinding]:
    """Run ``train_fn(G, D, g_opt, d_opt, loader)`` once more and judge G's every step.

    G's true window gradient is that of the mean of G's loss over the window's noise, each micro-batch's
    fakes judged by D as it was when G made them (a copy of D taken at each of G's forwards with grad
    on), at G's parameters before the step. ``[]`` when every G step matched it to float32 rounding or
    the loop raised (verify reports that).
    """
    ex = exercise(EXERCISE_N, seed)
    d_opt = torch.optim.SGD(ex.D.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(ex.dataset, batch_size=EXERCISE_BATCH)
    window: list[tuple[torch.Tensor, nn.Module]] = []  # (noise, D as G's loss sees it) since G's last step
    seen: list[tuple[int, str, float]] = []  # (step, what, factor) per G step that did not match
    prev: dict[str, Any] = {}

    def g_forward(module: Any, args: Any) -> None:
        if torch.is_grad_enabled() and not any(args[0] is z for z, _ in window):
            window.append((args[0], copy.deepcopy(ex.D)))

    def g_step(opt: Any, a: Any, kw: Any) -> None:
        step = len(prev.get("steps", []))
        prev.setdefault("steps", []).append(len(window))
        got = {n: p.grad.detach().clone() for n, p in ex.G.named_parameters() if p.grad is not None}
        if not got or not window:
            seen.append((step, "g-no-gradient", 0.0))
        else:
            G = copy.deepcopy(ex.G)
            n = sum(len(z) for z, _ in window)
            loss = sum(bce(D(G(z)), 1.0).sum() for z, D in window) / n
            true = dict(
                zip(
                    (name for name, _ in G.named_parameters()),
                    torch.autograd.grad(loss, list(G.parameters())),
                )
            )
            true = {name: true[name] for name in got}
            what, c = _g_verdict(got, true, prev.get("true"))
            if what:
                seen.append((step, what, c))
            prev["true"] = true
        window.clear()

    hooks = [ex.G.register_forward_pre_hook(g_forward), ex.g_opt.register_step_pre_hook(g_step)]
    try:
        train_fn(ex.G, ex.D, ex.g_opt, d_opt, loader)
    except Exception:  # the learner's code failing is verify's to report, not G's verdict
        return []
    finally:
        for h in hooks:
            h.remove()
    steps = prev.get("steps", [])
    windows = -(-len(loader) // EXERCISE_K)
    if not steps:
        return [
            GanFinding(
                "g-never-stepped", "g_opt never stepped: G never trained, so D's opponent stayed as it was"
            )
        ]
    found: list[GanFinding] = []
    if len(steps) > windows:
        found.append(
            GanFinding(
                "g-early-step",
                f"G stepped {len(steps)} times for {windows} windows of {EXERCISE_K} "
                "micro-batches: more often than once per window",
                steps=tuple(range(len(steps))),
            )
        )
    for what in ("g-no-gradient", "g-unscaled-sum", "g-misscaled", "g-no-zero-grad", "g-unexplained"):
        at = tuple(t for t, w, _ in seen if w == what)
        if at and not (found and what != "g-no-gradient"):
            cs = [c for t, w, c in seen if w == what]
            found.append(GanFinding(what, _G_MESSAGES[what].format(c=cs[0], k=EXERCISE_K), steps=at))
    return found


_G_MESSAGES = {
    "g-no-gradient": "G's step saw no gradient: G's loss never went backward into G's parameters before "
    "g_opt.step()",
    "g-unscaled-sum": "G's step is about {k} x G's true window gradient (c = {c:.3f}): G's loss reached "
    "backward undivided",
    "g-misscaled": "G's step is G's true window gradient times one factor c = {c:.3f}, not 1",
    "g-no-zero-grad": "G's step held the previous window's G gradient as well: G's .grad was not zeroed "
    "after its step",
    "g-unexplained": "G's step differs from G's true window gradient (relative error {c:.2e}) in a way no "
    "known bug explains",
}


def _g_verdict(got: dict[str, torch.Tensor], true: dict[str, torch.Tensor], before: Any) -> tuple[str, float]:
    """('', 1) for a G step that matches its window's true gradient, else the name of what went wrong and a
    number.
    """
    rel = compare(got, true).rel_error
    if rel <= FLOAT32_RTOL:
        return "", 1.0
    gt = sum(float((got[n] * true[n]).sum()) for n in true)
    tt = sum(float((true[n] * true[n]).sum()) for n in true)
    c = gt / tt if tt else 0.0
    if c and compare(got, {n: c * true[n] for n in true}).rel_error <= FIT_RTOL:
        return ("g-unscaled-sum", c) if abs(c - EXERCISE_K) <= COEF_RTOL * EXERCISE_K else ("g-misscaled", c)
    if before is not None and compare(got, {n: true[n] + before[n] for n in true}).rel_error <= FIT_RTOL:
        return "g-no-zero-grad", 1.0
    return "g-unexplained", rel


def verify_gan_exercise(train_fn: Callable[..., Any]) -> GanReport:
    """``accumlib.verify`` on D's steps in the learner's loop, a GAN-specific finding where verify has no name
    for it, and G's steps judged against G's own large-batch gradient."""
    from accumlib import verify

    ex = exercise(EXERCISE_N, 0)
    report = verify(
        lambda D, d_opt, loader: train_fn(ex.G, D, ex.g_opt, d_opt, loader),
        model=ex.D,
        dataset=ex.dataset,
        item_losses=ex.item_losses,
        accum_steps=EXERCISE_K,
        batch_size=EXERCISE_BATCH,
    )
    findings = list(report.findings)
    if "unexplained" in report.codes:
        share = leak_share(train_fn)
        if share is not None and share < FLOAT32_RTOL:
            at = next(i for i, f in enumerate(findings) if f.code == "unexplained")
            findings[at] = GanFinding(
                "leak-into-D",
                "D stepped on its own window gradient plus the gradient of G's loss with respect to D's "
                "parameters (the leak of section 1): D's .grad equals own + leak to float32 rounding",
                steps=findings[at].steps,
            )
    g = g_findings(train_fn)
    return GanReport(bool(report.ok) and not g, tuple(findings) + tuple(g), report)
