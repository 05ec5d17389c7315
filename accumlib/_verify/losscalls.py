"""Where a script's items come from: every standard loss call torch makes, whatever imported it.

``accumlib run`` and ``accumlib.watch`` judge a run that verify did not set up: no ``item_losses``
was given, so the items are the ones the script's own loss calls count. Every ``torch.nn.functional``
loss (and so every ``torch.nn`` loss module, and Transformers' loss functions, which call them) ends in
one of a few functions of ``torch._C._nn`` (or ``torch.binary_cross_entropy_with_logits``), looked up
by attribute at each call. Replacing those attributes sees every call, ``from torch.nn.functional
import cross_entropy`` included, with its arguments after torch resolved them: the reduction as an
enum, ``ignore_index``, the class weights.

A call's items, the terms its reduction averages or sums:

    cross_entropy / nll_loss, class targets   targets != ignore_index (weighted: their weights' sum)
    cross_entropy, probability targets        rows: input.numel() / C
    mse, l1, smooth_l1, huber, bce(_logits)   elements: input.numel()

For ``reduction="mean"`` the call returns (1/n) sum_i l_i, for ``"sum"`` sum_i l_i; for ``"none"`` the
script reduces the vector itself, and the gradient flowing into it says how (``inplace.py``). Counts
stay tensors where they were made (no device sync per call); a call whose output needs no gradient
(evaluation under ``no_grad``) is not a training loss and is ignored.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .sites import user_site

REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@dataclass
class LossCall:
    """One standard loss call whose output needs a gradient: what it is, where, and its items."""

    kind: str  # the torch.nn.functional name
    site: str  # file:line in the user's code (``sites.py``)
    reduction: str  # mean, sum or none
    items: torch.Tensor  # 0-dim: the terms the reduction runs over (or their weights' sum)
    node: Any  # the output's grad_fn, the node a backward's graph walk stops at
    value: torch.Tensor  # the output, detached: the loss sum of its items, read at the step
    index: int = 0  # which of ``node``'s outputs it is (a function's output may be a split's, a view's)
    sequences: int = 0  # the rows a token target came from (``_sequences``), 0 where it is no sequence's

    def loss_sum(self) -> torch.Tensor:
        """The sum of its items' losses, in float64 (a mean times its items)."""
        v = self.value.double()
        return v.sum() * self.items if self.reduction == "mean" else v.sum()


def _class_items(target: torch.Tensor, weight: torch.Tensor | None, ignore: int) -> torch.Tensor:
    keep = target != ignore
    if weight is None:
        return keep.sum()
    return weight[target.clamp(min=0)].mul(keep).sum()  # a weighted mean divides by the weights' sum


def _sequences(name: str, args: tuple[Any, ...]) -> int:
    """The sequences a class target's tokens came from: its leading size where it is 2-D or more, or its
    base's where it is a flat view of one (Transformers' causal-LM loss flattens the shifted labels with
    ``.view(-1)``); 0 for one label per item. The rule for labels counted before the shift reads it."""
    if name not in ("cross_entropy", "nll_loss") or len(args) < 2 or not isinstance(args[1], torch.Tensor):
        return 0
    target = args[1]
    if target.is_floating_point():
        return 0
    shaped = target if target.dim() >= 2 else target._base
    return int(shaped.shape[0]) if isinstance(shaped, torch.Tensor) and shaped.dim() >= 2 else 0


def _cross_entropy(args: tuple[Any, ...]) -> tuple[int, torch.Tensor]:
    inp, target, weight, reduction, ignore = args[:5]
    if target.is_floating_point():  # probabilities: one term per row (and position)
        rows = inp.numel() // inp.shape[1] if inp.dim() >= 2 else 1
        return reduction, torch.tensor(rows, device=inp.device)
    return reduction, _class_items(target, weight, ignore)


def _nll(args: tuple[Any, ...]) -> tuple[int, torch.Tensor]:
    inp, target, weight, reduction, ignore = args[:5]
    return reduction, _class_items(target, weight, ignore)


def _elements(position: int) -> Callable[[tuple[Any, ...]], tuple[int, torch.Tensor]]:
    def count(args: tuple[Any, ...]) -> tuple[int, torch.Tensor]:
        return args[position], torch.tensor(args[0].numel(), device=args[0].device)

    return count


# (namespace, attribute, the functional's name, the reduction enum's position -> items)
CALLS: tuple[tuple[Any, str, str, Callable[[tuple[Any, ...]], tuple[int, torch.Tensor]]], ...] = (
    (torch._C._nn, "cross_entropy_loss", "cross_entropy", _cross_entropy),
    (torch._C._nn, "nll_loss_nd", "nll_loss", _nll),
    (torch._C._nn, "mse_loss", "mse_loss", _elements(2)),
    (torch._C._nn, "l1_loss", "l1_loss", _elements(2)),
    (torch._C._nn, "smooth_l1_loss", "smooth_l1_loss", _elements(2)),
    (torch._C._nn, "huber_loss", "huber_loss", _elements(2)),
    (torch._C._nn, "binary_cross_entropy", "binary_cross_entropy", _elements(3)),
    (torch, "binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits", _elements(4)),
)

_lock = threading.Lock()
_listeners: list[Callable[[LossCall], None]] = []
_originals: dict[tuple[int, str], Any] = {}


def _wrap(name: str, original: Any, items: Callable[[tuple[Any, ...]], tuple[int, torch.Tensor]]) -> Any:
    def call(*args: Any) -> Any:
        out = original(*args)
        if _listeners and isinstance(out, torch.Tensor) and out.requires_grad and out.grad_fn is not None:
            with torch.no_grad():
                reduction, n = items(args)
            seen = LossCall(name, user_site() or "", REDUCTIONS[reduction], n, out.grad_fn, out.detach())
            seen.sequences = _sequences(name, args)
            for listener in list(_listeners):
                listener(seen)
        return out

    return call


@contextlib.contextmanager
def on_loss_call(listener: Callable[[LossCall], None]) -> Iterator[None]:
    """Call ``listener(LossCall)`` after every standard loss call that needs a gradient, for as long
    as the context is open; torch's own functions are back on any exit.

    >>> import torch
    >>> from torch.nn.functional import cross_entropy      # bound before anything is watched
    >>> seen = []
    >>> x = torch.zeros(4, 3, requires_grad=True)
    >>> with on_loss_call(seen.append):
    ...     _ = cross_entropy(x, torch.tensor([0, 1, -100, 2]))
    ...     with torch.no_grad():
    ...         _ = cross_entropy(x, torch.tensor([0, 1, 2, 2]))   # evaluation: no gradient, ignored
    >>> [(c.kind, c.reduction, int(c.items)) for c in seen]
    [('cross_entropy', 'mean', 3)]
    """
    with _lock:
        if not _listeners:
            for space, attr, name, items in CALLS:
                _originals[(id(space), attr)] = getattr(space, attr)
                setattr(space, attr, _wrap(name, getattr(space, attr), items))
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
            if not _listeners:
                for space, attr, _, _ in CALLS:
                    setattr(space, attr, _originals.pop((id(space), attr)))


__all__ = ["CALLS", "LossCall", "on_loss_call"]
