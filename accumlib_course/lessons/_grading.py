"""What an exercise's grader checks beside verify's verdict: the run as the learner's loop ran it.

``Watch`` wraps the learner's ``train_fn`` for one verify run and records what verify does not
judge but an exercise asks for: the value the loop returns (the epoch loss it reports), the
parameters it froze, and where it clipped (before the optimizer step, or after it). ``checks``
turns that record into ``Check`` findings, each naming the steps it concerns. Steps are counted
from 0, as in verify's table.

>>> where((3,), 4), where((0, 2), 4), where((0, 1, 2, 3), 4)
('the last step (step 3)', 'steps 0, 2', 'every step (steps 0-3)')
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from accumlib.observe import on_clip
from accumlib.tolerances import FLOAT32_RTOL

# The codes a grader adds to verify's (``accumlib.CODES``): what
# an exercise asks beyond an exact accumulation.
GRADER_CODES: dict[str, str] = {
    "logged-loss-wrong": "the epoch loss the loop returns is not the mean item loss, beyond float32 rounding",
    "logged-loss-tensor": "the loop returns its running loss as a tensor (holding the autograd graph), not a "
    "number",
    "no-logged-loss": "the loop returns no epoch loss where the exercise asks for one",
    "frozen-parameter": "the loop froze parameters (requires_grad=False) the large batch trains",
    "clip-after-step": "a clip by norm ran after the step, on a gradient no step used",
    "no-clip": "a step of an exercise that clips every step ran without a clip",
    "leak-into-D": "D stepped on its own window gradient plus G's loss's gradient with respect to D (lesson "
    "6)",
    "g-never-stepped": "G's optimizer never stepped (lesson 6)",
    "g-no-gradient": "G stepped without a gradient (lesson 6)",
    "g-unscaled-sum": "G's step is about k x G's window gradient (lesson 6)",
    "g-misscaled": "G's step is G's window gradient times one factor c != 1 (lesson 6)",
    "g-no-zero-grad": "G's step held the previous window's G gradient (lesson 6)",
    "g-early-step": "G stepped more often than once per window (lesson 6)",
    "g-unexplained": "G's step differs from G's window gradient in a way no known bug explains (lesson 6)",
}


@dataclass(frozen=True)
class Check:
    """A finding of the grader's own, in the shape of verify's (code, message, steps, severity)."""

    code: str
    message: str
    steps: tuple[int, ...] = ()
    severity: str = "bug"


def where(steps: tuple[int, ...], n_steps: int | None) -> str:
    """The steps a finding concerns, in words: ``the last step (step 3)``, ``steps 0, 2``, ``every step``."""
    if not steps:
        return ""
    if n_steps and len(steps) == n_steps and n_steps > 1:
        return f"every step (steps 0-{n_steps - 1})"
    if n_steps and steps == (n_steps - 1,):
        return f"the last step (step {n_steps - 1})"
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


@dataclass
class Watch:
    """The learner's loop, wrapped: what it returned, what it froze, where it clipped."""

    clip_each_step: bool = False
    returned: Any = None
    ran: bool = False
    steps: int = 0
    frozen: dict[str, list[int]] = field(default_factory=dict)  # parameter name -> the steps it was frozen at
    all_frozen: bool = False  # every parameter frozen when the loop last stepped or at the end
    forwards: int = 0  # forwards since the last step
    clipped: bool = False  # a clip since the window's first forward
    # steps whose gradient was clipped only after the step
    clip_after: list[int] = field(default_factory=list)
    unclipped: list[int] = field(default_factory=list)  # steps that ran without a clip
    # layers the loop swapped for another kind: "bn1: BatchNorm2d -> GroupNorm"
    replaced: list[str] = field(default_factory=list)

    def wrap(self, train_fn: Any) -> Any:
        def watched(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> Any:
            names = [n for n, _ in model.named_parameters()]
            layers = {n: type(m).__name__ for n, m in model.named_modules()}
            params = [p for _, p in model.named_parameters()]

            def before_step(opt: Any, args: Any, kwargs: Any) -> None:
                for n, p in zip(names, params):
                    if not p.requires_grad:
                        self.frozen.setdefault(n, []).append(self.steps)
                if not self.clipped:
                    self.unclipped.append(self.steps)
                self.steps, self.forwards, self.clipped = self.steps + 1, 0, False

            def forward(module: Any, args: Any) -> None:
                self.forwards += 1

            hooks = [optimizer.register_step_pre_hook(before_step), model.register_forward_pre_hook(forward)]

            def clip(params: Any, max_norm: float, total_norm: Any) -> None:
                if self.forwards == 0 and self.steps:
                    self.clip_after.append(self.steps - 1)
                elif self.forwards:
                    self.clipped = True

            # every clip by norm torch performs, whatever name the learner imported it by
            watch = on_clip(clip) if self.clip_each_step else contextlib.nullcontext()
            try:
                with watch:
                    self.returned = train_fn(model, optimizer, loader)
                self.ran = True
            finally:
                for h in hooks:
                    h.remove()
                self.all_frozen = bool(params) and not any(p.requires_grad for p in params)
                self.replaced = [
                    f"{n}: {layers[n]} -> {type(m).__name__}"
                    for n, m in model.named_modules()
                    if n in layers and type(m).__name__ != layers[n]
                ]
                if not self.ran:  # the loop raised: the parameters frozen now are the ones it froze
                    for n, p in zip(names, params):
                        if not p.requires_grad:
                            self.frozen.setdefault(n, [])
            return self.returned

        return watched


def frozen_check(watch: Watch, n_steps: int | None) -> Check | None:
    """Parameters the loop froze: a large batch trains every one of them."""
    if not watch.frozen:
        return None
    names = sorted(watch.frozen)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    steps = tuple(sorted({s for v in watch.frozen.values() for s in v}))
    if not watch.ran and watch.all_frozen:
        return Check(
            "frozen-parameter",
            f"every parameter of the model had requires_grad=False ({shown}), so the loss "
            "had nothing to send a gradient to and backward() stopped (PyTorch: 'element 0 of tensors does "
            "not require grad'). The large batch trains every parameter.",
        )
    return Check(
        "frozen-parameter",
        f"{shown} had requires_grad=False at {where(steps, n_steps) or 'the end of the run'}: "
        "the optimizer never updated them there, while the large batch trains every parameter",
        steps,
    )


def logged_loss_checks(returned: Any, true_loss: float | None, codes: set[str]) -> list[Check]:
    """The epoch loss the loop returns, against the true mean item loss (float32 rounding:
    ``FLOAT32_RTOL``). A one-element tensor is its value, as verify reads it; one that still requires
    grad holds the autograd graph of every micro-batch it summed, and says so.
    """
    if true_loss is None or "logged-loss-scaled" in codes:
        return []
    out = []
    if isinstance(returned, torch.Tensor):
        if returned.requires_grad:
            out.append(
                Check(
                    "logged-loss-tensor",
                    "the loop returns a tensor that still holds the autograd graph of every micro-batch it "
                    "summed, not a Python number: a running loss kept that way keeps that memory alive until "
                    "the epoch ends",
                )
            )
        if returned.numel() != 1:
            return out + [
                Check(
                    "no-logged-loss",
                    f"the loop returns a tensor of {returned.numel()} numbers, not the one epoch loss it "
                    "trained on",
                )
            ]
        returned = float(returned.detach())  # a detached one keeps no graph: only its value counts
    if not isinstance(returned, numbers.Real) or isinstance(returned, bool):
        return [
            Check(
                "no-logged-loss",
                f"the loop returns {type(returned).__name__}, not the epoch loss it trained on",
            )
        ]
    r = float(returned)
    if not math.isfinite(r) or abs(r - true_loss) > FLOAT32_RTOL * abs(true_loss):
        ratio = f" ({r / true_loss:.3f} x the true value)" if true_loss else ""
        out.append(
            Check(
                "logged-loss-wrong",
                f"the loop reports an epoch loss of {r:.4f}, but the mean loss over every item of the epoch "
                f"is {true_loss:.4f}{ratio}",
            )
        )
    return out


def clip_checks(watch: Watch, n_steps: int | None) -> list[Check]:
    """Lesson 4 asks for every step's gradient to be clipped, before the step uses it."""
    if watch.clip_after:
        steps = tuple(sorted(set(watch.clip_after)))
        return [
            Check(
                "clip-after-step",
                f"the clip ran after the optimizer (scaler.step) had already stepped on the gradient of "
                f"{where(steps, n_steps)}: it clipped a gradient no step used, so no step was clipped",
                steps,
            )
        ]
    if watch.unclipped:
        steps = tuple(watch.unclipped)
        return [
            Check(
                "no-clip",
                f"no clip by norm ran between the window's last backward and the step at "
                f"{where(steps, n_steps)}: this exercise clips every window's gradient at max_norm=0.1 "
                "before the step",
                steps,
            )
        ]
    return []


# what verify's fits of an ``unexplained`` step found (``StepRow.fit``), and what that tells of the loop;
# of the fits the finding's steps found, the first in this order is said (``weights-unmet`` says nothing)
_FITS: dict[str, str] = {
    "micro-batch-weights": "one weight per micro-batch reproduces your update, but not weights that follow "
    "the micro-batches' item counts: your loop weighted the micro-batches differently from their item "
    "counts, where the large batch weighs every item the same",
    "no-weights": "no weight per micro-batch reproduces it either, so the difference is inside the "
    "micro-batches: the loss your loop backpropagated is not the one the model it was handed gives these "
    "items (its forward pass or its loss changed), whatever it was divided by",
    "no-rank-factor": "neither one factor for the whole job nor one per rank reproduces it: the items of "
    "one rank's window did not all weigh the same, where the large batch weighs every item 1/N",
}


def unexplained_check(finding: Any, rows: Any, n_steps: int | None, replaced: Any = ()) -> Check:
    """verify's ``unexplained``, in what the learner's loop did: at the step furthest off, the update's size
    against the true gradient's (|G|/|g*|), the angle between them (from the row's rel err), what the best
    rescaling of the loss would still leave, and what verify's fits say reproduces the update (or not).
    Read from the finding's steps and its rows (their numbers, ``fit`` and ``items_per_rank``), never from
    the finding's words.
    The steps are the Grade's to say (``where``)."""
    steps = tuple(getattr(finding, "steps", ()) or ())
    at = [r for r in rows if r.step in steps and math.isfinite(r.rel_error) and r.norm_ratio > 0]
    said = f"your loop replaced layers of the model ({', '.join(replaced)}), so " if replaced else ""
    if not at:
        text = "the update your loop stepped on differs from the true large-batch gradient in a way no "
        text += "division explains"
        return Check("unexplained", said + text, steps)
    worst = max(at, key=lambda r: r.rel_error)
    ratio, rel = worst.norm_ratio, worst.rel_error
    cos = max(-1.0, min(1.0, (ratio * ratio + 1 - rel * rel) / (2 * ratio)))
    angle = math.degrees(math.acos(cos))
    best = math.sin(math.radians(angle))  # |a G - g*| / |g*| at the best factor a
    if worst.fit == "no-rank-factor" and len(worst.items_per_rank) > 1:
        *n, last = map(str, worst.items_per_rank)
        held = f"{worst.items} items, {', '.join(n)} and {last} on the ranks, {worst.micro_batches} "
        held += "micro-batches on each"
    else:
        held = f"{worst.items} items in {worst.micro_batches} micro-batches"
    one = f"step {worst.step}" + (", the one furthest off," if len(at) > 1 else "")
    text = (
        f"{said}the update your loop stepped on pointed elsewhere than the true large-batch gradient: at "
        f"{one} it was {ratio:.2f} x the true gradient's size and {angle:.1f} degrees away from it "
        f"({held}). Dividing the loss by another number changes only the size, so none makes it right: the "
        f"best one still leaves it {best:.0%} off"
    )
    found = {r.fit for r in rows if r.step in steps}
    words = next((w for fit, w in _FITS.items() if fit in found), "")
    if words:
        text += ". " + words[0].upper() + words[1:]
    return Check("unexplained", text, steps)


__all__ = [
    "GRADER_CODES",
    "Check",
    "Watch",
    "clip_checks",
    "frozen_check",
    "logged_loss_checks",
    "unexplained_check",
    "where",
]
