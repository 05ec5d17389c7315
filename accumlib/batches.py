"""Batch plumbing shared by every loop: device moves, windows, merging, validation.

Nothing here does arithmetic on gradients; the loops keep that inline so a reader
sees the step being taught.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch

Batch = Any
ItemLosses = Callable[[torch.nn.Module, Batch], torch.Tensor]
Device = torch.device | str | None


class ProgressBar(Protocol):
    """What a loop's ``progress=`` may be besides a bool: a tqdm bar, or anything with its three methods."""

    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, **kwargs: Any) -> Any: ...
    def close(self) -> Any: ...


Progress = bool | ProgressBar


def to_device(batch: Batch, device: torch.device | str | None) -> Batch:
    """Move every tensor inside ``batch`` (tuples, lists, dicts nest) to ``device``."""
    if device is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    return batch


def windows(loader: Iterable[Batch], accum_steps: int) -> Iterator[list[Batch]]:
    """Group micro-batches into windows of ``accum_steps``; the last may be shorter.

    The last, partial window is yielded, never dropped. An empty loader is an error:
    an epoch that takes no step is almost always a bug in the caller's data.
    """
    window: list[Batch] = []
    seen = 0
    for batch in loader:
        seen += 1
        window.append(batch)
        if len(window) == accum_steps:
            yield window
            window = []
    if window:
        yield window
    if seen == 0:
        raise ValueError(f"loader must yield at least one micro-batch (got an empty loader: {loader!r})")


def checked_losses(
    item_losses: ItemLosses, model: torch.nn.Module, batch: Batch, check_finite: bool = True
) -> torch.Tensor:
    """Call the task's ``item_losses`` and insist on the contract: a finite 1-D tensor.

    ``check_finite=False`` leaves finiteness to ``window_mean``: a per-micro-batch check
    costs a device sync on CUDA and a few percent of a small model's epoch on CPU.
    """
    losses = item_losses(model, batch)
    if not isinstance(losses, torch.Tensor):
        raise ValueError(
            f"item_losses must return a 1-D torch.Tensor of per-item losses (got {type(losses).__name__})"
        )
    if losses.dim() != 1:
        raise ValueError(
            "item_losses must return a 1-D tensor with one unreduced loss per item "
            f"(got shape {tuple(losses.shape)}; did it reduce with a mean, or forget to flatten?)"
        )
    if torch.is_grad_enabled() and not losses.requires_grad:
        raise ValueError(
            "item_losses must return losses attached to the autograd graph (got a tensor with "
            "requires_grad=False: computed under torch.no_grad(), or .detach()ed?)"
        )
    if check_finite and not torch.isfinite(losses.detach()).all():
        bad = losses.detach()[~torch.isfinite(losses.detach())]
        raise ValueError(
            f"item_losses must return finite values (got {bad.numel()} non-finite, e.g. {bad[0].item()})"
        )
    return losses


def window_mean(total: torch.Tensor, n: int) -> float:
    """The window's mean item loss, checked once per window before the optimizer steps.

    A sum is finite only if every term is, so this catches any non-finite item loss
    (the contract) before it can reach the parameters.
    """
    value = float(total / n)
    if not math.isfinite(value):
        raise ValueError(f"item_losses must return finite values (got a window mean item loss of {value})")
    return value


def count_items(batch: Batch) -> int:
    """Default item count: the leading dimension of the batch's first tensor.

    Tasks whose items are not rows (tokens of a language model) pass their own
    ``count_items``; the loops check it against ``item_losses`` so a wrong count is loud.
    """
    first = batch
    while isinstance(first, (list, tuple)):
        first = first[0]
    if isinstance(first, dict):
        first = next(iter(first.values()))
    if not isinstance(first, torch.Tensor):
        raise ValueError(
            f"count_items cannot find a tensor in the batch (got {type(batch).__name__}); pass count_items="
        )
    return int(first.shape[0])


def check_count(expected: int, losses: torch.Tensor) -> None:
    if losses.numel() != expected:
        raise ValueError(
            f"count_items must agree with item_losses: count_items said {expected} items, "
            f"item_losses returned {losses.numel()}"
        )


def window_items(window: Sequence[Batch], counter: Callable[[Batch], int]) -> int:
    """Total item count of a window; a window with no items cannot be normalized."""
    n = sum(counter(b) for b in window)
    if n <= 0:
        raise ValueError(
            "a window must hold at least one item to normalize by "
            f"(got {n} items in {len(window)} micro-batches)"
        )
    return n


def cat_batches(batches: Sequence[Batch], pad_values: Sequence[float] | None = None) -> Batch:
    """Concatenate micro-batches into one batch along dim 0 (the large-batch view).

    Tensors whose trailing sizes differ (padded sequences) are right-padded to the
    longest with ``pad_values[j]`` for field ``j``; without pad values that is an error.
    """
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return _cat([b for b in batches], None if pad_values is None else pad_values[0])
    if isinstance(first, dict):
        keys = list(first)
        pads = dict(zip(keys, pad_values)) if pad_values is not None else {}
        return {k: _cat([b[k] for b in batches], pads.get(k)) for k in keys}
    if isinstance(first, (list, tuple)):
        fields = [
            _cat([b[j] for b in batches], None if pad_values is None else pad_values[j])
            for j in range(len(first))
        ]
        return fields if isinstance(first, list) else tuple(fields)
    raise ValueError(f"cat_batches cannot merge batches of type {type(first).__name__}; pass merge=")


def _cat(tensors: list[torch.Tensor], pad: float | None) -> torch.Tensor:
    if tensors[0].dim() >= 2 and len({t.shape[1:] for t in tensors}) > 1:
        if pad is None:
            shapes = sorted({tuple(t.shape) for t in tensors})
            raise ValueError(
                f"micro-batches have different trailing shapes {shapes}; "
                "pass pad_values= (or merge=) to pad them"
            )
        longest = max(t.shape[1] for t in tensors)
        tensors = [
            torch.nn.functional.pad(t, (0, longest - t.shape[1]), value=pad) if t.dim() == 2 else t
            for t in tensors
        ]
    return torch.cat(tensors, dim=0)


def expected_steps(n_micro_batches: int, accum_steps: int) -> int:
    """Optimizer steps of an epoch that never drops its tail: ceil(n / k)."""
    return math.ceil(n_micro_batches / accum_steps)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kw: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(progress: object, loader: Iterable[Batch], desc: str) -> ProgressBar:
    """``progress=True`` -> a tqdm bar over micro-batches; a tqdm instance is used as is."""
    if progress is False or progress is None:
        return _NoBar()
    if progress is True:
        from tqdm.auto import tqdm

        total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
        return tqdm(total=total, desc=desc, unit="mb")
    if all(hasattr(progress, a) for a in ("update", "set_postfix", "close")):
        return progress
    raise ValueError(f"progress must be True, False or a tqdm bar (got {progress!r})")


class Recording:
    """A loader that remembers every micro-batch it hands out, so a step can be judged on the
    very batches the loop drew (whatever order, whatever the sampler).

    >>> r = Recording([1, 2, 3]); [b for b in r][:2], r.take(), r.take()
    ([1, 2], [1, 2, 3], [])
    """

    def __init__(self, loader: Iterable[Batch]):
        self.loader, self.drawn = loader, []  # type: ignore[var-annotated]

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            self.drawn.append(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def take(self) -> list[Batch]:
        """The batches drawn since the last ``take``, forgotten here."""
        out, self.drawn = self.drawn, []
        return out
