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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import torch

from ..batches import ItemLosses, checked_losses, to_device
from ..oracle import sum_grad
from .sources import tensors

Vec: TypeAlias = list[torch.Tensor | None]  # one tensor (or None: zero) per trainable parameter
# float64 dot products are taken a chunk at a time through a reused scratch: on the CPU 64K elements (512 KiB
# per operand, which stays in cache between the conversion and the product: 39.4M parameters' products took
# 0.42 s at 256K), on an accelerator 1M (fewer, larger kernels)
CHUNK = 1 << 16
DEVICE_CHUNK = 1 << 20
# Up to this many parameters a micro-batch's gradient is taken whole (torch.autograd.grad) and its dot
# products in one matrix product: a few MB, where a hook per tensor would cost more than the arithmetic.
SMALL = 1 << 20


def gram(
    vectors: Sequence[Sequence[torch.Tensor | None]],
    weights: Sequence[float] | None = None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """All pairwise dot products of a few parameter-shaped vectors, in float64 (float32 products
    are exact in float64, so a fit's residual keeps ~1e-8 relative precision); ``weights`` multiply
    the vectors first."""
    n = len(vectors)
    like = next((t for v in vectors for t in v if t is not None), None)
    if like is None:
        return torch.zeros(n, n, dtype=torch.float64)
    out = torch.zeros(n, n, dtype=torch.float64, device=like.device)
    chunk = chunk_for(like.device)
    group: list[int] = []  # small tensors, taken together: one product for many (a GPT has hundreds)
    size = 0
    for i in range(len(vectors[0])):
        t = next((v[i] for v in vectors if v[i] is not None), None)
        if t is None:
            continue
        if t.numel() > chunk // 4 or t.device != like.device:
            if t.numel() > chunk and scratch is None and t.device == like.device:
                scratch = scratch_for(n, like.device)  # one for every large tensor of this call
            _gram_into(out, [v[i] for v in vectors], scratch)
            continue
        if size + t.numel() > chunk:
            _gram_joined(out, vectors, group)
            group, size = [], 0
        group.append(i)
        size += t.numel()
    if group:
        _gram_joined(out, vectors, group)
    return _weighted(out.cpu(), weights)


def _gram_joined(out: torch.Tensor, vectors: Sequence[Sequence[torch.Tensor | None]], at: list[int]) -> None:
    """out += M @ M.T, row r of M being vector r's tensors at ``at`` end to end (None: zeros), in float64:
    one concatenation and one product for all of them."""
    shapes = [cast(torch.Tensor, next(v[i] for v in vectors if v[i] is not None)) for i in at]
    flat = [
        cast(torch.Tensor, v[i] if v[i] is not None else torch.zeros_like(s)).reshape(-1)
        for v in vectors
        for i, s in zip(at, shapes)
    ]
    m = torch.cat(flat).view(len(vectors), -1).double()
    out += m @ m.T


def chunk_for(device: torch.device) -> int:
    """Elements per float64 chunk of the dot products on ``device``."""
    return CHUNK if device.type == "cpu" else DEVICE_CHUNK


def scratch_for(rows: int, device: torch.device) -> torch.Tensor:
    """A (rows, chunk) float64 scratch for ``_gram_into`` on ``device``."""
    return torch.empty(rows, chunk_for(device), dtype=torch.float64, device=device)


def _weighted(g: torch.Tensor, weights: Sequence[float] | None) -> torch.Tensor:
    if weights is None:
        return g
    sc = torch.tensor(list(weights), dtype=torch.float64)
    return g * sc[:, None] * sc[None, :]


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
    norm2: float = math.nan  # |C_j|^2, .grad at the boundary: equal on every rank where a gradient sync ran


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
            stack.enter_context(torch.autocast(dev, enabled=on, dtype=replay.autocast[1] if on else None))  # type: ignore[index, union-attr]  # on: replay.autocast is set
        stack.enter_context(torch.enable_grad())
        yield


@dataclass
class WindowOracle:
    """The oracle for the window being recorded, reused window after window.

    ``leaves`` are the shadow model's parameters: tensors that share storage with the live
    parameters (no copy of the weights) but are leaves of their own, so a replay's backward
    accumulates into *their* ``.grad``, which is O, the oracle's sum, in place. A hook on each
    leaf sees micro-batch j's gradient s_j one parameter at a time, as it arrives, and takes its
    dot products with the loop's ``.grad`` and with P (``.grad`` at the previous boundary) there:
    s_j is never held whole. Buffers: O and P, parameter-sized; the rest is per parameter.
    """

    shadow: torch.nn.Module
    leaves: list[torch.Tensor]
    item_losses: ItemLosses
    P: Vec | None = None
    fits: list[Fit] = field(default_factory=list)
    items: int = 0
    loss_sum: float = 0.0
    sequences: int = 0
    leak: bool = False
    finite: bool = True
    scratch: torch.Tensor | None = None  # (3, chunk_for(device)) float64, for the dot products

    def open(self, grads: Vec) -> None:
        """A window begins: O = 0, and P remembers what .grad holds (it should be nothing). A frozen
        parameter with nothing in .grad gets no buffer at all (None reads as zero): a frozen base
        model under a small adapter costs verify nothing but its copy."""
        if self.P is None or len(self.P) != len(self.leaves):
            self.P = [None] * len(self.leaves)
        for i, (leaf, g) in enumerate(zip(self.leaves, grads)):
            if not leaf.requires_grad and g is None:
                leaf.grad, self.P[i] = None, None
                continue
            if leaf.grad is None or leaf.grad.shape != leaf.shape or leaf.grad.device != leaf.device:
                leaf.grad = torch.zeros_like(leaf)
            else:
                leaf.grad.zero_()
            self._remember(i, g)
        self.fits, self.items, self.loss_sum, self.sequences = [], 0, 0.0, 0
        self.leak = any(g is not None and bool(g.any()) for g in grads)
        self.finite = True
        if self.scratch is None or self.scratch.device != self.leaves[0].device:
            self.scratch = scratch_for(3, self.leaves[0].device)

    def backward(
        self, batches: Sequence[Any], how: Replay, watch: tuple[Vec, Vec, float] | None = None
    ) -> tuple[int, float, int, torch.Tensor | None]:
        """Add grad sum_i l_i over ``batches`` (computed as ``how`` says) into the leaves' .grad.
        ``watch=(grads, P, unclip)``: also return the Gram matrix of (grads / unclip, P, s).
        Returns items, loss sum, sequences (rows), and the Gram matrix."""
        device = self.leaves[0].device
        dots = torch.zeros(3, 3, dtype=torch.float64, device=device) if watch is not None else None
        batches = [to_device(b, device) for b in batches]
        rows = sum(leading_rows(b) for b in batches)
        # float16 has 5 exponent bits: the gradient of the loss *sum* times GradScaler's 2**16 overflows where
        # the loop's (a mean, or a sum / N) does not; per row, the replay's magnitudes are the loop's
        scale = (
            how.scale / max(rows, 1)
            if how.autocast is not None and how.autocast[1] == torch.float16
            else how.scale
        )

        def hook(i: int) -> Callable[[torch.Tensor], torch.Tensor | None]:
            def seen(g: torch.Tensor) -> torch.Tensor | None:
                if scale != 1.0:
                    g = g / scale
                if dots is not None:
                    grads, prev, _ = watch  # type: ignore[misc]  # dots is set only where watch is
                    _gram_into(dots, [grads[i], prev[i], g], self.scratch)
                return g if scale != 1.0 else None

            return seen

        small = sum(leaf.numel() for leaf in self.leaves) <= SMALL
        # only what the loop's forward differentiated (a frozen parameter has no gradient to add)
        live = [i for i, leaf in enumerate(self.leaves) if leaf.requires_grad]
        with exact(how):
            if small:  # a small model: one gradient vector and one product cost less than a hook per tensor
                s: Vec = [None] * len(self.leaves)
                try:
                    got, losses = sum_grad(
                        self.shadow,
                        batches,
                        self.item_losses,
                        [self.leaves[i] for i in live],
                        scale=scale,
                        check_finite=False,
                    )
                    assert got is not None  # accumulate=False: sum_grad returns the gradients
                    for i, g in zip(live, got):
                        s[i] = g
                except ValueError:
                    if any(x.numel() for x in _losses(self, batches)):
                        raise
                    losses = []
                s = [g / scale if g is not None and scale != 1.0 else g for g in s]
                if dots is not None:
                    grads, prev, _ = watch  # type: ignore[misc]  # dots is set only where watch is
                    _gram_into(
                        dots, [_cat(grads, self.leaves), _cat(prev, self.leaves), _cat(s, self.leaves)]
                    )
                for leaf, g in zip(self.leaves, s):
                    if g is not None:  # a parameter unfrozen inside the window may have no buffer yet
                        leaf.grad = g.detach().clone() if leaf.grad is None else leaf.grad.add_(g)
                return (
                    sum(x.numel() for x in losses),
                    sum(float(x.double().sum()) for x in losses),
                    rows,
                    dots,
                )
            handles = [self.leaves[i].register_hook(hook(i)) for i in live] if (watch or scale != 1.0) else []  # type: ignore[no-untyped-call]  # torch's Tensor.register_hook is unannotated
            try:  # one backward for the group: s is the group's, as the loop's .grad saw it
                _, losses = sum_grad(
                    self.shadow,
                    batches,
                    self.item_losses,
                    [self.leaves[i] for i in live],
                    scale=scale,
                    check_finite=False,
                    accumulate=True,
                )
            except ValueError:
                if any(x.numel() for x in _losses(self, batches)):
                    raise
                losses = []  # a group without a single item: nothing to add
            finally:
                for h in handles:
                    h.remove()
        items = sum(x.numel() for x in losses)
        loss_sum = sum(float(x.double().sum()) for x in losses)
        return items, loss_sum, rows, dots

    def close_group(
        self, grads: Vec, batches: Sequence[Any], how: Replay, *, unclip: float = 1.0, last: bool = False
    ) -> None:
        """Micro-batches ``batches`` have gone through the loop's backward: fit .grad against their replay."""
        assert self.P is not None
        n, loss, rows, dots = self.backward(
            batches, how, watch=(grads, self.P, unclip) if self.finite else None
        )
        self.items, self.loss_sum, self.sequences = (
            self.items + n,
            self.loss_sum + loss,
            self.sequences + rows,
        )
        # |G|^2 is finite only if every entry is
        if dots is not None and not math.isfinite(float(dots[0, 0])):
            self.finite = False
        if self.finite and dots is not None:
            a, beta, resid = fit_group(_weighted(dots.cpu(), [1.0 / unclip, 1.0, 1.0]))
        else:
            a, beta, resid = math.nan, math.nan, math.nan
        self.fits.append(
            Fit(len(batches), n, rows, a, beta, resid, float(dots[0, 0]) if dots is not None else math.nan)
        )
        if not last:
            for i, g in enumerate(grads):
                self._remember(i, g)

    def keep_accumulation(self) -> None:
        """P := O: the micro-batch accumulation kept, before ``redo`` puts another reference (the merged
        window, under BatchNorm) into O."""
        for i, x in enumerate(self.O()):
            self._remember(i, x)

    def _remember(self, i: int, g: torch.Tensor | None) -> None:
        """P_i := g (.grad at this boundary); a buffer only once there is something to hold."""
        assert self.P is not None
        p, leaf = self.P[i], self.leaves[i]
        if g is None:
            if p is not None:
                p.zero_()
        elif p is None or p.shape != leaf.shape or p.device != leaf.device:
            self.P[i] = g.detach().clone()
        else:
            p.copy_(g)

    def O(self) -> Vec:  # noqa: E743 - the O of the module docstring's algebra
        """The oracle's sum, sum_j s_j (read fresh: holding it would stop autograd accumulating in place)."""
        return [leaf.grad for leaf in self.leaves]

    def weights(self) -> tuple[list[float], float]:
        """Per-group weights w_j = N a_j prod_{l>j} beta_l, and the leak coefficient prod beta."""
        w, tail = [0.0] * len(self.fits), 1.0
        for j in range(len(self.fits) - 1, -1, -1):
            w[j] = self.items * self.fits[j].a * tail
            tail *= self.fits[j].beta
        return w, tail

    def redo(self, batches: Sequence[Any], how: Replay) -> tuple[int, float]:
        """O := sum of the gradients over ``batches`` again, computed as ``how`` says (float32 for the
        figure the user reads; the merged window under BatchNorm): the verdict has read O already."""
        for leaf in self.leaves:
            if leaf.grad is not None:
                leaf.grad.zero_()
        n, loss, _, _ = self.backward(batches, how)
        return n, loss


def _cat(vec: Vec, like: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(
        [(t if t is not None else torch.zeros_like(p)).detach().reshape(-1) for t, p in zip(vec, like)]
    )


def _losses(oracle: WindowOracle, batches: Sequence[Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [checked_losses(oracle.item_losses, oracle.shadow, b, check_finite=False) for b in batches]


def _gram_into(
    out: torch.Tensor, parts: list[torch.Tensor | None], scratch: torch.Tensor | None = None
) -> None:
    """out += M @ M.T for the rows M = parts (None: zeros), in float64. A tensor of up to a chunk
    (``chunk_for``) goes in one stack; a larger one a chunk at a time through ``scratch``, a reused
    (>= len(parts), chunk) float64 buffer (a fresh one per call costs page faults)."""
    like = next((t for t in parts if t is not None), None)
    if like is None:
        return
    n, numel, chunk = len(parts), like.numel(), chunk_for(like.device)
    flat = [t.detach().reshape(-1) if t is not None else None for t in parts]
    if numel <= chunk:  # the common case for all but the largest tensors: three ops, no Python loop
        m = torch.stack([f if f is not None else torch.zeros_like(like).reshape(-1) for f in flat]).double()
        out += m @ m.T
        return
    if scratch is None or scratch.shape[0] < n or scratch.shape[1] < chunk or scratch.device != like.device:
        scratch = scratch_for(n, like.device)
    rows = [a for a, f in enumerate(flat) if f is not None]
    acc = torch.zeros(len(rows), len(rows), dtype=torch.float64, device=like.device)
    for start in range(0, numel, chunk):
        width = min(chunk, numel - start)
        for i, a in enumerate(rows):
            scratch[i, :width].copy_(flat[a][start : start + width])  # type: ignore[index]  # rows: flat[a] is set
        m = scratch[: len(rows), :width]
        acc += m @ m.T  # one matrix product reads each row once (separate dots read each twice or more)
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            out[a, b] += acc[i, j]


def leading_rows(batch: Any) -> int:
    """Rows of the batch's first tensor (sequences of a token batch, images of an image batch)."""
    first = next(tensors(batch), None)
    return int(first.shape[0]) if first is not None and first.dim() else 0


def clipped(norm_value: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s coefficient for a gradient of norm ``norm_value``."""
    return min(1.0, max_norm / (norm_value + 1e-6))


__all__ = [
    "Fit",
    "Replay",
    "WindowOracle",
    "chunk_for",
    "clipped",
    "exact",
    "fit_group",
    "gram",
    "scratch_for",
]
