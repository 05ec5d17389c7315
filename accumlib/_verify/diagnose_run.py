"""The diagnose stage across a run: the rules no single step shows, pure functions of the numbers the
record and compute stages handed forward (``StepNumbers`` per step, ``Coverage`` for the run).

- ``diagnose_run``: a clip verify did not see is assumed only where it explains every step
  (``infer_clip``), a misscale a recorded clip hid from the update is marked masked, one divisor for
  the whole run is named;
- ``step_rows``: each step's row, compared like for like with the truth clipped as the loop clipped;
- ``step_findings``: one finding per code over the steps that have it, a misscale's range of c and causes,
  the micro-batches a late step averaged;
- ``run_notes``: BatchNorm's own gap, the clip assumed, dropout switched off, ``max_steps``;
- ``coverage_findings``: items no step used, a loader that leaves items out by design, repeated draws;
- the loss the loop reports, off by about k (``logged_loss_off``, ``logged_findings``).

Every finding is worded by the codes table (``Finding.of``); these rules pick its code, steps and numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any, cast

from ..tolerances import CLIP_NORM_RTOL, LOGGED_RTOL, SAME_FACTOR_RTOL
from .codes import CODES
from .diagnose import CAUSES, StepVerdict, compensated_clip, diagnose, near, step_tol
from .report import Finding, StepRow
from .step_numbers import Coverage, StepNumbers


def clip_norms(n: StepNumbers) -> list[float]:
    """The max_norm each complete-window clip applied to the true (unscaled) gradient: a compensated
    clip of S g at M S is a clip of g at M; any other as recorded."""
    g_norm = math.sqrt(n.gg) / n.unclip
    return [
        c.max_norm * g_norm / c.total_norm if g_norm > 0 and compensated_clip(c, g_norm) else c.max_norm
        for c in n.clips
        if c.seen >= n.micro_batches
    ]


def like_for_like(n: StepNumbers, clip_to: list[float]) -> tuple[float, float]:
    """(|G|/|t'|, |G - t'|/|t'|) with t' the float32 truth clipped as the loop clipped: each
    ``max_norm`` in ``clip_to`` scales it by min(1, max_norm / (norm + 1e-6)), as torch does."""
    if n.tt <= 0:
        return math.nan, math.nan
    lam = 1.0
    for max_norm in clip_to:
        lam *= min(1.0, max_norm / (lam * math.sqrt(n.tt) + 1e-6))
    ref = lam * math.sqrt(n.tt)
    diff2 = n.gg - 2 * lam * n.gt + lam * lam * n.tt
    return math.sqrt(n.gg) / ref, math.sqrt(max(diff2, 0.0)) / ref


def infer_clip(numbers: list[StepNumbers], verdicts: list[StepVerdict]) -> float | None:
    """A clip by norm verify did not see (fairseq's, DeepSpeed's own), or None.

    The hypothesis "the loop is right and clips at C" predicts G = min(1, C/|g*|) g* at every
    step, and it stands only where it predicts every step it is used for:
      - a clip only shrinks: every step scaled by one factor has c < 1 (one with c >= 1 refutes it);
      - every scaled step ends at the one norm C (a factor leaves norms that vary with the data);
      - every step judged ok has a norm of at most C (a clip at C would have acted on it);
      - at least two scaled steps land on C: one step alone cannot tell a clip from a factor
        (a loss divided by 2N on a one-window run), so it stays ``misscaled``.
    """
    scaled = [(s, v) for s, v in zip(numbers, verdicts) if v.codes == ["misscaled"] and not s.clips]
    if len(scaled) < 2 or any(v.factor is None or v.factor >= 1 for _, v in scaled):
        return None
    norms = [math.sqrt(s.gg) for s, _ in scaled]
    c = max(norms)
    fine = [math.sqrt(s.gg) for s, v in zip(numbers, verdicts) if not v.codes and s.items]
    if all(near(x, c, CLIP_NORM_RTOL) for x in norms) and all(x <= c * (1 + CLIP_NORM_RTOL) for x in fine):
        return c
    return None


def diagnose_run(
    numbers: list[StepNumbers], *, k: int, ranks_codes: Sequence[Sequence[list[str]]] = ()
) -> tuple[list[StepVerdict], float | None]:
    """Every step's verdict, with the run-level rules applied: a clip verify did not see is
    assumed only where it explains every step (``infer_clip``), and a misscale that a recorded
    clip hid from the update is marked ``masked``. ``ranks_codes``: in a multi-rank job, each rank's
    own codes per step, said beside the job's. Returns the verdicts and the assumed max_norm."""
    verdicts = [diagnose(s, k=k) for s in numbers]
    carried_tail(numbers, verdicts, k=k)
    assumed = infer_clip(numbers, verdicts)
    scaled = [
        (s, v) for s, v in zip(numbers, verdicts) if "misscaled" in v.codes and v.factor and not v.cause
    ]
    if assumed is None and len({s.items for s, _ in scaled}) > 1:  # a run-level cause: c_t N_t-proportional
        divisors = [s.items / cast(float, v.factor) for s, v in scaled]  # scaled: each with its factor
        if all(near(d, divisors[0], SAME_FACTOR_RTOL) for d in divisors):
            for _, v in scaled:
                v.cause = "constant"
    for s, v in zip(numbers, verdicts):
        if assumed is not None and v.codes == ["misscaled"] and not s.clips:
            v.codes, v.factor, v.cause, v.clip_assumed = [], None, "", True
        elif "misscaled" in v.codes and s.clips:
            # clip_grad_norm_ acted on the loop's c g* and would have on g* too: both end at max_norm,
            # so the update equals the correct one; the bug is real and shows wherever the clip does not act
            done = [c.max_norm for c in s.clips if c.seen >= s.micro_batches]
            v.masked = like_for_like(s, done)[1] <= step_tol(s.precision)
    for codes in ranks_codes:  # a job: what any rank found at a step is the job's
        for v, seen in zip(verdicts, codes):
            v.codes += [c for c in seen if c not in v.codes]
    return verdicts, assumed


def step_rows(
    numbers: list[StepNumbers], verdicts: list[StepVerdict], assumed: float | None
) -> list[StepRow]:
    """One row per step: the gradient against the float32 truth clipped as the loop clipped (recorded,
    or assumed), and what the verdict was judged against."""
    rows = []
    for t, (s, v) in enumerate(zip(numbers, verdicts)):
        clip_to = clip_norms(s) or ([assumed] if assumed else [])
        ratio, rel = like_for_like(s, clip_to)
        replay = " replay" if s.precision != "float32" else ""
        against, ref_error = (
            s.precision + replay + ("; BatchNorm: accumulated" if s.batchnorm else ""),
            s.rel,
        )
        if v.clip_assumed:  # judged against the truth clipped to the assumed norm: show that error
            against, ref_error = f"float32 clipped to {assumed:.3g} (assumed)", rel
        rows.append(
            StepRow(
                step=t,
                micro_batches=s.micro_batches,
                items=s.items,
                lr=s.lr,
                norm_ratio=ratio,
                rel_error=rel,
                codes=("skipped by GradScaler",) if s.skipped else tuple(v.codes),
                judged_against=against,
                # an assumed clip took the factor: c is 1 (nan stays nan)
                factor=s.factor / s.factor if v.clip_assumed else s.factor,
                clip=s.factor if v.clip_assumed else s.unclip,
                ref_error=ref_error,
                fit=v.fit,
                items_per_rank=tuple(s.rank_items),
                cause=v.cause if "misscaled" in v.codes else "",
                weights=tuple(s.weights),
            )
        )
    return rows


def carried_tail(numbers: list[StepNumbers], verdicts: list[StepVerdict], *, k: int) -> None:
    """A loop that carries its window across passes (torchtune's recipes: the count and ``.grad`` go
    on into the next epoch) steps k micro-batches every time and is left, at the run's end, with what
    remains of all its micro-batches, not of one pass's: the run's last step, at a pass's end, holding
    (every micro-batch the run stepped) mod k is its legitimate tail, not an early step."""
    if not numbers or "early-step" not in verdicts[-1].codes:
        return
    last, before = numbers[-1], numbers[:-1]
    total = sum(s.micro_batches for s in numbers)
    if last.epoch_end and all(s.micro_batches == k for s in before) and last.micro_batches == total % k:
        v = verdicts[-1]
        v.codes.remove("early-step")
        v.detail = "" if v.detail.startswith("stepped after") else v.detail


def step_findings(numbers: list[StepNumbers], verdicts: list[StepVerdict], *, k: int) -> list[Finding]:
    """One finding per code the steps have, in the order first seen, with the steps and their details;
    a misscale says its range of c in one line and the known causes it matches, with their fix."""
    at: dict[str, list[int]] = {}
    details: dict[str, list[str]] = {}
    for t, v in enumerate(verdicts):
        for c in v.codes:
            at.setdefault(c, []).append(t)
            details.setdefault(c, [])
            if v.detail and v.detail not in details[c]:
                details[c].append(v.detail)
    fixes: dict[str, str] = {}
    if "late-step" in at:  # its own numbers: a late step's detail may be another code's
        ms = sorted({numbers[t].micro_batches for t in at["late-step"]})
        details["late-step"] = [f"{m} micro-batches in a step: {m / k:.3g} x the batch asked" for m in ms]
    if "misscaled" in at:
        cs = [cast(float, verdicts[t].factor) for t in at["misscaled"] if verdicts[t].factor is not None]
        found = sorted({verdicts[t].cause for t in at["misscaled"] if verdicts[t].cause})
        span = (
            f"c = {min(cs):.4f}" + (f" to {max(cs):.4f}" if max(cs) - min(cs) >= 5e-5 else "") if cs else ""
        )
        # a "constant" cause is set on scaled steps only, each with its factor
        divisor = next(
            (s.items / cast(float, v.factor) for s, v in zip(numbers, verdicts) if v.cause == "constant"),
            None,
        )
        span += f" (D = {divisor:.4g})" if divisor else ""
        said: dict[str, dict[str, object]] = {  # the two causes verify saw happen say where and by how much
            "hook": dict(
                hooks=", ".join(sorted({h for t in at["misscaled"] for h in numbers[t].grad_hooks}))
            ),
            "rescaled": dict(
                r=next((numbers[t].rescaled for t in at["misscaled"] if verdicts[t].cause == "rescaled"), 1.0)
            ),
            "divisor": dict(
                d=next((round(1 / v.factor) for v in verdicts if v.cause == "divisor" and v.factor), "d")
            ),
        }
        details["misscaled"] = [
            span
            + "".join(f"; {CAUSES[c][0].format(**said[c]) if c in said else CAUSES[c][0]}" for c in found)
        ]
        masked = [t for t in at["misscaled"] if verdicts[t].masked]
        if masked:
            wording = CODES["misscaled"].said["masked"]
            details["misscaled"].append(wording.format(at=", ".join(map(str, masked))))
        if found:  # the fix of the cause found, not the generic one
            fixes["misscaled"] = "; ".join(CAUSES[c][1] for c in found)
    return [
        Finding.of(
            code,
            steps=steps,
            details=details[code],
            fix=fixes.get(code, ""),
            where=sites(numbers, steps, code),
            k=k,
        )
        for code, steps in at.items()
    ]


def sites(numbers: list[StepNumbers], steps: list[int], code: str) -> list[str]:
    """file:line of the user's calls a finding points at (``CODES[code].at``), first seen first, at most 3."""
    kind, out = CODES[code].at, []
    for t in steps:
        seen = (
            [c.site for c in numbers[t].clips if c.site] if kind == "clip" else [numbers[t].sites.get(kind)]
        )
        for s in seen:
            if s and s not in out:
                out.append(s)
    return out[:3]


def run_notes(
    numbers: list[StepNumbers],
    verdicts: list[StepVerdict],
    assumed: float | None,
    *,
    dropout: Sequence[float],
    stopped: bool,
) -> list[Finding]:
    """BatchNorm's own gap where it limited a verdict, the clip assumed, the dropout layers verify set to
    p=0, and a run ``max_steps`` ended."""
    out = []
    limited = [
        s.bn_gap for s, v in zip(numbers, verdicts) if s.bn_gap is not None and (v.batchnorm_limit or v.codes)
    ]
    if limited:
        out.append(Finding.of("batchnorm", form="gap", worst=max(limited)))
    if assumed is not None:
        out.append(Finding.of("clip-assumed", form="norm", max_norm=assumed))
    if dropout:
        out.append(Finding.of("dropout", form="layers", layers=len(dropout), ps=sorted(set(dropout))))
    if stopped:
        out.append(Finding.of("partial-run", n=len(numbers)))
    return out


def coverage_findings(cov: Coverage, *, stepped: bool, job: bool = False) -> list[Finding]:
    """Items no step used (``tail-dropped``: on any rank, in a job), items a complete pass of the loop's
    loader left out by its own design, draws that repeated an item (``stepped``: any step at all)."""
    out = []
    if cov.missing:
        if not job:
            form = "count" if stepped else "never"
        else:  # an IterableDataset has no length: no total to give
            form = ("job" if cov.total is not None else "job-stream") + ("" if stepped else "-never")
        out.append(Finding.of("tail-dropped", form=form, n=cov.missing, total=cov.total))
    if cov.left_out:
        per = " or ".join(map(str, sorted(set(x for x in cov.left_out if x))))
        passes, held, why = len(cov.left_out), cov.held, cov.left_out_by
        out.append(
            Finding.of("loader-left-out", n=sum(cov.left_out), passes=passes, per=per, held=held, why=why)
        )
    if cov.duplicates:
        out.append(Finding.of("duplicate-items", n=cov.duplicates))
    if cov.mid_pass:
        out.append(Finding.of("partial-run", form="mid-pass", n=cov.mid_pass, held=cov.held))
    return out


def logged_loss_off(logged: float, true: float, k: int) -> bool:
    """True when the reported loss is about k times (or 1/k times) the true mean item loss."""
    if k < 2 or not math.isfinite(logged) or true == 0 or not math.isfinite(true):
        return False
    r = logged / true

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= LOGGED_RTOL * abs(b)

    return not close(r, 1.0) and (close(r * k, 1.0) or close(r / k, 1.0))


def logged_findings(
    returned: Any, numbers: list[StepNumbers], *, k: int, true_loss: float | None
) -> tuple[float | None, list[Finding]]:
    """(the epoch loss the loop reported, or None; a finding where it is off by about k). A number is the
    epoch loss; a list with one number per step, per-step losses (each against its step's mean item loss)."""
    if isinstance(returned, Real) and not isinstance(returned, bool) and true_loss is not None:
        logged = float(returned)
        if not logged_loss_off(logged, true_loss, k):
            return logged, []
        return logged, [Finding.of("logged-loss-scaled", form="epoch", logged=logged, true=true_loss, k=k)]
    if (
        isinstance(returned, (list, tuple))
        and len(returned) == len(numbers)
        and all(isinstance(x, Real) for x in returned)
    ):
        off = [
            t
            for t, (x, s) in enumerate(zip(returned, numbers))
            if s.items and logged_loss_off(float(x), s.loss_sum / s.items, k)
        ]
        return None, [Finding.of("logged-loss-scaled", steps=off, k=k)] if off else []
    return None, []


__all__ = [
    "clip_norms",
    "coverage_findings",
    "diagnose_run",
    "infer_clip",
    "like_for_like",
    "logged_findings",
    "logged_loss_off",
    "run_notes",
    "step_findings",
    "step_rows",
]
