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

A script's own reduction (``own_reduction``): a backward's root that is a scalar times a mean or a sum
over a tensor v of per-item values (a reduction="none" call's output times per-item weights or a mask, a
label-smoothed cross-entropy written out) is itself the loss call: v's entries with a nonzero weight are
its items, v_i each one's loss, and u is read at the reduction's node. The graph between v and the values
it comes from must keep each item's value its own (element-wise, views, reductions along a dim other
than the items'); a reduction over the items (a max, a logsumexp over the batch, a mean subtracted) is
refused by name, never judged.
"""

from __future__ import annotations

import contextlib
import math
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
    # a script's own reduction (``own_reduction``): a mean's divisor, v.numel(), where a mask's zeros make
    # the items fewer; and the node (and its input) whose incoming gradient says which of v's entries weigh
    m: int | None = None
    counter: Any = None
    at: int = 0
    sign: float = 1.0  # -1 where the root negates the reduction (-ll.mean()): its items' losses are -v_i

    def loss_sum(self) -> torch.Tensor:
        """The sum of its items' losses, in float64 (a mean times its divisor)."""
        v = self.value.double()
        return v.sum() * (self.items if self.m is None else self.m) if self.reduction == "mean" else v.sum()

    def counted(self, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        """A prehook on ``counter``: the items are v's entries whose weight is not zero (a mask's zeros are
        none), read off the gradient reaching the per-item values below their weights."""
        g = grad_outputs[self.at]
        if g is not None:
            self.items = g.ne(0).sum()


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

# -- a script's own reduction over per-item values (``own_reduction``), by autograd node name ------------
# between a backward's root and the reduction: the root is a scalar times it (1/k, a GradScaler's scale)
SCALAR = frozenset({"MulBackward0", "DivBackward0", "NegBackward0", "ToCopyBackward0", "CloneBackward0"})
OWN = {"MeanBackward0": "mean", "MeanBackward1": "mean", "SumBackward0": "sum", "SumBackward1": "sum"}
# views and selections: each item's value stays its own, and the tensor's rows are read afresh below them
VIEWS = frozenset(
    "ViewBackward0 UnsafeViewBackward0 ReshapeAliasBackward0 ExpandBackward0 UnsqueezeBackward0 "
    "SqueezeBackward0 SqueezeBackward1 SqueezeBackward2 SelectBackward0 SliceBackward0 IndexBackward0 "
    "MaskedSelectBackward0".split()
)
# element-wise: each entry's value from the same entry of its inputs (a constant broadcast in)
ELEMENTWISE = frozenset(
    "MulBackward0 MulBackward1 DivBackward0 DivBackward1 NegBackward0 ToCopyBackward0 CloneBackward0 "
    "AddBackward0 AddBackward1 SubBackward0 SubBackward1 RsubBackward0 RsubBackward1 ExpBackward0 "
    "Expm1Backward0 LogBackward0 Log1PBackward0 SqrtBackward0 RsqrtBackward0 PowBackward0 PowBackward1 "
    "PowBackward2 ReciprocalBackward0 AbsBackward0 ClampBackward0 ClampBackward1 ClampMinBackward0 "
    "ClampMaxBackward0 WhereBackward0 MaskedFillBackward0 MaskedFillBackward1 SigmoidBackward0 "
    "LogSigmoidBackward0 TanhBackward0 SoftplusBackward0 MaximumBackward0 MinimumBackward0 LerpBackward0 "
    "LerpBackward1".split()
)
# along a dim (``_saved_dim``): each item's own where that dim is not the items' (dim 0)
ALONG = frozenset(
    "SumBackward1 MeanBackward1 LogSoftmaxBackward0 SoftmaxBackward0 GatherBackward0 LogsumexpBackward0 "
    "MaxBackward0 MinBackward0 AmaxBackward0 AminBackward0 LinalgVectorNormBackward0 NormBackward1 "
    "StdBackward0 VarBackward0 CumsumBackward0 SortBackward0 TopkBackward0 TransposeBackward0".split()
)
# over every entry at once, or moving the items off dim 0: mixes the items
WHOLE = frozenset(
    "SumBackward0 MeanBackward0 MaxBackward1 MinBackward1 MedianBackward0 ProdBackward0 NormBackward0 "
    "TBackward0 PermuteBackward0".split()
)
# linear in one input, times a constant (a per-item weight, a mask) or a view: the items are counted below
# them, where the gradient carries the weights' zeros
WEIGHS = frozenset(
    "MulBackward0 DivBackward0 NegBackward0 WhereBackward0 MaskedFillBackward0 ToCopyBackward0 "
    "CloneBackward0 ViewBackward0 UnsafeViewBackward0 ReshapeAliasBackward0 UnsqueezeBackward0 "
    "SqueezeBackward0 SqueezeBackward1 SqueezeBackward2".split()
)


def own_reduction(root: torch.Tensor, calls: list[LossCall], site: str) -> LossCall | str | None:
    """A backward's ``root`` as a loss call of the script's own: a scalar times a mean or a sum over a tensor
    v of per-item values, from ``calls`` (the one reduction="none" call below it) or, with no call, from
    the script's own computation on its model's output. Returns that call (``site``: where it is, with no
    call); or, where an op over the items lies between v and what it comes from, why (a refusal to name);
    or None: the root is no such reduction, or an op this does not know lies between v and the call.

    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> w = torch.tensor([1.0, 2.0, 0.0, 1.0])  # per-item weights; the third item is masked
    >>> own = own_reduction((torch.nn.functional.log_softmax(x, -1)[:, 0] * w).sum() / 3, [], "here")
    >>> own.reduction, own.m, type(own.node).__name__
    ('sum', None, 'SumBackward0')
    >>> own_reduction((x.logsumexp(0) - x).mean() / 4, [], "here")
    'LogsumexpBackward0 runs over the items'
    """
    node = root.grad_fn
    if node is None or root.numel() != 1 or len(calls) > 1:
        return None
    sign = 1.0
    while type(node).__name__ in SCALAR:
        edges = _inputs(node)
        if len(edges) != 1:
            return None
        sign *= _sign(node)
        node = edges[0][0]
    kind = OWN.get(type(node).__name__)
    edges = _inputs(node) if kind else []
    if len(edges) != 1:
        return None
    below, nr = edges[0]
    shape = _shape(below, nr)
    if not shape:  # a torch without the graph's shapes, or one number reduced: no items to see
        return None
    per_item, why = _per_item(below, nr, shape, calls)
    if not per_item:
        return why or None
    if kind == "sum" and not calls and len(shape) > 1:  # an item is a row, or an entry: the graph cannot say
        return (
            f"a sum over a {tuple(shape)} tensor of the script's own, whose entries or rows may be the items"
        )
    n = math.prod(shape)
    counter, at = _counter(below, nr, n)
    call = calls[0] if calls else None
    items = torch.zeros((), dtype=torch.long, device=root.device)  # set as the backward reaches ``counter``
    own = LossCall(
        call.kind if call else f"a {kind} of the script's own per-item losses",
        call.site if call else site,
        kind,
        items,
        node,
        root.detach(),  # the root, read back into the reduction's value as u arrives (``inplace._upstream``)
        m=n if kind == "mean" else None,
        counter=counter,
        at=at,
        sign=sign,
    )
    if call is not None and call.value.numel() == n:  # the call's own items, weighed: its sequences too
        own.sequences = call.sequences
    return own


def _sign(node: Any) -> float:
    """-1 where a node between the root and the reduction negates it: a negation, or a product or quotient
    with a negative number kept on the CPU (``-k``, a Python number); a device tensor's sign is not read (a
    sync per backward), taken as positive (a GradScaler's scale, a 1/k)."""
    name = type(node).__name__
    if name == "NegBackward0":
        return -1.0
    if name not in ("MulBackward0", "DivBackward0"):
        return 1.0
    first = node.next_functions[0][0] is not None
    if name == "DivBackward0" and not first:
        return 1.0
    c = getattr(node, "_saved_other" if first else "_saved_self", None)
    negative = isinstance(c, torch.Tensor) and c.device.type == "cpu" and c.numel() == 1 and float(c) < 0
    return -1.0 if negative else 1.0


def _inputs(node: Any) -> list[tuple[Any, int]]:
    return [(n, i) for n, i in node.next_functions if n is not None]


def _shape(node: Any, nr: int) -> tuple[int, ...] | None:
    """The shape of ``node``'s ``nr``-th forward output, as the graph keeps it (None: not kept)."""
    meta = getattr(node, "_input_metadata", None)
    return tuple(int(d) for d in meta[nr].shape) if meta is not None and nr < len(meta) else None


def _rows(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> bool:
    """Some leading dims of each hold the same count: the items kept their rows, as far as shapes say."""
    if a is None or b is None:
        return False
    return bool(
        {math.prod(a[:d]) for d in range(1, len(a) + 1)} & {math.prod(b[:d]) for d in range(1, len(b) + 1)}
    )


def _over_items(node: Any) -> bool:
    """An op along a dim runs along the items': dim 0 among its dims, all of them, or a 1-D input's."""
    if type(node).__name__ == "TransposeBackward0":
        dims: tuple[int, ...] = (node._saved_dim0, node._saved_dim1)
    else:
        d = getattr(node, "_saved_dim", None)
        dims = () if d is None else (d,) if isinstance(d, int) else tuple(d)
    edges = _inputs(node)
    ndim = len(_shape(*edges[0]) or ()) if edges else 0
    # a negative dim may come back as its unsigned 64-bit word (GatherBackward0: -1 as 2**64 - 1)
    return (
        not dims or ndim <= 1 or 0 in {(int(d) - (1 << 64) if d >= 1 << 63 else int(d)) % ndim for d in dims}
    )


def _per_item(node: Any, nr: int, shape: tuple[int, ...], calls: list[LossCall]) -> tuple[bool, str]:
    """Whether the values reduced (``node``'s output ``nr``, of ``shape``) keep each item's value its own
    down to where they come from: the loss call, or (no call) the first op this does not know, the model's
    output, which must hold the items' rows. (False, why) where an op over the items lies between; (False,
    "") where an op this does not know lies between them and the call."""
    todo, seen, sources = [(node, nr, shape)], set(), {id(c.node) for c in calls}
    while todo:
        node, nr, rows = todo.pop()
        name = type(node).__name__
        if id(node) in sources:
            if not _rows(_shape(node, nr), rows):
                return False, ""
            continue
        if id(node) in seen or name == "AccumulateGrad":  # a parameter: every item's alike
            continue
        seen.add(id(node))
        if name in WHOLE or (name in ALONG and _over_items(node)):
            return False, f"{name} runs over the items"
        if name not in VIEWS and name not in ELEMENTWISE and name not in ALONG:
            if calls:
                return False, ""
            if not _rows(_shape(node, nr), rows):
                return False, f"{name}'s output {_shape(node, nr)} does not hold the items' rows {rows}"
            continue  # the model's output: where the script's own per-item loss begins
        for child, at in _inputs(node):
            todo.append((child, at, _shape(child, at) if name in VIEWS else rows))
    return True, ""


def _counter(node: Any, nr: int, n: int) -> tuple[Any, int]:
    """Where v's items are counted: down from v through the weights and masks that multiply it, to the first
    node whose incoming gradient is u times those weights at v's size (``LossCall.counted``)."""
    while type(node).__name__ in WEIGHS:
        edges = _inputs(node)
        if len(edges) != 1 or (type(node).__name__ == "DivBackward0" and node.next_functions[0][0] is None):
            break  # two inputs carry the value, or it divides a constant: not a weight
        child, at = edges[0]
        if math.prod(_shape(child, at) or (-1,)) != n:
            break
        node, nr = child, at
    return node, nr


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


__all__ = ["CALLS", "LossCall", "on_loss_call", "own_reduction"]
