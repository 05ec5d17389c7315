"""Every gradient clip by norm that torch performs, whatever name the loop called it by.

A loop may write ``torch.nn.utils.clip_grad_norm_(...)``, ``from torch.nn.utils import
clip_grad_norm_`` (a name bound before verify starts, which no patch of a module attribute reaches),
or torch's two-part form ``get_total_norm`` + ``clip_grads_with_norm_``; frameworks (Accelerate,
Lightning, the Trainer) call the first. All of them end in one function object,
``torch.nn.utils.clip_grad._clip_grads_with_norm_`` (``clip_grad_norm_`` calls it by its module's
global name; ``torch.nn.utils.clip_grads_with_norm_`` *is* it). That object is torch's
``_no_grad`` wrapper around the real function, held in a closure cell: replacing the cell's contents
reaches every alias at once, because every alias is the same wrapper. It receives the parameters,
``max_norm`` and the ``total_norm`` it scales by, which is all verify needs.

``on_clip(listener)`` calls ``listener(params, max_norm, total_norm)`` after each clip for as long
as the context is open; listeners nest (verify's recorder and a lesson's grader watch the same run),
and the cell holds torch's own function again once the last one exits, on any exit.

>>> import torch
>>> from torch.nn.utils import clip_grad_norm_          # bound before anything is watched
>>> w = torch.nn.Parameter(torch.ones(4)); w.grad = torch.full((4,), 3.0)
>>> seen = []
>>> with on_clip(lambda ps, max_norm, total: seen.append((max_norm, round(float(total), 3)))):
...     _ = clip_grad_norm_([w], 1.0)
>>> seen
[(1.0, 6.0)]
>>> _ = clip_grad_norm_([w], 1.0); seen                # nothing is watched any more
[(1.0, 6.0)]
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from types import CellType
from typing import Any, cast

import torch
import torch.nn.utils.clip_grad as _clip_mod

from .step_numbers import Clip
from .window_oracle import clipped

Listener = Callable[[list[torch.Tensor], float, torch.Tensor], None]

_listeners: list[Listener] = []
_guard = threading.Lock()


def _cell() -> CellType | None:
    """The closure cell of torch's ``_no_grad`` wrapper that holds the real ``_clip_grads_with_norm_``;
    None under a torch whose clip is not that wrapper."""
    wrapper = _clip_mod._clip_grads_with_norm_
    code = getattr(wrapper, "__code__", None)
    for name, cell in zip(code.co_freevars if code else (), getattr(wrapper, "__closure__", None) or ()):
        if name == "func":
            return cast(CellType, cell)
    return None


_CELL = _cell()
# torch's own function, put back when the last listener leaves
_TORCH_CLIP = _CELL.cell_contents if _CELL is not None else _clip_mod._clip_grads_with_norm_


def _install(fn: Callable[..., Any]) -> None:
    if _CELL is not None:
        _CELL.cell_contents = fn
        return
    # another torch: its module attribute, which clip_grad_norm_ still calls by its global name (any import
    # of clip_grad_norm_ is seen); a clip_grads_with_norm_ imported by name before the run is not
    _clip_mod._clip_grads_with_norm_ = fn
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        torch.nn.utils.clip_grads_with_norm_ = fn


def _installed() -> Any:
    return _CELL.cell_contents if _CELL is not None else _clip_mod._clip_grads_with_norm_


def _observed(parameters: Any, max_norm: float, total_norm: torch.Tensor, *a: Any, **kw: Any) -> Any:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    out = _TORCH_CLIP(params, max_norm, total_norm, *a, **kw)
    for listener in list(_listeners):
        listener(params, float(max_norm), total_norm)
    return out


@contextlib.contextmanager
def on_clip(listener: Listener) -> Iterator[None]:
    """Call ``listener(params, max_norm, total_norm)`` after every clip by norm while the context is open."""
    with _guard:
        _listeners.append(listener)
        _install(_observed)
    try:
        yield
    finally:
        with _guard:
            _listeners.remove(listener)
            if not _listeners:
                _install(_TORCH_CLIP)


def watching() -> bool:
    """True while any listener is registered (the cell holds accumlib's observer)."""
    return _installed() is not _TORCH_CLIP


def share(clips: list[Clip], params: list[torch.Tensor], own: set[int]) -> tuple[list[Clip], bool]:
    """A window's clips as one optimizer's parameters (``own``: their ids) saw them, and whether that is
    one answer. One clip over two optimizers' parameters scaled both by one coefficient k of the norm of
    all: for this optimizer's step it is a clip of its own part's norm (its .grad now, over k) to k times
    that, the same coefficient (exact). With another clip beside it, no one coefficient: False."""
    shared = [c for c in clips if c.params and not c.params <= own]
    if not shared:
        return list(clips), True
    if len(clips) > 1:
        return list(clips), False
    c = shared[0]
    k = clipped(c.total_norm, c.max_norm)
    grads = [p.grad.detach().double().square().sum() for p in params if p.grad is not None]
    pre = math.sqrt(float(torch.stack(grads).sum())) / k if grads else 0.0
    return [Clip(c.seen, k * (pre + 1e-6), pre, c.site, frozenset(own))], True


__all__ = ["share", "on_clip", "watching"]
