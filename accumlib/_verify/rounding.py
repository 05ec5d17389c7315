"""How far from the oracle a float32 step may be and still be exact, from this run's own rounding; and
the one per-micro-batch weighting that sits below the old fixed tolerance, predicted exactly.

Each micro-batch's fit (``.grad`` at a boundary = a s_j + beta .grad before, s_j the oracle's replay of
that micro-batch) leaves exactly the rounding between the loop's gradient and the oracle's at that
boundary; ``run_tol`` scales it (``accumlib.tolerances.ROUNDING_MARGIN``).

>>> from accumlib._verify.step_numbers import StepNumbers
>>> run_tol(StepNumbers(4, 0.05))  # no fit: the fixed float32 tolerance
0.0001
"""

from __future__ import annotations

import math

from ..tolerances import FLOAT32_RTOL, ROUNDING_FLOOR, ROUNDING_MARGIN
from .step_numbers import StepNumbers


def run_tol(n: StepNumbers) -> float:
    """A float32 step's tolerance from its own rounding (``accumlib.tolerances.ROUNDING_MARGIN``)."""
    resid = [f.resid for f in n.fits if math.isfinite(f.resid)]
    if not resid:
        return FLOAT32_RTOL
    return min(FLOAT32_RTOL, max(ROUNDING_FLOOR, ROUNDING_MARGIN * max(resid)))


def counted_before_shift(n: StepNumbers, fit_tol: float) -> bool:
    """The micro-batches' weights are (N_j+S_j)/N_j x sum N / sum(N+S): each micro-batch's token mean
    multiplied by its labels counted before the shift, the window divided by their sum (torchtune
    0.6.1). Matched when that prediction explains nine tenths of every weight's distance from 1."""
    f = n.fits
    if len(f) < 2 or len(n.weights) != len(f) or any(x.resid > fit_tol for x in f):
        return False
    if any(not 0 < x.sequences < x.items for x in f):  # items are tokens, a sequence has at least two
        return False
    total = sum(x.items for x in f) / sum(x.items + x.sequences for x in f)
    pred = [(x.items + x.sequences) / x.items * total for x in f]
    spread = max(abs(p - 1) for p in pred)
    return spread > 0 and all(abs(w - p) <= 0.1 * spread for w, p in zip(n.weights, pred))


__all__ = ["counted_before_shift", "run_tol"]
