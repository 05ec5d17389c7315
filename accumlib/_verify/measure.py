"""The compute stage's last step: a finished window's numbers against the oracle's (``StepNumbers``).

One Gram matrix of (G, O), G the gradient the optimizer saw and O the oracle's sum, gives the step's
relative error, its best factor c and the fit's residual; where the truth the user reads differs from the
verdict's reference (the merged window under BatchNorm, float32 under autocast) the oracle replays it
and a second Gram matrix gives that figure. float64 dot products, precise to ~1e-8 relative.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .step_numbers import StepNumbers
from .window_oracle import Replay, WindowOracle, gram


def dist(aa: float, ab: float, bb: float, c: float) -> float:
    """||a - c b|| from <a,a>, <a,b>, <b,b> (float64: ~1e-8 of ||a|| is the floor)."""
    return math.sqrt(max(aa - 2 * c * ab + c * c * bb, 0.0))


def fit(gg: float, gr: float, rr: float) -> tuple[float, float, float]:
    """From <G,G>, <G,r>, <r,r>: the relative error ||G - r|| / ||r||, the best factor c = <G,r>/<r,r>
    and the fit's residual ||G - c r|| / ||G|| (nan where r is zero: no factor explains anything).

    >>> fit(4.0, 2.0, 1.0)       # G = 2 r exactly
    (1.0, 2.0, 0.0)
    """
    rel = dist(gg, gr, rr, 1.0) / math.sqrt(rr) if rr > 0 else math.inf
    if rr <= 0:
        return rel, math.nan, math.nan
    return rel, gr / rr, dist(gg, gr, rr, gr / rr) / max(math.sqrt(gg), 1e-300)


def against_sums(numbers: StepNumbers, grads: list[Any], sums: list[Any]) -> None:
    """The in-place engine's figures: G, what the optimizer holds (clips undone), against r = O / N,
    O the engine's sums (``inplace.py``, all-reduced across a job's ranks by ``inplace_job.py``)."""
    n, u = numbers.items, numbers.unclip
    g = gram([grads, sums], weights=[1.0 / u, 1.0 / n])
    gg, gr, rr = float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
    numbers.rel, factor, resid = fit(gg, gr, rr)
    if rr > 0:
        numbers.factor, numbers.factor_resid = factor, resid
    numbers.gg, numbers.gt, numbers.tt = gg * u * u, gr * u, rr


def measure(
    numbers: StepNumbers,
    o: WindowOracle,
    grads: list[torch.Tensor | None],
    *,
    batches: list[Any],
    autocast: tuple[str, torch.dtype] | None,
    batchnorm: bool,
    job: bool,
    merged: Callable[[], Any],
) -> None:
    """Fill ``numbers`` for a window of ``batches`` whose gradient the optimizer saw as ``grads``.
    ``autocast``: the loop's (device, dtype), None for float32; ``batchnorm``: a BatchNorm layer in
    training mode; ``job``: a multi-rank job (the oracle holds the job's sum); ``merged()``: the window
    as one large batch."""
    n, u = o.items, numbers.unclip
    assert o.P is not None
    numbers.weights, numbers.leak_coef = o.weights()
    numbers.precision = str(autocast[1]).replace("torch.", "") if autocast else "float32"
    # G unclipped, r = O / N: the verdict's reference
    g = gram([grads, o.O()], weights=[1.0 / u, 1.0 / n], scratch=o.scratch)
    gg, gr, rr = float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
    numbers.rel, factor, resid = fit(gg, gr, rr)
    if rr > 0:
        numbers.factor, numbers.factor_resid = factor, resid
    numbers.batchnorm = batchnorm
    # a job: no second replay (each would need its own exchange); its reference is the figure
    if job:
        numbers.weights, numbers.leak_coef = [], 0.0  # fitted against this rank's share: not the job's
        numbers.bn_gap = math.nan if batchnorm else None
    # the large batch differs: the merged window, in float32, into O; the accumulation kept in P
    elif batchnorm:
        o.keep_accumulation()
        o.redo([merged()], Replay())
        t = gram([grads, o.O(), o.P], weights=[1.0 / u, 1.0 / n, 1.0 / n], scratch=o.scratch)
        mm, pp, pm = float(t[1, 1]), float(t[2, 2]), float(t[1, 2])
        numbers.bn_gap = dist(pp, pm, mm, 1.0) / math.sqrt(mm) if mm > 0 else math.nan
        numbers.rel_merged = (
            dist(float(t[0, 0]), float(t[0, 1]), mm, 1.0) / math.sqrt(mm) if mm > 0 else math.inf
        )
    elif autocast is not None:  # the float32 figure the user reads
        o.redo(batches, Replay())
    if not job and (batchnorm or autocast is not None):
        g = gram([grads, o.O()], weights=[1.0, 1.0 / n], scratch=o.scratch)
    else:
        g = (
            g
            * torch.tensor([u, 1.0], dtype=torch.float64)[:, None]
            * torch.tensor([u, 1.0], dtype=torch.float64)[None, :]
        )
    numbers.gg, numbers.gt, numbers.tt = float(g[0, 0]), float(g[0, 1]), float(g[1, 1])


__all__ = ["against_sums", "dist", "fit", "measure"]
