"""Name what went wrong at each step, from the recorded gradients alone.

For a step over window W = b_1..b_m with N items, write h_j for micro-batch j's share of
the true gradient, grad(sum_{i in b_j} l_i) / N, so the oracle is g* = sum_j h_j (exactly,
unless BatchNorm couples the items). The captured gradient G is fitted as

    G  ~=  sum_j w_j h_j  +  c * L        (L: what .grad already held when the window began)

and the weights are read against what each bug predicts (v_j = w_j n_j / N is the weight of
micro-batch j's *mean*): correct w_j = 1; never divided v_j = 1; divided by k on a short tail
v_j = 1/k; per-micro-batch means with different n_j v_j = 1/m; zeroed mid-window w_j = 0 for
early j; not zeroed c = 1. Clipping recorded at the step is undone first (its coefficient is
known from the norm it saw), and the norm it saw tells scaled from unscaled gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..check import BF16_RTOL, FLOAT32_RTOL
from ._record import Recorder, Step, _rel, unclipped

# Fitted weights come from float32 (or bf16) gradients solved in float64: they land within
# ~1e-5 (~1e-2 under bf16) of the weight a bug predicts. The closest two predictions we
# tell apart differ by >= 12.5% (m/k = 7/8 vs 1 at k = 8), so 5% separates them.
COEF_RTOL = 0.05
# A fit that explains the captured gradient leaves float32 rounding (~1e-6, measured);
# anything unmodelled (clipping we did not see, a wrong item) leaves >= 1e-2.
FIT_RTOL = 1e-3
# GradScaler's scale is a power of two, 2**16 by default; a clip that saw unscaled
# gradients saw the same norm as the step (ratio 1 up to rounding).
SCALED_CLIP_RATIO = 2.0
# A loop's own loss bookkeeping may weigh micro-batches rather than items and may round
# in bf16 (a few %); a loss off by the accumulation factor k >= 2 is >= 50% off.
LOGGED_RTOL = 0.1


def step_tol(low_precision: bool) -> float:
    return BF16_RTOL if low_precision else FLOAT32_RTOL


def _near(a: float, b: float, rtol: float = COEF_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(b), 1e-12)


@dataclass
class StepVerdict:
    codes: list[str] = field(default_factory=list)
    detail: str = ""
    bn_diff: float | None = None
    clip_scale: float | None = None  # the whole window scaled by s < 1: clipping we did not see, if norms agree


def analyse(step: Step, *, k: int, is_tail: bool) -> StepVerdict:
    """Codes for one optimizer step (see the module docstring for the model)."""
    out = StepVerdict()
    m = len(step.batches)
    if step.skipped:
        out.detail = "GradScaler skipped this step (inf/nan in the scaled gradient), as designed"
        return out
    if m == 0:
        out.codes.append("early-step")
        out.detail = "stepped without a single micro-batch since the previous step"
        return out
    if not bool(torch.isfinite(step.grad).all()):
        out.codes.append("non-finite")
        return out
    if step.items == 0 or step.oracle is None:
        out.codes.append("no-items")
        return out
    if len(set(step.lrs)) > 1:
        out.codes.append("scheduler-per-micro-batch")
        out.detail = f"learning rates seen by the window's micro-batches: {[round(l[0], 6) for l in step.lrs]}"
    early = m < k and not is_tail
    if early:
        out.codes.append("early-step")
        out.detail = f"stepped after {m} of {k} micro-batches"
    if any(c.seen < m for c in step.clips):
        out.codes.append("clip-per-micro-batch")
        return out  # each clip rescaled a partial sum; no single coefficient undoes that
    tol = step_tol(step.low_precision)
    grad, complete = unclipped(step.grad, step.clips, m)  # the window gradient before clipping
    if complete:
        seen = complete[0].total_norm / max(float(grad.norm()), 1e-30)
        if seen > SCALED_CLIP_RATIO:
            out.codes.append("clip-before-unscale")
            out.detail = f"clipping saw a norm {seen:.3g} times the unscaled gradient's"
    if early:
        return out  # the window is wrong; its scale follows from that
    if _rel(grad, step.oracle) <= tol:
        return out
    assert step.parts is not None and step.part_items is not None
    accumulated = torch.stack(step.parts).sum(0)
    if step.batchnorm:
        out.bn_diff = _rel(accumulated, step.oracle)
        if _rel(grad, accumulated) <= tol:
            return out  # exactly what a correct accumulation gives; the gap is BatchNorm's
    basis = list(step.parts) + ([step.leak] if step.leak is not None else [])
    x = torch.stack(basis, dim=1)
    w = torch.linalg.lstsq(x, grad.unsqueeze(1)).solution.squeeze(1)
    resid = float((grad - x @ w).norm()) / max(float(grad.norm()), 1e-30)
    if resid > max(FIT_RTOL, tol):
        out.codes.append("unexplained")
        out.detail = f"no weighting of the window's micro-batches explains the gradient (residual {resid:.2e})"
        return out
    weights = w[:m].tolist()
    if step.leak is not None and float(w[m]) > 0.5:
        out.codes.append("no-zero-grad")
        out.detail = f"the gradient held {float(w[m]):.2f} x what .grad contained before the window began"
    near0 = [abs(x) < COEF_RTOL for x in weights]
    if any(near0):
        if not all(near0):
            out.codes.append("zero-grad-inside-window")
            out.detail = f"micro-batches weighted {[round(x, 3) for x in weights]} (1 is right)"
        elif "no-zero-grad" not in out.codes:
            out.codes.append("unexplained")
        return out
    if all(_near(x, 1.0) for x in weights):
        return out
    n, big_n = step.part_items, step.items
    v = [x * nj / big_n for x, nj in zip(weights, n)]
    unequal = len(set(n)) > 1
    out.detail = f"each micro-batch mean weighted {[round(x, 3) for x in v]}, items {n}"
    if all(_near(x, v[0]) for x in v):
        if _near(v[0], 1.0) and m > 1:
            out.codes.append("unscaled-sum")
            return out
        if m < k and _near(v[0] * k, 1.0):
            out.codes += ["tail-misscaled"] + (["mean-of-means"] if unequal else [])
            return out
        if unequal and _near(v[0] * m, 1.0):
            out.codes.append("mean-of-means")
            return out
    if m < k and all(_near(x, m / k) for x in weights):
        out.codes.append("tail-misscaled")
        return out
    out.codes.append("unexplained")
    if step.leak is None and weights[0] < 1 and all(_near(x, weights[0]) for x in weights):
        out.clip_scale = weights[0]
    return out


# Clipping to max_norm c leaves every clipped step with ||G|| = c; float32 rounding moves it ~1e-7.
CLIP_NORM_RTOL = 1e-3


def explained_by_clipping(verdicts: list[StepVerdict], steps: list[Step]) -> bool:
    """Steps scaled uniformly by s < 1 are a clip by norm (one we did not intercept) when all of
    them end at one norm c and every unscaled step's norm is at most c."""
    scaled = [float(st.grad.norm()) for v, st in zip(verdicts, steps) if v.clip_scale is not None]
    if not scaled:
        return False
    c = max(scaled)
    unscaled = [float(st.grad.norm()) for v, st in zip(verdicts, steps) if not v.codes and st.oracle is not None]
    return all(_near(x, c, CLIP_NORM_RTOL) for x in scaled) and all(x <= c * (1 + CLIP_NORM_RTOL) for x in unscaled)


FIXES = {
    "unscaled-sum": "divide each micro-batch's loss so the window's items weigh 1/N each: (losses.sum() / n_items_in_window).backward()",
    "mean-of-means": "weigh items, not micro-batches: count the window's items N first, then backward losses.sum() / N",
    "tail-dropped": "step the last, partial window too (`if (i + 1) % k == 0 or i + 1 == len(loader)`), dividing it by its own item count, not by k (accumlib.ragged does both)",
    "tail-misscaled": "divide the last window by its own item count, not by k micro-batches' worth",
    "zero-grad-inside-window": "call optimizer.zero_grad() only right after optimizer.step(), and divide .grad (if at all) once, after the last micro-batch",
    "no-zero-grad": "call optimizer.zero_grad(set_to_none=True) after every optimizer.step()",
    "early-step": "step once per window: when (i + 1) % accum_steps == 0 or at the last micro-batch",
    "scheduler-per-micro-batch": "call scheduler.step() next to optimizer.step(), once per window",
    "clip-per-micro-batch": "clip once, after the window's last backward and right before optimizer.step()",
    "clip-before-unscale": "call scaler.unscale_(optimizer) before clip_grad_norm_",
    "logged-loss-scaled": "log the undivided loss (or multiply back by the divisor) when reporting",
    "batchnorm": "replace BatchNorm with GroupNorm or LayerNorm, or accept per-micro-batch statistics",
    "dropout": "nothing to fix for accumulation; dropout masks are random in any loop",
    "unexplained": "compare the loop with accumlib.ragged line by line; print(report) shows where it differs",
    "non-finite": "lower the learning rate or check the data; with GradScaler, make sure it can skip steps",
    "no-items": "make sure every window holds at least one item the loss counts",
}


def logged_loss_off(logged: float, true: float, k: int) -> bool:
    """True when the reported loss is about k times (or 1/k times) the true mean item loss."""
    if k < 2 or not math.isfinite(logged) or true == 0 or not math.isfinite(true):
        return False
    r = logged / true
    return not _near(r, 1.0, LOGGED_RTOL) and (_near(r * k, 1.0, LOGGED_RTOL) or _near(r / k, 1.0, LOGGED_RTOL))


def coverage(rec: Recorder, batch_size: int) -> tuple[int, int, int, float]:
    """(items stepped, items never stepped, items forwarded but never stepped, their loss sum)."""
    stepped_idx = {i for b in rec.stepped for i in rec.indices[b]}
    left = [i for i in range(len(rec.dataset)) if i not in stepped_idx]
    missing = 0
    for s in range(0, len(left), batch_size):
        missing += rec.count_and_loss(rec.collate([rec.dataset.dataset[i] for i in left[s:s + batch_size]]))[0]
    seen_items, seen_loss = 0, 0.0
    for b in rec.window:  # forwarded after the last step: the loop saw them, no step used them
        n, loss = rec.count_and_loss(rec.batches[b])
        seen_items, seen_loss = seen_items + n, seen_loss + loss
    return sum(s.items for s in rec.steps), missing, seen_items, seen_loss
