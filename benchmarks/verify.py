"""Section 4, verify's cost: ``accumlib.verify`` on correct and buggy loops against the loop alone,
interleaved."""

from __future__ import annotations

import copy
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _render import md_table
from _timing import interleaved, pair_ratios, ratio_quartiles

import accumlib
from accumlib import data as _data

NAME = "verify"
TITLE = "4. Verify's cost"
GOALS = {"verify": "verify / loop alone <= 3.0 (median), every loop"}
VERIFY_MAX = 3.0
LIMIT = VERIFY_MAX


REPEATS, QUICK_REPEATS = 10, 2  # interleaved pairs of verify and the loop alone, per gallery loop


def _makers(
    verify: Callable, entry: Any, task: Any, dataset: Any, model0: Any, reports: list, k: int
) -> tuple:
    """The two runs of one gallery loop, as makers for ``interleaved``: the loop alone, and under verify."""

    def alone() -> Callable[[], Any]:
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)  # verify's default optimizer
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=task.batch_size, shuffle=False, collate_fn=task.collate_fn
        )
        return lambda: entry.fn(model, opt, loader)

    def verified() -> Callable[[], Any]:
        return lambda: reports.append(
            verify(
                entry.fn,
                model=model0,
                dataset=dataset,
                item_losses=task.item_losses,
                accum_steps=k,
                batch_size=task.batch_size,
                collate_fn=task.collate_fn,
            )
        )

    return alone, verified


def run(quick: bool = False) -> dict:
    """accumlib.verify on correct gallery loops against the same loop on the same data, alone."""
    try:
        from accumlib import verify
        from accumlib_course.gallery import GALLERY, K
    except ImportError as err:
        return {"not_available": f"accumlib.verify / accumlib_course.gallery cannot be imported ({err})"}
    names = (
        ["correct-inner-for"]
        if quick
        else [n for n in GALLERY if n.startswith("correct-") and not GALLERY[n].dropout]
    )
    repeats = QUICK_REPEATS if quick else REPEATS
    rows = []
    for name in names:
        entry = GALLERY[name]
        task = accumlib.get_task(entry.task)
        dataset = (
            task.make_dataset()
            if entry.n_items is None
            else _data.digits(entry.n_items, image="cnn" in entry.task)
        )
        model0 = task.make_model(0)
        reports = []

        alone, verified = _makers(verify, entry, task, dataset, model0, reports, K)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = interleaved({"verify": verified, "alone": alone}, repeats)
        ratio = pair_ratios(t["verify"], t["alone"])
        rows.append(
            {
                "loop": name,
                "task": entry.task,
                "items": len(dataset),
                "verify_s": statistics.median(t["verify"]),
                "alone_s": statistics.median(t["alone"]),
                "ratio": ratio,
                "ratio_quartiles": ratio_quartiles(t["verify"], t["alone"]),
                "verdict_ok": bool(reports[-1].ok),
                "steps": len(getattr(reports[-1], "steps", [])),
                "repeats": repeats,
                "met": ratio <= VERIFY_MAX,
            }
        )
    worst = max(rows, key=lambda r: r["ratio"])
    goal = {
        "measured": f"worst {worst['loop']}: {worst['ratio']:.2f}x",
        "met": all(r["met"] for r in rows),
        "missed": [f"{r['loop']}: {r['ratio']:.2f}x" for r in rows if not r["met"]],
    }
    return {
        "rows": rows,
        "goals": {"verify": goal},
        "note": "median over interleaved pairs of (verify(train_fn, ...) / train_fn(model, SGD, "
        "DataLoader)); verify's time includes its model copies and a float32 large-batch reference at "
        "every step",
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection)."""
    rows = res["rows"]
    lines: list[str] = []
    lines += md_table(
        ["loop", "task", "loop alone", "verify", "ratio [quartiles]", "verdict", "goal <= 3x"],
        [
            [
                r["loop"],
                r["task"],
                f"{r['alone_s'] * 1e3:.1f} ms",
                f"{r['verify_s'] * 1e3:.1f} ms",
                f"{r['ratio']:.2f}x [{r['ratio_quartiles'][0]:.2f}, {r['ratio_quartiles'][1]:.2f}]",
                "ok" if r["verdict_ok"] else "NOT ok",
                "met" if r["met"] else "MISSED",
            ]
            for r in rows
        ],
    )
    return lines
