"""The oracle: the true large-batch gradient of a window, at the model's current parameters.

    g* = grad_theta (1/N) sum_{i in window} l_i(theta)

computed with one forward over the merged window (so BatchNorm sees the large batch)
and ``torch.autograd.grad``, which leaves ``.grad`` alone. The model's buffers
(BatchNorm running statistics) are restored afterwards: the caller's model is never
changed behind its back. ``dtype=torch.float64`` gives the floor for exactness tests.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .batches import Batch, ItemLosses, cat_batches, checked_losses, to_device


def _cast(batch: Batch, dtype: torch.dtype) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return (
            type(batch)(_cast(v, dtype) for v in batch)
            if isinstance(batch, list)
            else tuple(_cast(v, dtype) for v in batch)
        )
    return batch


def true_gradient(
    model: torch.nn.Module,
    batches: Sequence[Batch],
    item_losses: ItemLosses,
    *,
    merge: Callable[[Sequence[Batch]], Any] = cat_batches,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Gradient of the mean item loss over all micro-batches in ``batches``, by name.

    >>> from accumlib import get_task, true_gradient
    >>> task = get_task("mlp-digits"); model = task.make_model(0)
    >>> window = list(task.loader())[:4]
    >>> g = true_gradient(model, window, task.item_losses)
    >>> sorted(g)[:2]
    ['net.0.bias', 'net.0.weight']
    """
    if len(batches) == 0:
        raise ValueError("batches must hold at least one micro-batch (got an empty sequence)")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        # its forward would arm an all-reduce that no other rank joins
        raise TypeError(
            "model must be the plain module, not DistributedDataParallel "
            "(got a DDP wrapper; pass model.module)"
        )
    net = copy.deepcopy(model).to(dtype) if dtype is not None else model
    saved = {k: v.clone() for k, v in net.named_buffers()} if net is model else {}
    batch = to_device(merge(list(batches)), device)
    if dtype is not None:
        batch = _cast(batch, dtype)
    named = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
    try:
        grads, _ = sum_grad(net, [batch], item_losses, [p for _, p in named], scale=None)
    finally:
        with torch.no_grad():
            for k, v in net.named_buffers():
                if k in saved:
                    v.copy_(saved[k])
    return {k: (g if g is not None else torch.zeros_like(p)).detach() for (k, p), g in zip(named, grads)}


def sum_grad(
    model: torch.nn.Module,
    batches: Sequence[Batch],
    item_losses: ItemLosses,
    params: Sequence[torch.Tensor],
    *,
    scale: float | None = 1.0,
    check_finite: bool = True,
    accumulate: bool = False,
) -> tuple[list[torch.Tensor | None] | None, list[torch.Tensor]]:
    """``grad of scale * sum_i l_i`` over the items of ``batches`` (``scale=None``: their mean),
    with one forward per batch and one backward; returns the gradients and each batch's item losses.

    The one place a gradient of item losses is taken: ``true_gradient`` calls it on the merged
    window, ``accumlib.verify`` once per micro-batch (the identity
    ``grad (1/N) sum_i l_i == sum_j grad (sum_{i in b_j} l_i) / N`` that ``accumlib.ragged``
    implements). By default ``torch.autograd.grad`` returns the gradients and leaves ``.grad``
    alone (unused parameters get None); ``accumulate=True`` adds them into ``params``' own
    ``.grad`` instead, in place, and returns None for them (verify's streaming oracle).
    ``check_finite=False`` lets inf/nan through (verify judges a diverged run, it does not refuse it).

    >>> import torch, accumlib
    >>> task = accumlib.get_task("mlp-digits"); model = task.make_model(0)
    >>> x, y = next(iter(task.loader()))
    >>> grads, losses = sum_grad(model, [(x, y)], task.item_losses, list(model.parameters()))
    >>> losses[0].shape, grads[0].shape == model.net[0].weight.shape
    (torch.Size([8]), True)
    """
    losses = [checked_losses(item_losses, model, b, check_finite=check_finite) for b in batches]
    total = torch.cat(losses).mean() if scale is None else sum(x.sum() for x in losses) * scale
    if not isinstance(total, torch.Tensor) or not total.requires_grad:
        raise ValueError(
            "item_losses must return losses that depend on the model's parameters (got a tensor with "
            "requires_grad=False: was it detached, or computed under torch.no_grad()?)"
        )
    if accumulate:
        torch.autograd.backward(total, inputs=list(params))
        return None, [x.detach() for x in losses]
    grads = torch.autograd.grad(total, list(params), allow_unused=True)
    return list(grads), [x.detach() for x in losses]


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every trainable parameter's ``.grad`` by name (zeros where it is None).

    >>> model = torch.nn.Linear(2, 1)
    >>> model(torch.ones(1, 2)).sum().backward()
    >>> g = grads_of(model); sorted(g), g["bias"]
    (['bias', 'weight'], tensor([1.]))
    """
    return {
        k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for k, p in model.named_parameters()
        if p.requires_grad
    }


__all__ = ["grads_of", "sum_grad", "true_gradient"]
