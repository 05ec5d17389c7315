"""What changed ``.grad`` besides the loop's backwards, for the diagnose stage to name as a cause.

- a factor applied to ``.grad`` between the window's last backward and the step (a manual
  ``p.grad.mul_``): each backward leaves a fingerprint of ``.grad`` (its first few entries, no copy
  of the gradient, no device sync), and at the step the ratio now / then is one number when one
  factor was applied; the clips torch performed and GradScaler's ``unscale_`` are divided out, as
  verify saw them happen;
- functions hooked on a parameter's gradient (``Tensor.register_hook``): they change what every
  backward deposits, so a misscale is theirs before it is the loss's. Named by file:line;
- the parameters themselves, moved inside a window (``p.data.add_``, an edit under ``torch.no_grad``):
  the later micro-batches' gradients are taken at other parameters, which the deposits and so the in-place
  engine's sum follow. A ``.data`` edit moves no version counter, so the parameters' bits are summed
  (``checksum``) as the window opens and at its step.

>>> import torch
>>> w = torch.nn.Parameter(torch.ones(3)); w.grad = torch.tensor([1.0, 2.0, 0.0])
>>> prints = {id(w): fingerprint(w.grad)}
>>> _ = w.grad.mul_(0.25)
>>> rescale([w], prints), unexplained(0.25, 1.0, 1.0), unexplained(0.25, 1.0, 4.0)
(0.25, 0.25, 1.0)
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from .sites import code_site

PRINT = 4  # entries of each parameter's .grad fingerprinted after each backward
_OWN_CODE = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))
# one factor applied to float32 numbers leaves equal ratios up to a float32 rounding each (~1e-7)
SAME_RATIO = 1e-5
# a factor verify saw applied (a clip's coefficient, 1/scale) is matched within its own rounding
_KNOWN_RATIO = 1e-4


def fingerprint(g: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``PRINT`` entries of a gradient, kept where they are (no device sync); written into
    ``into`` where it fits (the parameter's previous fingerprint): no new block per backward, which would
    be made amid the backward's frees and pin the allocator's holes past it."""
    h = head(g)
    if into is None or into.shape != h.shape or into.dtype != h.dtype or into.device != h.device:
        return h.clone()
    return into.copy_(h)


def head(g: torch.Tensor) -> torch.Tensor:
    """The first ``PRINT`` entries of a gradient, flattened: a view, no copy. A contiguous plain tensor's
    are its storage's next entries, taken in one op (every backward takes them for every parameter)."""
    n = min(PRINT, g.numel())
    if type(g) is torch.Tensor and not g.requires_grad and g.is_contiguous():
        return g.as_strided((n,), (1,))
    return g.detach().reshape(-1)[:n]


def rescale(params: list[torch.nn.Parameter], prints: dict[int, torch.Tensor]) -> float:
    """The one factor every parameter's ``.grad`` was multiplied by since its fingerprint (1.0 when
    untouched; nan when the entries disagree: not one factor). Read in one sync, compared in plain
    Python (a few entries per parameter: a tensor op per parameter would cost more)."""
    before, now = [], []
    for p in params:
        b, g = prints.get(id(p)), p.grad
        if b is None or type(g) is not torch.Tensor:
            continue
        before.append(b.reshape(-1))
        now.append(g.detach().reshape(-1)[: b.numel()])
        if now[-1].numel() != b.numel():  # .grad replaced by a smaller tensor: no factor relates the two
            return math.nan
    if not before:
        return 1.0
    n = sum(b.numel() for b in before)
    host = torch.cat([t.double() for t in (*before, *now)]).tolist()
    r = [y / x for x, y in zip(host[:n], host[n:]) if x != 0]
    if not r:
        return 1.0
    return r[0] if all(abs(x - r[0]) <= SAME_RATIO * abs(r[0]) for x in r) else math.nan


def unexplained(r: float, unclip: float, scale: float) -> float:
    """``r`` less what verify saw do it: the clips after the last backward (``unclip``, their product)
    and GradScaler's ``unscale_`` (1/``scale``); 1.0 when those explain it, nan stays nan."""
    if not math.isfinite(r):
        return r
    for known in (unclip, unclip / scale):
        if abs(r - known) <= _KNOWN_RATIO * abs(known):
            return 1.0
    return r / unclip


@lru_cache(maxsize=1024)
def _own(filename: str) -> bool:  # resolved once per file: every step asks for every parameter's hooks
    return str(Path(filename).resolve()).startswith(_OWN_CODE)


def hooked(params: list[torch.nn.Parameter]) -> list[str]:
    """file:line of every function hooked on a parameter's gradient (``Tensor.register_hook``), torch's
    and accumlib's own left out."""
    out = []
    for p in params:
        for fn in (getattr(p, "_backward_hooks", None) or {}).values():
            fn = getattr(fn, "func", fn)  # functools.partial
            # a function, or a callable object (its class's __call__)
            code = getattr(fn, "__code__", None) or getattr(vars(type(fn)).get("__call__"), "__code__", None)
            if code is None or _own(code.co_filename):
                continue
            at = code_site(code)
            if at not in out:
                out.append(at)
    return out


def prints(params: dict[int, torch.Tensor]) -> tuple[list[int], torch.Tensor | None]:
    """The first ``PRINT`` entries of every parameter's .grad, in one tensor (one kernel, no sync)."""
    keys = [k for k, p in params.items() if p.grad is not None]
    if not keys:
        return keys, None
    return keys, torch.cat([head(params[k].grad) for k in keys])  # type: ignore[arg-type]  # keys: .grad is set


def checksum(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's bits summed as 64-bit words (wrapping): any edit of any entry changes it but for one
    that cancels to the bit, whatever order a kernel sums in. One 0-dim int64 per tensor, on its device, no
    sync; a pass over the bytes as fast as a float sum (an int32 view summed as int64 is ~20x slower, so
    only a misaligned tensor's words are read that way). Blind to entries swapped within one tensor."""
    return [_words(t.detach()) for t in tensors]


def _words(t: torch.Tensor) -> torch.Tensor:
    flat = t.as_strided((t.numel(),), (1,)) if _dense(t) else t.reshape(-1)
    size = flat.element_size()
    if size > 8:  # complex128: two words an entry
        return flat.view(torch.int64).sum()
    per = 8 // size  # entries a word
    whole = flat.numel() // per * per
    same = _INTS[size]
    if whole == 0 or flat.storage_offset() % per:
        return flat.view(same).sum(dtype=torch.int64)
    total = flat[:whole].view(torch.int64).sum()
    return total + flat[whole:].view(same).sum(dtype=torch.int64) if whole < flat.numel() else total


_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dense(t: torch.Tensor) -> bool:
    """Its entries fill one run of its storage from its offset (channels-last too): read as one flat view."""
    if t.is_contiguous():
        return True
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return fmt is not None and t.is_contiguous(memory_format=fmt)


def differ(before: list[torch.Tensor], now: list[torch.Tensor]) -> list[bool]:
    """Which checksums moved: one sync per device (one, in a run on one device)."""
    out = [False] * len(now)
    by: dict[torch.device, list[int]] = {}
    for i, n in enumerate(now):
        by.setdefault(n.device, []).append(i)
    for idx in by.values():
        moved = torch.stack([before[i].to(now[i].device) != now[i] for i in idx]).tolist()
        for i, m in zip(idx, moved):
            out[i] = bool(m)
    return out


def factors(prints: list[Any]) -> list[float]:
    """Each fingerprint pair's one factor (``_prints_now``): 1.0 untouched, or holding only zeros (a factor
    applied to zeros changes nothing); 0.0 zeroed or set to None; nan not one factor. One device sync."""
    pairs = [p for p in prints if isinstance(p, tuple)]
    flat = [t.reshape(-1) for b, n in pairs for t in (b, n if n is not None else b[:0])]
    # a few entries per parameter: read once, then plain Python (faster than a tensor op per pair)
    host = torch.cat([t.double() for t in flat]).tolist() if flat else []
    at, out = 0, []
    for p in prints:
        if not isinstance(p, tuple):
            out.append(float(p))
            continue
        size, later = p[0].numel(), (p[1].numel() if p[1] is not None else 0)
        b, n = host[at : at + size], host[at + size : at + size + later]
        at += size + later
        keep = [i for i, x in enumerate(b) if x != 0]
        if not keep:
            out.append(1.0)
        elif p[1] is None:
            out.append(0.0)
        else:
            r = [n[i] / b[i] for i in keep]
            same = all(abs(x - r[0]) <= SAME_RATIO * abs(r[0]) for x in r)
            out.append(r[0] if same else math.nan)
    return out


__all__ = [
    "PRINT",
    "SAME_RATIO",
    "checksum",
    "differ",
    "factors",
    "fingerprint",
    "hooked",
    "prints",
    "rescale",
    "unexplained",
]
