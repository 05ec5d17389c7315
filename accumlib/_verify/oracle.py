"""The oracle stage: each window's true gradient, built micro-batch by micro-batch, and the few
numbers per micro-batch a diagnosis needs.

For a window of micro-batches b_1..b_m with N items in all, let s_j = grad sum_{i in b_j} l_i
(``accumlib.oracle.sum_grad``, at the parameters the window started from). Then

    g* = grad (1/N) sum_i l_i = (1/N) sum_j s_j                     (what accumlib.ragged computes)

so the oracle needs one buffer, O = sum_j s_j, and never the merged window's activations.
BatchNorm alone couples a micro-batch's items to the others; only there is the merged window
run as well (``merged``), and the report says so.

The diagnosis reads the loop's own ``.grad`` at each micro-batch boundary: C_j, the gradient
after micro-batch j's backward, is fitted as

    C_j  ~=  a_j s_j + beta_j C_{j-1}           (C_0: what .grad held when the window began)

from six dot products, in float64. Unrolled, the step's gradient is
G = sum_j (a_j prod_{l>j} beta_l) s_j + (prod_l beta_l) C_0, so each micro-batch's weight
w_j = N a_j prod_{l>j} beta_l (1 is right) and the leak coefficient come out exactly, from
three parameter-sized buffers (O, C_{j-1}, s_j) whatever k is.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._batch import ItemLosses, to_device
from ..oracle import sum_grad

Vec = list  # one tensor (or None: zero) per trainable parameter
CHUNK = 1 << 20  # float64 dot products are taken 1M elements at a time: 8 MB of scratch per operand


def gram(vectors: Sequence[Vec], scales: Sequence[float] | None = None) -> torch.Tensor:
    """All pairwise dot products of a few parameter-shaped vectors, in float64 (float32 products
    are exact in float64, so the residual of a fit keeps ~1e-8 relative precision)."""
    n = len(vectors)
    out = None
    for i in range(len(vectors[0])):
        parts = [v[i] for v in vectors]
        like = next((t for t in parts if t is not None), None)
        if like is None:
            continue
        if out is None:
            out = torch.zeros(n, n, dtype=torch.float64, device=like.device)
        flat = [t.detach().reshape(-1) if t is not None else None for t in parts]
        for start in range(0, like.numel(), CHUNK):
            cols = [f[start:start + CHUNK].double() if f is not None else None for f in flat]
            for a in range(n):
                for b in range(a, n):
                    if cols[a] is not None and cols[b] is not None:
                        out[a, b] += torch.dot(cols[a], cols[b])
    g = torch.zeros(n, n, dtype=torch.float64) if out is None else out.cpu()
    g = torch.triu(g) + torch.triu(g, 1).T
    if scales is not None:
        sc = torch.tensor(list(scales), dtype=torch.float64)
        g = g * sc[:, None] * sc[None, :]
    return g


def diff_norm(a: Vec, b: Vec, ca: float = 1.0, cb: float = 1.0) -> float:
    """||ca * a - cb * b||, computed directly (a difference of squared norms would cancel)."""
    total = 0.0
    for x, y in zip(a, b):
        if x is None and y is None:
            continue
        ref = x if x is not None else y
        fx = x.detach().reshape(-1) if x is not None else None
        fy = y.detach().reshape(-1) if y is not None else None
        for start in range(0, ref.numel(), CHUNK):
            d = (fx[start:start + CHUNK].double() * ca) if fx is not None else 0.0
            if fy is not None:
                d = d - fy[start:start + CHUNK].double() * cb
            total += float(torch.as_tensor(d).pow(2).sum())
    return math.sqrt(total)


def norm(a: Vec, c: float = 1.0) -> float:
    return abs(c) * math.sqrt(float(gram([a])[0, 0]))


@dataclass
class Fit:
    """C_j ~= a s_j + beta C_{j-1} for one group of micro-batches (one, unless the loop ran
    several forwards before their backwards)."""

    batches: int
    items: int
    sequences: int
    a: float
    beta: float
    resid: float  # ||C_j - fit|| / ||C_j||


def fit_group(g: torch.Tensor) -> tuple[float, float, float]:
    """Solve for (a, beta) from the Gram matrix of (C_j, C_{j-1}, s_j); return (a, beta, resid)."""
    cc, cp, cs = float(g[0, 0]), float(g[0, 1]), float(g[0, 2])
    pp, ps, ss = float(g[1, 1]), float(g[1, 2]), float(g[2, 2])
    if pp <= 0.0 and ss <= 0.0:
        a, beta = 0.0, 1.0
    elif pp <= 0.0:  # .grad was empty: beta does not matter
        a, beta = cs / ss, 1.0
    elif ss <= 0.0:  # nothing of this group reached the gradient (no items)
        a, beta = 0.0, cp / pp
    elif ps * ps >= (1.0 - 1e-9) * pp * ss:  # collinear (a one-parameter model): assume no rescale
        a, beta = (cs - ps) / ss, 1.0
    else:
        det = ss * pp - ps * ps
        a, beta = (cs * pp - cp * ps) / det, (cp * ss - cs * ps) / det
    r2 = cc - 2 * a * cs - 2 * beta * cp + a * a * ss + 2 * a * beta * ps + beta * beta * pp
    return a, beta, math.sqrt(max(r2, 0.0)) / math.sqrt(cc) if cc > 0 else (0.0 if r2 <= 0 else math.inf)


@dataclass
class Replay:
    """How the loop computed a micro-batch: autocast device type and dtype (None: off), GradScaler scale."""

    autocast: tuple[str, torch.dtype] | None = None
    scale: float = 1.0


@contextlib.contextmanager
def exact(replay: Replay | None = None) -> Iterator[None]:
    """The oracle's own context, whatever the loop's: autocast only as the replay asks (off for
    float32, e.g. inside Lightning's closure), autograd on (optimizer.step runs under no_grad),
    and the loop's RNG stream left alone (a model that draws random numbers in forward)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        for dev in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            on = replay is not None and replay.autocast is not None and replay.autocast[0] == dev
            stack.enter_context(torch.autocast(dev, enabled=on, dtype=replay.autocast[1] if on else None))  # type: ignore[union-attr]
        stack.enter_context(torch.enable_grad())
        yield


@dataclass
class WindowOracle:
    """Buffers and per-group numbers for the window being recorded; reused window after window."""

    shadow: torch.nn.Module
    params: list[torch.nn.Parameter]
    item_losses: ItemLosses
    O: Vec | None = None
    P: Vec | None = None
    fits: list[Fit] = field(default_factory=list)
    items: int = 0
    loss_sum: float = 0.0
    sequences: int = 0
    leak: bool = False
    finite: bool = True

    def _zeros(self) -> Vec:
        return [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in self.params]

    def open(self, grads: Vec) -> None:
        """A window begins: remember what .grad holds (it should be nothing)."""
        if self.O is None or self.O[0].device != self.params[0].device:
            self.O, self.P = self._zeros(), self._zeros()
        for o, p, g in zip(self.O, self.P, grads):
            o.zero_()
            p.copy_(g) if g is not None else p.zero_()
        self.fits, self.items, self.loss_sum, self.sequences = [], 0, 0.0, 0
        self.leak = any(g is not None and bool(g.any()) for g in grads)
        self.finite = True

    def replay(self, batches: Sequence[Any], how: Replay) -> tuple[Vec, int, float, int]:
        """s = sum of the batches' item-loss gradients, as the loop computed them; items, loss sum, sequences."""
        device = self.params[0].device
        s: Vec = [None] * len(self.params)
        items, loss_sum, rows = 0, 0.0, 0
        with exact(how):
            for batch in batches:
                grads, losses = sum_grad(self.shadow, to_device(batch, device), self.item_losses, self.params, scale=how.scale,
                                        check_finite=False)
                for i, g in enumerate(grads):
                    if g is not None:
                        g = g if g.dtype in (torch.float32, torch.float64) else g.float()
                        g = g.div_(how.scale) if how.scale != 1.0 else g  # autograd's own output: ours to change
                        s[i] = g if s[i] is None else s[i].add_(g)
                items += losses.numel()
                loss_sum += float(losses.double().sum())
                rows += leading_rows(batch)
        return s, items, loss_sum, rows

    def close_group(self, grads: Vec, batches: Sequence[Any], how: Replay, *, unclip: float = 1.0, last: bool = False) -> None:
        """Micro-batches ``batches`` have gone through backward: fit .grad against their replay."""
        s, n, loss, rows = self.replay(batches, how)
        self.items, self.loss_sum, self.sequences = self.items + n, self.loss_sum + loss, self.sequences + rows
        assert self.O is not None and self.P is not None
        if self.finite and not all(g is None or bool(torch.isfinite(g).all()) for g in grads):
            self.finite = False
        if self.finite:
            a, beta, resid = fit_group(gram([grads, self.P, s], scales=[1.0 / unclip, 1.0, 1.0]))
        else:
            a, beta, resid = math.nan, math.nan, math.nan
        self.fits.append(Fit(len(batches), n, rows, a, beta, resid))
        for o, x in zip(self.O, s):
            if x is not None:
                o.add_(x)
        if not last:
            for p, g in zip(self.P, grads):
                p.copy_(g) if g is not None else p.zero_()

    def weights(self) -> tuple[list[float], float]:
        """Per-group weights w_j = N a_j prod_{l>j} beta_l, and the leak coefficient prod beta."""
        w, tail = [0.0] * len(self.fits), 1.0
        for j in range(len(self.fits) - 1, -1, -1):
            w[j] = self.items * self.fits[j].a * tail
            tail *= self.fits[j].beta
        return w, tail

    def full(self, batches: Sequence[Any], how: Replay, into: Vec) -> tuple[int, float]:
        """sum_j s_j again, under ``how`` (float32 for the figure the user reads), into a spare buffer."""
        for t in into:
            t.zero_()
        s, n, loss, _ = self.replay(batches, how)
        for t, x in zip(into, s):
            if x is not None:
                t.add_(x)
        return n, loss

    def merged(self, batch: Any, into: Vec) -> tuple[int, float]:
        """grad of sum_i l_i over the merged window in one forward (BatchNorm sees the large batch)."""
        device = self.params[0].device
        with exact():
            grads, losses = sum_grad(self.shadow, to_device(batch, device), self.item_losses, self.params, scale=1.0, check_finite=False)
        for t, g in zip(into, grads):
            t.copy_(g) if g is not None else t.zero_()
        return losses.numel(), float(losses.double().sum())


def leading_rows(batch: Any) -> int:
    """Rows of the batch's first tensor (sequences of a token batch, images of an image batch)."""
    from .record import tensors

    first = next(tensors(batch), None)
    return int(first.shape[0]) if first is not None and first.dim() else 0


def clipped(norm_value: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s coefficient for a gradient of norm ``norm_value``."""
    return min(1.0, max_norm / (norm_value + 1e-6))


__all__ = ["Fit", "Replay", "WindowOracle", "clipped", "diff_norm", "exact", "fit_group", "gram", "norm"]
