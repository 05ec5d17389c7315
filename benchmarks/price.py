"""Section 3, the price of accumulation: step time of one effective batch as k micro-batches against one large
batch, k = 1..16.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _render import md_table
from _timing import devices, interleaved
from memory import cases

import accumlib

NAME = "price"
TITLE = "3. The price of accumulation: step time for k micro-batches / one large batch"
GOALS = {}


def _split(task: Any, dataset: Any, k: int) -> list:
    """The effective batch (the whole ``dataset``) as k micro-batches of sizes differing by at most one."""
    n = len(dataset)
    bounds = [round(i * n / k) for i in range(k + 1)]
    collate = task.collate_fn or torch.utils.data.default_collate
    return [collate([dataset[i] for i in range(a, b)]) for a, b in zip(bounds, bounds[1:])]


KS, QUICK_KS = tuple(range(1, 17)), (1, 2, 4)
REPEATS, QUICK_REPEATS = 6, 2  # interleaved samples per k


def _prepare(task: Any, dataset: Any, model0: Any, device: str, k: int, inner: int) -> Callable:
    """One timed sample's maker: ``inner`` effective batches as k micro-batches through accumlib.ragged."""
    micro = [accumlib.batches.to_device(b, device) for b in _split(task, dataset, k)] * inner

    def make() -> Callable[[], Any]:
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        return lambda: accumlib.ragged(
            model, opt, micro, task.item_losses, accum_steps=k, count_items=task.count_items
        )

    return make


def run(quick: bool = False) -> dict:
    """Seconds per optimizer step on one effective batch, as k micro-batches (accumlib.ragged)."""
    ks = QUICK_KS if quick else KS
    repeats = QUICK_REPEATS if quick else REPEATS
    inner = 1 if quick else 3  # effective batches per timed sample: a sample of a few ms is all noise
    models = {name: (task, ds) for name, (task, ds, _) in cases(quick).items()}
    rows = []
    for device in devices():
        for model_name, (task_name, dataset) in models.items():
            task = accumlib.get_task(task_name)
            model0 = task.make_model(0).to(device)

            t = interleaved({k: _prepare(task, dataset, model0, device, k, inner) for k in ks}, repeats)
            base = statistics.median(t[ks[0]]) / inner
            for k in ks:
                step = statistics.median(t[k]) / inner
                rows.append(
                    {
                        "device": device,
                        "model": model_name,
                        "task": task_name,
                        "effective_batch": len(dataset),
                        "k": k,
                        "step_s": step,
                        "ratio_to_k1": step / base if ks[0] == 1 else float("nan"),
                    }
                )
    return {
        "rows": rows,
        "goals": {},
        "note": f"median of {repeats} interleaved samples of {inner} optimizer steps; k=1 is the large "
        "batch; accumlib.ragged, SGD",
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection)."""
    rows = res["rows"]
    lines: list[str] = []
    keys = list(dict.fromkeys((r["device"], r["model"]) for r in rows))
    ks = list(dict.fromkeys(r["k"] for r in rows))
    # the markdown shows powers of two; JSON has every k
    shown = [k for k in ks[1:] if not short or k & (k - 1) == 0]
    get = {(r["device"], r["model"], r["k"]): r for r in rows}
    lines += md_table(
        ["device", "model (effective batch)", f"k={ks[0]} step"] + [f"k={k}" for k in shown],
        [
            [
                d,
                f"{m} ({get[(d, m, ks[0])]['effective_batch']})",
                f"{get[(d, m, ks[0])]['step_s'] * 1e3:.1f} ms",
            ]
            + [f"{get[(d, m, k)]['ratio_to_k1']:.2f}x" for k in shown]
            for d, m in keys
        ],
    )
    return lines
