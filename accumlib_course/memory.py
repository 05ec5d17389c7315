"""Activation memory: the bytes autograd saves for backward, measured on any device.

A forward pass saves activations for the backward pass; with accumulation only one
micro-batch's worth is alive at a time, so the peak shrinks by about k. Saved-tensor
hooks see every tensor autograd keeps, which makes the saving visible on a CPU.
Parameters that autograd saves (weights of a Linear) are not activations and are
left out; several views of one storage count as the largest of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accumlib.batches import Batch, ItemLosses, to_device


def activation_bytes(
    model: torch.nn.Module, batch: Batch, item_losses: ItemLosses, *, device: Any = None
) -> int:
    """Bytes of activations saved for backward by one forward of ``batch`` (no backward runs).

    >>> from accumlib import get_task
    >>> task = get_task("mlp-digits"); model = task.make_model(0)
    >>> x, y = next(iter(task.loader(batch_size=8)))
    >>> half = activation_bytes(model, (x[:4], y[:4]), task.item_losses)
    >>> round(activation_bytes(model, (x, y), task.item_losses) / half, 2)  # linear in the batch
    2.0
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    # Held here until the forward ends, so no storage is freed and its address reused by another one mid-way
    # (which would merge two activations into one entry of ``seen``). The graph keeps None instead: a saved
    # tensor handed back by ``pack`` would close a cycle through its own grad_fn that gc cannot free, and each
    # call would leak its forward's activations (409 MiB in lesson 10's cost cell).
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != 0:  # the largest view of each storage, once
            seen[ptr] = max(seen.get(ptr, 0), t.numel() * t.element_size())
        kept.append(t)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        losses = item_losses(model, to_device(batch, device))
    del losses  # the graph dies here,
    kept.clear()  # and the activations with it: nothing is kept
    return sum(seen.values())


def cuda_peak_bytes(fn: Callable[[], Any], *, device: Any = "cuda") -> int:
    """Peak CUDA memory allocated while ``fn()`` runs (needs a GPU; untested here, no GPU is lent to CI).

    >>> x = torch.zeros(1024, device="cuda")  # doctest: +SKIP
    >>> cuda_peak_bytes(lambda: x * 2)  # doctest: +SKIP
    4096
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_peak_bytes needs a CUDA device and none is present")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


__all__ = ["activation_bytes", "cuda_peak_bytes"]
