"""The diagnose stage: name what went wrong at a step, from its numbers alone (a pure function);
the rules across a run's steps are ``diagnose_run``'s.

The verdict is exact: a step is ok only when the gradient the optimizer saw, G (clipping it
recorded undone), matches the reference within rounding: the float32 oracle, or, where the
loop ran under autocast, a replay of the window's micro-batches in the loop's own dtype,
weighted exactly. Nothing below turns a failed step into an ok one; it only names the failure.

Names come from the per-micro-batch weights w_j the oracle stage fitted (see
``accumlib._verify.window_oracle``; 1 is right), read against what each bug predicts, with
v_j = w_j n_j / N the weight of micro-batch j's *mean*:
  never divided v_j = 1;  divided by k on a short tail v_j = 1/k (equal: w_j = m/k);
  per-micro-batch means with different n_j v_j = 1/m;  zeroed mid-window w_j = 0 for early j;
  not zeroed: the leak coefficient is 1;  one factor for all: w_j = c != 1 (misscaled), however small
  (a mean divided by k x b gives c = 1/b: small, but the same for every j, so not a zeroing);
  means with different n_j all weighted v (a mean divided by N, as if it were a sum: v = 1/N):
  mean-of-means, and misscaled by c = v m against the mean of means (1/b again);
  a late window (m > k micro-batches: late-step, whatever its gradient) divided by k: c = m/k, which its
  length explains, so no misscale is named; any other factor is one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..tolerances import AUTOCAST_RTOL, COEF_RTOL, FIT_RTOL, FLOAT32_RTOL, SAME_FACTOR_RTOL, SCALED_CLIP_RATIO
from .rounding import counted_before_shift, run_tol
from .step_numbers import Clip, StepNumbers

# What the fits of an ``unexplained`` step found, as its detail words it: per-micro-batch weights that
# reproduce G but are no known bug's, weights of one factor that G does not follow (.grad changed where no
# weight saw it), no weighting of the micro-batches that reproduces G, and (a job) no per-rank or common
# factor that does
Fit = Literal["micro-batch-weights", "weights-unmet", "no-weights", "no-rank-factor"]


@dataclass
class StepVerdict:
    codes: list[str] = field(default_factory=list)
    detail: str = ""
    factor: float | None = None  # misscaled: the one factor c
    cause: str = ""  # misscaled: the known cause c matches, if any
    batchnorm_limit: bool = False  # right as an accumulation; BatchNorm keeps it from the large batch
    clip_assumed: bool = False  # ok against the truth clipped at the run's assumed max_norm (``infer_clip``)
    masked: bool = False  # misscaled, but a recorded clip made the update equal the correct one
    window_scale: bool = False  # late-step: c = m/k, each micro-batch divided by k over m > k of them
    fit: Fit | None = None  # unexplained: what the fits found (the detail's words, as data)


def step_tol(precision: str) -> float:
    """float32 rounding for a float32 loop; the autocast replay's rounding otherwise."""
    return FLOAT32_RTOL if precision == "float32" else AUTOCAST_RTOL


def near(a: float, b: float, rtol: float) -> bool:
    """|a - b| within rtol of |b| (and of 1e-12, so b = 0 compares too)."""
    return abs(a - b) <= rtol * max(abs(b), 1e-12)


# Known causes of one factor c, as (prediction, what it means, how to fix it). Each prediction is
# exact, so a match is tight; the explanation names the quantities, the table shows each step's c.
CAUSES = {
    "hook": (
        "a function hooked on the parameters' gradients (Tensor.register_hook) changes what every backward "
        "deposits in .grad, so the loss was not the only thing scaling the gradient (the hook: {hooks})",
        "remove the gradient hook, or make it return the gradient unchanged, and scale the loss instead: "
        "the window's summed item losses divided by its item count N",
    ),
    "rescaled": (
        ".grad was multiplied by {r:.4g} after the window's last backward and before the step (a "
        "p.grad.mul_ or div_ in the loop: neither a clip torch performed nor GradScaler's unscale_)",
        "rescale .grad by exactly 1/N of the window's summed item losses (or not at all, dividing the loss "
        "by N instead): any other factor is the c in the table",
    ),
    "shift": (
        "c = N/(N+S) at every step (N items, S sequences): one item too many per sequence, i.e. a causal "
        "LM's "
        "labels were counted before the shift",
        "count labels[:, 1:] != -100, after the shift; with a transformers Trainer whose model has loss_type "
        "None "
        "(GPT2LMHeadModel among others), set model.loss_type = 'ForCausalLM' "
        "(the trace: docs/transformers-label-count.md in the accumlib repository)",
    ),
    "virtual-tokens": (
        "c = N/(N-S) at every step (N items, S sequences): one item too few per sequence, i.e. a PEFT "
        "prompt-learning model (prompt tuning, p-tuning) scores each sequence's first token from its last "
        "virtual token, but the count took labels[:, 1:] of the unpadded labels",
        "divide by the labels the model scores (labels != -100 after PEFT prepends its virtual tokens: the "
        "first token counts); the trace: docs/trl-peft-bugs.md in the accumlib repository",
    ),
    "1/R": (
        "c = 1/R (R ranks): the loss was divided by the rank count on top of DDP's own mean over ranks",
        "DDP already averages the ranks' gradients: divide by the job's item count N and multiply by R once, "
        "or divide by each window's share N / R, not by R again",
    ),
    "R": (
        "c = R (R ranks): the ranks' gradients were summed where DDP averages, or the loss was multiplied by "
        "R twice",
        "scale each rank's summed loss by R / N once (DDP's mean over ranks divides by R)",
    ),
    "1/k": (
        "c = 1/k: the loss was divided by k once too often",
        "divide by the window's item count N once, not by k as well",
    ),
    "k": (
        "c = k: the loss was multiplied by k, or a mean was taken over 1/k of the items",
        "divide by the window's item count N",
    ),
    "1/m": (
        "c = 1/m: the window's mean was divided by its micro-batch count again",
        "divide by the window's item count N once",
    ),
    "constant": (
        "c = N/D at every step with one divisor D for the whole run: the loss was divided by a constant "
        "(a fixed token budget, a max length times the batch), not by each window's own item count N",
        "divide each window's summed item losses by that window's own item count N (count it before the "
        "backward)",
    ),
    "reduction": (
        "c = d or 1/d for a whole number d, matching no count of the window: item_losses may reduce each "
        "item "
        "differently from the loop (a mean over an item's d outputs or terms where the loop sums them, or "
        "the reverse), in which case item_losses, not the loop, is what to fix",
        "first check that item_losses(model, batch) returns, per item, exactly the term the loop's loss adds "
        "up (same reduction over outputs, same extra terms); if it does, divide the loop's summed item "
        "losses by the window's item count N",
    ),
    "divisor": (
        "c = 1/d for a whole number d = {d} that matches no count of the window: the loss was divided by d "
        "(a gradient_accumulation_steps left in the loss of a run that steps every micro-batch, a world "
        "size, a fixed number of micro-batches)",
        "divide the window's summed item losses by its item count N and nothing else: a mean loss of a "
        "window of one micro-batch needs no further division",
    ),
    "1/b": (
        "c = m/N = 1/b (a short last window divided by k x b: (m/k)/b): each micro-batch's mean was divided "
        "by its "
        "item count b again (and by k, or by the window's N), as if it were a sum",
        "a mean is already divided by its b items: divide the mean by k, or the sum by N, not the mean by k "
        "x b",
    ),
}


def causes(
    c: float,
    *,
    m: int,
    k: int,
    items: int,
    sequences: int,
    rtol: float,
    ranks: int = 1,
    own_items: bool = False,
) -> str:
    """The key of the known cause a factor matches (see ``CAUSES``), or ''. ``own_items``: the items are
    the run's own loss calls' (``StepNumbers.own_items``): a whole-number 1/c is then a divisor of the
    script's own, not item_losses reducing an item otherwise than the loop."""
    # a sequence adds one unpredicted label only where items are tokens: more items than sequences
    known = [("1/R", 1 / ranks), ("R", float(ranks))] if ranks > 1 else []
    known += (
        [("shift", items / (items + sequences)), ("virtual-tokens", items / (items - sequences))]
        if 0 < sequences < items
        else []
    )
    known += [("1/k", 1 / k), ("k", float(k))] + ([("1/m", 1 / m)] if m > 1 else [])
    if items > m:  # over-division: each micro-batch's mean divided by its b items again, as if it were a sum
        known += [("1/b", m / items)]  # by k x b in a full window, or by the window's own N
        known += [("1/b", m * m / (k * items))] if m < k else []  # a short tail divided by k x b: (m/k) (1/b)
    for key, value in known:
        if near(c, value, rtol):
            return key
    d = round(c) if c >= 1 else round(1 / c) if c > 0 else 0
    if d >= 2 and near(c, d if c >= 1 else 1 / d, rtol):  # a whole ratio no count explains: a reduction
        return "divisor" if own_items and c < 1 else "reduction"
    return ""


def diagnose(n: StepNumbers, *, k: int) -> StepVerdict:
    """Codes for one optimizer step (see the module docstring for the model)."""
    out = StepVerdict()
    m = n.micro_batches
    if not n.all_ranks:
        out.codes.append("uneven-steps")
        out.detail = "another rank's run had ended before this step: no job-wide oracle to judge it against"
        return out
    if n.skipped:
        out.detail = "GradScaler skipped this step (inf/nan in the scaled gradient), as designed"
        return out
    if m == 0:
        if n.untracked:
            out.codes.append("untracked-data")
            out.detail = (
                f"{n.untracked} forward(s) since the previous step ran on data verify did not hand out"
            )
        else:
            out.codes.append("early-step")
            out.detail = "stepped without a single micro-batch since the previous step"
        return out
    if not n.finite:
        out.codes.append("non-finite")
        return out
    if n.items == 0:
        out.codes.append("no-items")
        return out
    if n.lr_changed or len(set(n.lrs)) > 1:
        out.codes.append("scheduler-per-micro-batch")
        out.detail = f"learning rates seen by the window's micro-batches: {[round(x[0], 6) for x in n.lrs]}"
    if n.frozen_changed:  # judged per micro-batch as the loop ran it, but no large batch does this
        out.codes.append("frozen-inside-window")
    # a short window is legitimate only as the tail of a pass: it ends the pass and holds what is
    # left of the pass's micro-batches once full windows are taken (by its place, not by dataset index)
    early = m < k and not (n.epoch_end and m == n.pass_length % k)
    if early:
        out.codes.append("early-step")
        out.detail = f"stepped after {m} of {k} micro-batches, not as the last window of a pass over the data"
    # a long window is never legitimate (a pass's tail is shorter than k, never longer): it trains on a
    # larger batch than asked even where its gradient is its own window's large batch exactly
    if m > k:
        out.codes.append("late-step")
    # a clip with no micro-batch of this window before it ran after the previous step: it cut a gradient
    # no step used (zero_grad discards it), so it is no clip of this window, partial or whole
    if any(0 < c.seen < m for c in n.clips):
        out.codes.append("clip-per-micro-batch")
        return out  # each clip rescaled a partial sum; no single coefficient undoes that
    complete = [c for c in n.clips if c.seen >= m]
    g_norm = math.sqrt(n.gg) / n.unclip  # the window's gradient before clipping
    if complete and g_norm > 0:
        seen = complete[0].total_norm / g_norm
        if seen > SCALED_CLIP_RATIO and not compensated_clip(complete[0], g_norm):
            out.codes.append("clip-before-unscale")
            out.detail = f"clipping saw a norm {seen:.3g} times the unscaled gradient's"
    if early:
        return out  # the window is wrong; its scale follows from that
    tol = step_tol(n.precision)
    if n.precision == "float32" and n.ranks == 1 and not n.batchnorm:
        tol = run_tol(n)
    if n.ranks > 1:
        _job(n, out, m=m, k=k, tol=tol)
        return out
    if n.batchnorm and n.rel_merged <= tol:
        return out  # the loop ran the merged window itself (the large-batch loop): exact, BatchNorm included
    if n.rel <= tol:
        out.batchnorm_limit = n.batchnorm  # a correct accumulation; the gap to the large batch is BatchNorm's
        return out
    fit_tol = max(FIT_RTOL, tol)  # a fit is as good as the replay it is fitted to
    if len(set(n.scales)) > 1:  # read, not fitted: each micro-batch weighs its own scale over the step's one
        out.codes.append("scale-changed-inside-window")
        out.detail = (
            f"GradScaler's scale at the window's backwards {[f'{s:g}' for s in n.scales]}, one unscale_ at "
            f"the step: micro-batches weighted {[round(w, 4) for w in n.weights]} (1 is right)"
        )
        return out
    if counted_before_shift(n, fit_tol):
        out.codes.append("mean-of-means")
        out.detail = (
            f"each micro-batch weighted (N_j+S_j)/N_j x sum N/sum (N+S), {[round(w, 6) for w in n.weights]}: "
            "its mean over its N_j shifted labels was multiplied by its labels counted before the shift "
            f"(N_j + S_j, S_j sequences) and the window divided by their sum (rel err {n.rel:.1e})"
        )
        return out
    reproduce = all(f.resid <= fit_tol for f in n.fits) and _one_factor_measured(n, fit_tol)
    if reproduce:
        _name(n, out, m=m, k=k, tol=fit_tol)
    elif n.factor_resid <= fit_tol:
        _name_misscale(n, out, n.factor, m=m, k=k, tol=fit_tol)
    if not _explains(out):
        out.codes.append("unexplained")
        weights = (
            f"per-micro-batch weights {[round(w, 4) for w in n.weights]} (1 is right)" if n.weights else ""
        )
        worst = max((f.resid for f in n.fits), default=math.nan)
        cos = n.gt / math.sqrt(n.gg * n.tt) if n.gg > 0 and n.tt > 0 else math.nan
        if reproduce:
            out.fit = "micro-batch-weights"
            fitted = (
                f"they reproduce the gradient, but match no known bug's weights (fit residual {worst:.2e})"
            )
        elif worst <= fit_tol:  # exact weights of one factor, which the measured gradient does not follow
            out.fit = "weights-unmet"
            fitted = (
                "the weights read from each backward are one factor, but G is no such multiple of g* "
                f"(fitted c = {n.factor:.4f}, residual {n.factor_resid:.2e}): "
                ".grad changed where no weight saw it, "
                "such as entries written through .data or masked after the backward"
            )
        else:
            out.fit = "no-weights"
            fitted = "no weighting of the window's micro-batches reproduces the gradient"
            fitted += f" (fit residual {worst:.2e})"
        out.detail = (
            f"{weights}; {fitted}; "
            f"|G|/|g*| = {math.sqrt(n.gg / n.tt) if n.tt > 0 else math.nan:.4f}, cosine {cos:.6f}. "
            "Is item_losses the loss the loop minimizes (same reduction, masking, label shift, no extra "
            "terms)?"
        ).lstrip("; ")
    return out


def _one_factor_measured(n: StepNumbers, tol: float) -> bool:
    """Weights that say one factor c for every micro-batch (no leak) must meet the measurement: G = c g*,
    the fitted factor c and its residual. The in-place engine reads each weight from the loss's own
    backward and .grad's fingerprints (its fits' residuals are 0 by construction), so a change of .grad
    no weight saw (rows masked through ``.data`` after the backward, where the fingerprints lie outside
    them) shows only here: weights of 1 beside a gradient 0.95 away from g* are unexplained, not
    "misscaled by c = 1". Other weights are not one factor of g*, and stay as fitted."""
    w = n.weights
    if n.leak or not w or not all(near(x, w[0], SAME_FACTOR_RTOL) for x in w):
        return True
    return n.factor_resid <= tol and near(n.factor, w[0], tol)


def _job(n: StepNumbers, out: StepVerdict, *, m: int, k: int, tol: float) -> None:
    """A step of a multi-rank job, from the job's numbers (``accumlib._verify.ranks``): the per-micro-batch
    weights are not the job's (a sync mixes the ranks' .grad), so the names come from exact predictions."""
    if max(n.diverged, n.params_diverged) > tol:
        out.codes.append("ranks-diverged")
        out.detail = (
            f"|G_r - G_0| / |G_0| up to {n.diverged:.2e}, parameters |p_r - p_0| / |p_0| up to "
            f"{n.params_diverged:.2e} (0 when every rank holds the same)"
        )
        return
    if n.rel <= tol:
        out.batchnorm_limit = n.batchnorm
        return
    fit_tol = max(FIT_RTOL, tol)
    if n.leak:
        out.codes.append("no-zero-grad")
        out.detail = "some rank's .grad was not empty when the window began"
    elif n.per_rank_resid <= fit_tol:
        out.codes.append("per-rank-mean")
        out.factor = n.per_rank_factor
        extra = "" if near(n.per_rank_factor, 1.0, fit_tol) else f", times c = {n.per_rank_factor:.4f}"
        out.detail = f"items per rank {n.rank_items}{extra}"
    elif n.factor_resid <= fit_tol:
        if m < k and near(n.factor, m / k, fit_tol):
            out.codes.append("tail-misscaled")
            return
        _name_misscale(n, out, n.factor, m=m, k=k, tol=fit_tol)
    else:
        out.codes.append("unexplained")
        out.fit = "no-rank-factor"
        cos = n.gt / math.sqrt(n.gg * n.tt) if n.gg > 0 and n.tt > 0 else math.nan
        out.detail = (
            f"window items per rank {n.rank_items}; |G|/|g*| = "
            f"{math.sqrt(n.gg / n.tt) if n.tt > 0 else math.nan:.4f}, "
            f"cosine {cos:.6f}; no per-rank or common factor reproduces the gradient"
        )


def _explains(out: StepVerdict) -> bool:
    """True when a code names why the gradient itself is off (not just a schedule or a window's length),
    or the gradient is off by the factor a late window's length explains (``window_scale``)."""
    schedule = ("scheduler-per-micro-batch", "frozen-inside-window", "late-step")
    return out.window_scale or any(c not in schedule for c in out.codes)


def _name(n: StepNumbers, out: StepVerdict, *, m: int, k: int, tol: float) -> None:
    w = n.weights
    if n.leak and n.leak_coef > COEF_RTOL:  # any share of it: GradScaler's unscale_ or a /k shrinks it too
        out.codes.append("no-zero-grad")
        out.detail = f"the gradient held {n.leak_coef:.2f} x what .grad contained before the window began"
    sizes = [f.items for f in n.fits]
    v = [x * nj / n.items for x, nj in zip(w, sizes)]
    unequal = len(set(sizes)) > 1
    # one factor on every micro-batch, or on every micro-batch's mean, however small: an over-division
    # (the mean divided by k x b, or by N), not a zeroing, which leaves the last micro-batch's weight whole
    one_factor = w[0] != 0 and any(all(near(x, y[0], SAME_FACTOR_RTOL) for x in y) for y in (w, v))
    near0 = [abs(x) < COEF_RTOL for x in w]
    if any(near0) and not one_factor:
        if not all(near0):
            out.codes.append("zero-grad-inside-window")
            out.detail = f"micro-batches weighted {[round(x, 3) for x in w]} (1 is right)"
        return
    after = n.rescaled if math.isfinite(n.rescaled) else 1.0  # what .grad took after the last backward
    if all(near(x, after, tol) for x in w) and "no-zero-grad" in out.codes:
        return  # every micro-batch's loss right: what is off is the leak named above: a decay is how it leaks
    out.detail = f"each micro-batch mean weighted {[round(x, 4) for x in v]}, items {sizes}"
    if not near(after, 1.0, COEF_RTOL) and all(near(x, w[0], SAME_FACTOR_RTOL) for x in w):
        # read, not fitted: one factor .grad took after the last backward, whatever count it happens to equal
        _name_misscale(n, out, sum(w) / len(w), m=m, k=k, tol=tol)
        return
    if all(near(x, v[0], tol) for x in v):
        if near(v[0], 1.0, tol) and m > 1:
            out.codes.append("unscaled-sum")
            return
        if m < k and near(v[0] * k, 1.0, tol):
            out.codes += ["tail-misscaled"] + (["mean-of-means"] if unequal else [])
            return
        if unequal and near(v[0] * m, 1.0, tol):
            out.codes.append("mean-of-means")
            return
        if unequal and v[0] > 0:  # weighted per micro-batch, and the mean of means off by one factor c = v m
            out.codes.append("mean-of-means")
            detail = out.detail
            _name_misscale(n, out, v[0] * m, m=m, k=k, tol=tol)
            out.detail = detail
            return
    if m < k and all(near(x, m / k, tol) for x in w):
        out.codes.append("tail-misscaled")
        return
    if not n.leak and all(near(x, w[0], SAME_FACTOR_RTOL) for x in w):
        _name_misscale(n, out, sum(w) / len(w), m=m, k=k, tol=tol)


def _name_misscale(n: StepNumbers, out: StepVerdict, c: float, *, m: int, k: int, tol: float) -> None:
    if m > k and near(c, m / k, tol):  # loss / k over m > k micro-batches: right for k, the window is late
        out.window_scale = True
        return
    out.codes.append("misscaled")
    out.factor = c
    out.cause = causes(
        c, m=m, k=k, items=n.items, sequences=n.sequences, rtol=tol, ranks=n.ranks, own_items=n.own_items
    )
    # what verify saw change the gradient outside the loss comes first: it is where the factor came from
    if n.grad_hooks:
        out.cause = "hook"
    elif math.isfinite(n.rescaled) and not near(n.rescaled, 1.0, COEF_RTOL):
        out.cause = "rescaled"
    out.detail = f"c = {c:.4f}"


def compensated_clip(c: Clip, g_norm: float) -> bool:
    """A clip of the scaled gradient whose max_norm was scaled with it (``max_norm * scaler.get_scale()``).

    Clipping S g at M S cuts by the very coefficient that clipping g at M does, so the step is right.
    The clip saw ``ratio`` = |S g| / |g| ~ S; its max_norm is read as scaled when it lies nearer
    (in log) to the scaled norm than to the unscaled one: max_norm > |S g| / sqrt(ratio). Unscaled
    clipping norms (0.1 to 10) sit far below that at any S >= 2**8 and gradients of norm >= 1e-3.
    """
    ratio = c.total_norm / g_norm
    return ratio > SCALED_CLIP_RATIO and c.max_norm > c.total_norm / math.sqrt(ratio)


__all__ = ["CAUSES", "Fit", "StepVerdict", "causes", "compensated_clip", "diagnose", "near", "step_tol"]
