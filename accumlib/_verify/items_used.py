"""The compute stage at the run's end: the items no optimizer step used, counted with ``item_losses`` at
the last parameters (a count is what ``item_losses`` says an item is: a sample, or a token).

What a run had to step: every dataset item, except those a complete pass of the loop's own loader left
out by its design (``drop_last``, a subset sampler), which the diagnose stage notes instead. Without
indices (an IterableDataset) what was drawn in a pass the loop trained on and never stepped. In a job,
the items of no rank's stepped window (``job.judge_job``), over every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from ..batches import checked_losses, to_device
from .job import Job
from .record import Recorder
from .sources import Tracked
from .step_numbers import Coverage, MicroBatch
from .window_oracle import exact


def leftovers(rec: Recorder) -> list[MicroBatch]:
    """Micro-batches the loop forwarded after its last step: it saw them, no step used them."""
    return [rec.mbs[b] for b in rec.window if b in rec.mbs]


def count_and_loss(rec: Recorder, batch: Any) -> tuple[int, float]:
    """Items and loss sum of a batch at the current parameters (for what never reached a step).
    The sum may be inf/nan after a diverged step: counted anyway, never a crash."""
    if not rec.counting:
        rec.oracle.leaves = rec.sync()
    with exact(), torch.no_grad():
        losses = rec.item_losses(rec.shadow, to_device(batch, rec.params[0].device))
    if not isinstance(losses, torch.Tensor) or losses.dim() != 1:
        checked_losses(lambda m, b: losses, rec.shadow, batch)  # raises the contract's own error
    return losses.numel(), float(losses.double().sum())


def leftover(rec: Recorder) -> tuple[int, float]:
    """Items and loss sum forwarded after the last step: the loop saw them, no step used them."""
    out = (0, 0.0)
    for mb in leftovers(rec):
        n, loss = count_and_loss(rec, mb.batch)
        out = (out[0] + n, out[1] + loss)
    return out


def _count(rec: Recorder, indices: list[int], batch_size: int) -> int:
    """Items in these dataset indices, collated batch_size at a time as the loop's loader would."""
    data: Any = rec.dataset.dataset  # a Tracked's: the user's dataset
    return sum(
        count_and_loss(rec, rec.collate([data[i] for i in indices[s : s + batch_size]]))[0]
        for s in range(0, len(indices), batch_size)
    )


def coverage(rec: Recorder, batch_size: int, stepped: int) -> Coverage:
    """One process's run: what it had to step and did not (``stepped``: items its steps used)."""
    seen_items, seen_loss = leftover(rec)
    passes = rec.data_passes
    if not isinstance(rec.dataset, Tracked):  # no indices: drawn in a pass the loop trained on, never used
        missing = seen_items + sum(
            count_and_loss(rec, rec.mbs[b].batch)[0]
            for b in rec.fresh
            if rec.mbs[b].pass_id in rec.passes_used
        )
        return Coverage(missing, stepped + missing, seen_items, seen_loss, duplicates=passes.duplicates)
    if not passes.left_out and not passes.abandoned and passes.stream:
        # the loop drew from a stream (random draws with replacement, no length, more draws than the
        # data holds) and never ended it: an iteration-based loop (nanoGPT's), whose run is a number of
        # steps, not passes. It has no tail: the items it never drew (or drew ahead and never forwarded)
        # are not dropped ones. What it forwarded after its last step is. A loop that stops early in a
        # pass over the data (an epoch rounded down to whole windows) drops the rest: counted below.
        undrawn = passes.held - len(passes.seen)
        return Coverage(
            seen_items,
            stepped + seen_items,
            seen_items,
            seen_loss,
            held=passes.held,
            mid_pass=max(undrawn, 0),
        )
    # what the loop forwarded after its last step is dropped even where an earlier pass stepped the same
    # items (a window carried across epochs and never stepped in the last one): counted as forwarded
    forwarded = {i for mb in leftovers(rec) for i in mb.indices or ()}
    # the rest: never in a stepped window, in any pass
    left = [i for i in range(len(rec.dataset)) if i not in rec.used_indices and i not in forwarded]
    # every pass ran to its end: what it did not draw, its loader left out by design
    left_out = tuple(passes.left_out) if passes.complete and any(passes.left_out) else ()
    if left_out:
        left = [i for i in left if i in passes.seen]  # the rest was drawn: the loop's to step
    missing = _count(rec, left, batch_size) + seen_items
    return Coverage(
        missing,
        stepped + missing,
        seen_items,
        seen_loss,
        left_out=left_out,
        held=passes.held,
        left_out_by=passes.left_out_by,
        duplicates=passes.duplicates,
    )


def job_coverage(rec: Recorder, job: Job, batch_size: int, stepped: int) -> Coverage:
    """A multi-rank job's: the items of no rank's stepped window, over every rank."""
    held = isinstance(rec.dataset, Tracked)
    missing = _count(rec, job.missing, batch_size)
    missing += 0 if held else job.leftover_items  # indexed leftovers are among job.missing already
    total = stepped + missing if held else None
    return Coverage(missing, total, job.leftover_items, job.leftover_loss)


__all__ = ["coverage", "job_coverage", "leftover"]
