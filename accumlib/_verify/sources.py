"""Following the data: which dataset items each micro-batch holds, seen in the main process.

``Tracked`` wraps a map-style dataset and ``TrackedIterable`` an iterable one; both report what
the loop draws, wherever it draws it (verify's loader, a loader the loop builds itself over
``loader.dataset``, a framework's re-created loader). A DataLoader worker process cannot report
back, so it is refused with ``WORKERS``. Used by the record stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

WORKERS = (
    "accumlib.verify records each micro-batch in the main process, as it arrives; the loop iterates its data "
    "in a DataLoader worker process (num_workers > 0), which cannot report back. Use num_workers=0 under "
    "verify: "
    "the verdict does not depend on it"
)


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):  # dict, or a UserDict such as Hugging Face's BatchEncoding
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


class Tracked(Dataset):
    """The user's map-style dataset, read-only, noting which indices each micro-batch holds."""

    def __init__(self, dataset: Dataset):
        self.dataset, self.pending = dataset, []  # type: ignore[var-annotated]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        if get_worker_info() is not None:
            raise RuntimeError(WORKERS)
        try:
            item = self.dataset[i]
        except IndexError:
            # `for x in dataset` (Python's sequence protocol) read 0..i-1 and ends here: a sweep over
            # the data for the loop's own purposes (item lengths), not a micro-batch
            if i > 0 and self.pending[-i:] == list(range(i)):
                del self.pending[-i:]
            raise
        self.pending.append(i)
        return item


class TrackedIterable(IterableDataset):
    """The user's IterableDataset, noting where each pass over it ends."""

    def __init__(self, dataset: IterableDataset):
        self.dataset = dataset
        self.pending = 0  # items drawn since the last collate
        self.on_end: Callable[[bool], None] = lambda pending: None

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:
            raise RuntimeError(WORKERS)
        for item in self.dataset:
            self.pending += 1
            yield item
        self.on_end(self.pending > 0)


@dataclass
class Passes:
    """Where passes over a map-style dataset end, and what each handed out.

    A pass is one DataLoader iteration over the dataset: its length (``drop_last`` and the sampler
    included) says where it ends, even when it hands out fewer items than the dataset holds. Without
    an iteration (a sampler with no length), a pass ends once every item was handed out."""

    held: int  # items in the dataset
    batches: int | None = None  # micro-batches the current iteration yields (None: none seen)
    drawn: int = 0  # micro-batches drawn in the current pass
    items: int = 0  # items drawn in the current pass
    counts: dict[int, int] = field(default_factory=dict)  # dataset index -> draws in the current pass
    complete: bool = True  # every iteration the loop began ran to its end
    abandoned: int = 0  # iterations the loop left before their end to begin another
    stream: bool = False  # the loop's loader is a stream, not passes over the data (replacement, no length)
    duplicates: int = 0  # draws of an item already drawn in the same pass (a sampler with replacement)
    seen: set[int] = field(default_factory=set)  # every dataset index the loop drew
    left_out: list[int] = field(default_factory=list)  # per ended pass: dataset items it never drew
    left_out_by: str = ""  # why a pass drew fewer items than the dataset holds

    def began(self, loader: Any) -> None:
        """The loop began iterating a DataLoader over the dataset. One still open is incomplete: the
        loop stopped drawing, so items it never drew are the loop's to step, not the loader's to leave out."""
        if self.batches is not None and self.drawn > 0:
            self.complete, self.abandoned = False, self.abandoned + 1
            self._reset()
        try:
            self.batches = len(loader)
        except TypeError:  # a sampler without a length
            self.batches = None
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None) or getattr(
            loader, "sampler", None
        )
        # draws with replacement, or more draws than the data holds: no pass over the data to finish
        self.stream = (
            self.batches is None
            or bool(getattr(sampler, "replacement", False))
            or (self.batches * (getattr(loader, "batch_size", None) or 1) > 2 * self.held)
        )
        # a DataLoader built with a batch_sampler (Accelerate's, the Trainer's) keeps drop_last and
        # batch_size there
        batches = getattr(loader, "batch_sampler", None)
        drop = getattr(loader, "drop_last", False) or getattr(batches, "drop_last", False)
        size = loader.batch_size or getattr(batches, "batch_size", None) or 1
        if drop and self.held % size:
            self.left_out_by = f"drop_last=True with batch_size {size}"
        elif not self.left_out_by:
            self.left_out_by = "its sampler"

    def drew(self, idx: list[int]) -> bool:
        """A micro-batch of these dataset indices was drawn; True when it ends the pass."""
        self.seen.update(idx)
        for i in idx:
            self.counts[i] = self.counts.get(i, 0) + 1
        self.drawn, self.items = self.drawn + 1, self.items + len(idx)
        end = self.drawn == self.batches if self.batches is not None else self.items >= self.held
        if end:
            self.duplicates += sum(c - 1 for c in self.counts.values())
            self.left_out.append(self.held - len(self.counts))
            self._reset()
        return end

    def run_ended(self) -> None:
        if self.batches is not None and 0 < self.drawn < self.batches:
            self.complete = False

    def _reset(self) -> None:
        self.drawn, self.items, self.counts = 0, 0, {}


def as_received(batch: Any, key: torch.Tensor) -> Any:
    """``batch`` with its first tensor of ``key``'s shape replaced by ``key``, the tensor the model
    received (on the batch's device and dtype): a dataset read twice gave other numbers the second time.

    >>> x, y = torch.zeros(2, 3), torch.tensor([0, 1])
    >>> as_received((x, y), torch.ones(2, 3))[0].sum().item(), as_received((x, y), torch.ones(2, 3))[1] is y
    (6.0, True)
    """
    done = False

    def swap(b: Any) -> Any:
        nonlocal done
        if isinstance(b, torch.Tensor):
            if not done and b.shape == key.shape:
                done = True
                return key.detach().to(b.device, b.dtype)
            return b
        if isinstance(b, Mapping):  # a dict, or transformers' BatchEncoding
            d = {k: swap(v) for k, v in b.items()}
            try:
                return type(b)(d)
            except TypeError:
                return d
        if isinstance(b, (list, tuple)):
            out = [swap(v) for v in b]
            if hasattr(b, "_fields"):  # a named tuple
                return type(b)(*out)
            return out if isinstance(b, list) else tuple(out)
        return b

    return swap(batch)


__all__ = ["Passes", "Tracked", "TrackedIterable", "WORKERS", "as_received", "tensors"]
