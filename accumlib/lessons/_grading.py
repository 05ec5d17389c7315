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

from .._verify.clips import on_clip
from ..tolerances import FLOAT32_RTOL

# The codes a grader adds to verify's (``accumlib.CODES``): what
# an exercise asks beyond an exact accumulation.
GRADER_CODES: dict[str, str] = {
    "logged-loss-wrong": "the epoch loss the loop returns is not the mean item loss, beyond float32 rounding",
    "logged-loss-tensor": "the loop returns its running loss as a tensor (holding the autograd graph), not a "
    "number",
    "no-logged-loss": "the loop returns no epoch loss where the exercise asks for one",
    "frozen-parameter": "the loop froze parameters (requires_grad=False) the large batch trains",
    "clip-after-step": "clip_grad_norm_ ran after the step, on a gradient no step used",
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

    def wrap(self, train_fn: Any) -> Any:
        def watched(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> Any:
            names = [n for n, _ in model.named_parameters()]
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
    ``FLOAT32_RTOL``).
    """
    if true_loss is None or "logged-loss-scaled" in codes:
        return []
    if isinstance(returned, torch.Tensor):
        graph = (
            " that still holds the autograd graph of every micro-batch it summed"
            if returned.requires_grad
            else ""
        )
        return [
            Check(
                "logged-loss-tensor",
                f"the loop returns a tensor{graph}, not a Python number: a running loss "
                "kept as a tensor keeps that memory alive until the epoch ends",
            )
        ]
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
        return [
            Check(
                "logged-loss-wrong",
                f"the loop reports an epoch loss of {r:.4f}, but the mean loss over every item of the epoch "
                f"is {true_loss:.4f}{ratio}",
            )
        ]
    return []


def clip_checks(watch: Watch, n_steps: int | None) -> list[Check]:
    """Lesson 4 asks for every step's gradient to be clipped, before the step uses it."""
    if watch.clip_after:
        steps = tuple(sorted(set(watch.clip_after)))
        return [
            Check(
                "clip-after-step",
                f"clip_grad_norm_ ran after the optimizer (scaler.step) had already stepped on the gradient "
                f"of {where(steps, n_steps)}: it clipped a gradient no step used, so no step was clipped",
                steps,
            )
        ]
    if watch.unclipped:
        steps = tuple(watch.unclipped)
        return [
            Check(
                "no-clip",
                f"{where(steps, n_steps)} ran without clip_grad_norm_: this exercise clips every "
                "window's gradient at max_norm=0.1 before the step",
                steps,
            )
        ]
    return []


__all__ = ["GRADER_CODES", "Check", "Watch", "clip_checks", "frozen_check", "logged_loss_checks", "where"]
