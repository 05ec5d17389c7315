"""Following the data: which dataset items each micro-batch holds, seen in the main process.

``Tracked`` wraps a map-style dataset and ``TrackedIterable`` an iterable one; both report what
the loop draws, wherever it draws it (verify's loader, a loader the loop builds itself over
``loader.dataset``, a framework's re-created loader). A DataLoader worker process cannot report
back, so it is refused with ``WORKERS``. Used by the record stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

WORKERS = (
    "accumlib.verify records each micro-batch in the main process, as it arrives; the loop iterates its data "
    "in a DataLoader worker process (num_workers > 0), which cannot report back. Use num_workers=0 under verify: "
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


__all__ = ["Tracked", "TrackedIterable", "WORKERS", "tensors"]
