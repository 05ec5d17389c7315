"""The judge stage of a multi-rank job for what no single step shows: how the ranks shared the data
and the steps. A pure function of what every rank handed in at the run's end (``Ranks.finish``),
so every rank reaches the same findings.

- ``unsharded-data``: every rank drew the same dataset items (no DistributedSampler);
- ``duplicate-items``: within one pass, items drawn more than once over all ranks together (a
  DistributedSampler pads the ranks to equal length by repeating items);
- ``tail-dropped``: dataset items in no rank's stepped window, counted over the job;
- ``uneven-steps``: the ranks stepped a different number of times;
- ``sync-every-micro-batch``: every boundary of a window saw the same ``.grad`` on every rank,
  i.e. DDP synchronized each backward (a cost: the gradient is right).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .report import Finding
from .step_numbers import StepNumbers


@dataclass
class Job:
    """What the job-level judgement found, for the report stage."""

    findings: list[Finding] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # dataset indices in no rank's stepped window
    leftover_items: int = 0  # forwarded after a rank's last step, on every rank together
    leftover_loss: float = 0.0
    unsharded: bool = False


def judge_job(every: list[dict[str, Any]], steps: list[StepNumbers], held: int | None) -> Job:
    """``every``: per rank, ``steps`` (its step count), ``used`` (dataset indices of its stepped
    windows), ``drawn`` ((pass, indices) per micro-batch drawn) and ``leftover`` ((items, loss sum)
    forwarded after its last step); ``steps``: the job's step numbers; ``held``: the dataset's length
    (None for an IterableDataset: no indices)."""
    job = Job()
    counts = [e["steps"] for e in every]
    if len(set(counts)) > 1:
        job.findings.append(Finding.of("uneven-steps", form="per-rank", counts=counts))
    job.leftover_items = sum(e["leftover"][0] for e in every)
    job.leftover_loss = sum(e["leftover"][1] for e in every)
    drawn = [sorted(i for _, idx in e["drawn"] for i in idx) for e in every]
    job.unsharded = len(every) > 1 and bool(drawn[0]) and all(d == drawn[0] for d in drawn)
    if job.unsharded:
        job.findings.append(Finding.of("unsharded-data", form="draws", draws=len(drawn[0]), ranks=len(every)))
    else:
        per_pass: dict[int, Counter[int]] = {}
        for e in every:
            for p, idx in e["drawn"]:
                per_pass.setdefault(p, Counter()).update(idx)
        repeated = sum(c - 1 for counter in per_pass.values() for c in counter.values())
        if repeated:
            job.findings.append(Finding.of("duplicate-items", form="job", n=repeated))
        synced = [
            t for t, s in enumerate(steps) if s.micro_batches > 1 and s.syncs > 1 and s.syncs == len(s.fits)
        ]
        if synced:
            first = steps[synced[0]]
            job.findings.append(
                Finding.of(
                    "sync-every-micro-batch",
                    form="count",
                    steps=synced,
                    syncs=first.syncs,
                    m=first.micro_batches,
                )
            )
    if held is not None:
        used = set().union(*(set(e["used"]) for e in every))
        job.missing = [i for i in range(held) if i not in used]
    return job


__all__ = ["Job", "judge_job"]
