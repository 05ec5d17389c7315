"""Section 2, overhead: every reference loop against a hand-written twin doing the same work,
interleaved, median time ratio. The twins are the baseline, the loop a careful user writes inline, so
they stay inline here; a registered loop without a twin in ``HAND`` is reported as not measured.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _render import md_table
from _timing import devices, interleaved, pair_ratios, ratio_quartiles

import accumlib
from accumlib import data as _data
from accumlib.loops import CONTRACTS, LOOPS

NAME = "overhead"
TITLE = "2. Overhead of the reference loops"
GOALS = {"overhead": "accumlib loop / hand-written loop <= 1.03 (median), every loop"}
OVERHEAD_MAX = 1.03
LIMIT = OVERHEAD_MAX


# The hand-written twins below are the baseline: the loop a careful user writes inline, doing the
# same work as the accumlib loop (same division, same logged loss, zero_grad(set_to_none=True)),
# without the validation, windowing generator and progress plumbing accumlib adds.


def hand_naive(model, optimizer, batches, item_losses, *, accum_steps):
    logged = []
    for s in range(0, len(batches), accum_steps):
        total, n = 0.0, 0
        for batch in batches[s : s + accum_steps]:
            losses = item_losses(model, batch)
            losses.mean().backward()
            total, n = total + losses.detach().sum(), n + losses.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(float(total / n))
    return logged


def hand_normalized(model, optimizer, batches, item_losses, *, accum_steps):
    logged = []
    for s in range(0, len(batches), accum_steps):
        total, n = 0.0, 0
        for batch in batches[s : s + accum_steps]:
            losses = item_losses(model, batch)
            (losses.mean() / accum_steps).backward()
            total, n = total + losses.detach().sum(), n + losses.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(float(total / n))
    return logged


def hand_ragged(model, optimizer, batches, item_losses, *, accum_steps, count_items):
    logged = []
    for s in range(0, len(batches), accum_steps):
        window = batches[s : s + accum_steps]
        n = sum(count_items(b) for b in window)
        total = 0.0
        for batch in window:
            losses = item_losses(model, batch)
            (losses.sum() / n).backward()
            total = total + losses.detach().sum()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(float(total / n))
    return logged


def hand_amp(model, optimizer, batches, item_losses, *, accum_steps, count_items):
    dev = next(model.parameters()).device
    dtype = torch.float16 if dev.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(dev.type)
    logged = []
    for s in range(0, len(batches), accum_steps):
        window = batches[s : s + accum_steps]
        n = sum(count_items(b) for b in window)
        total = 0.0
        for batch in window:
            with torch.autocast(dev.type, dtype=dtype):
                losses = item_losses(model, batch)
            scaler.scale(losses.float().sum() / n).backward()
            total = total + losses.detach().float().sum()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        logged.append(float(total / n))
    return logged


def hand_large_batch(model, optimizer, batches, item_losses, *, accum_steps, merge):
    logged = []
    for s in range(0, len(batches), accum_steps):
        losses = item_losses(model, merge(batches[s : s + accum_steps]))
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged.append(losses.detach().mean().item())
    return logged


HAND = {
    "naive": hand_naive,
    "normalized": hand_normalized,
    "ragged": hand_ragged,
    "amp": hand_amp,
    "large_batch": hand_large_batch,
}


# Interleaved pairs per (loop, task, device): enough for a stable median on a quiet machine.
REPEATS, QUICK_REPEATS = 12, 2
NO_TWIN = "no hand-written twin in benchmarks/overhead.py (HAND)"


def run(quick: bool = False) -> dict:
    """Each accumlib loop against its hand-written twin on the same pre-collated batches, A B A B ...

    A registered loop without a twin in ``HAND`` is listed under ``not_measured``, never timed against
    nothing and never skipped silently; the goal ("every loop") is then not claimed as met."""
    repeats = QUICK_REPEATS if quick else REPEATS
    cases = {  # task -> dataset: enough micro-batches that one epoch takes tens of milliseconds
        "mlp-digits": _data.digits(32 if quick else 1024),
        "lm-tokens": _data.TokenSequences(8 if quick else 96),
    }
    untwinned = [name for name in LOOPS if name not in HAND]
    rows = []
    for device in devices():
        for task_name, dataset in cases.items():
            task = accumlib.get_task(task_name)
            batches = [accumlib.batches.to_device(b, device) for b in task.loader(dataset=dataset)]
            model0 = task.make_model(0).to(device)
            for loop_name, loop in LOOPS.items():
                if loop_name in HAND:
                    rows.append(_pair(loop_name, loop, task, batches, model0, device, repeats))
    return {
        "rows": rows,
        "not_measured": [{"loop": name, "why": NO_TWIN} for name in untwinned],
        "goals": {"overhead": _goal(rows, untwinned)},
        "note": "ratio: median over interleaved pairs of (accumlib epoch time / hand-written epoch time) "
        "[first, third quartile]; times in parentheses: medians of each, per epoch; same batches, same "
        "model copy; accumlib adds a 1-D contract check per micro-batch and one finiteness check per window",
    }


def _pair(
    name: str, loop: Callable, task: Any, batches: list, model0: Any, device: str, repeats: int
) -> dict:
    """One loop against its twin on one task and device: the row of the table."""
    kw = CONTRACTS[name].kwargs_for(task)  # the task fields the loop's contract takes
    logged: dict[str, list[float]] = {}

    def prepare(fn: Callable, who: str) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            model = copy.deepcopy(model0)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            return lambda: logged.__setitem__(
                who, fn(model, opt, batches, task.item_losses, accum_steps=task.accum_steps, **kw)
            )

        return make

    t = interleaved({"accumlib": prepare(loop, "accumlib"), "hand": prepare(HAND[name], "hand")}, repeats)
    ratio = pair_ratios(t["accumlib"], t["hand"])
    same = len(logged["accumlib"]) == len(logged["hand"]) and all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(logged["accumlib"], logged["hand"])
    )  # same logged losses: the twin really does the accumlib loop's work
    return {
        "device": device,
        "task": task.name,
        "loop": name,
        "micro_batches": len(batches),
        "accum_steps": task.accum_steps,
        "accumlib_s": statistics.median(t["accumlib"]),
        "hand_s": statistics.median(t["hand"]),
        "ratio": ratio,
        "ratio_quartiles": ratio_quartiles(t["accumlib"], t["hand"]),
        "same_logged_losses": same,
        "repeats": repeats,
        "met": ratio <= OVERHEAD_MAX,
    }


def _goal(rows: list[dict], untwinned: list[str]) -> dict:
    """Met only when every loop was measured and met it; a missed ratio is MISSED whatever is unmeasured."""
    missed = [f"{r['loop']} {r['task']} {r['device']}: {r['ratio']:.3f}" for r in rows if not r["met"]]
    measured = []
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        measured.append(f"worst {worst['loop']} on {worst['task']} ({worst['device']}): {worst['ratio']:.3f}")
    if untwinned:
        measured.append(f"not measured: {', '.join(untwinned)} ({NO_TWIN})")
    goal: dict[str, Any] = {
        "measured": "; ".join(measured),
        "met": False if missed else (None if untwinned else True),
        "missed": missed,
    }
    if untwinned:
        goal["note"] = f"the goal covers every loop: {', '.join(untwinned)} not measured"
    return goal


def _cell(r: dict) -> str:
    return (
        f"{r['ratio']:.3f} [{r['ratio_quartiles'][0]:.2f}, {r['ratio_quartiles'][1]:.2f}] "
        f"({r['accumlib_s'] * 1e3:.0f} / {r['hand_s'] * 1e3:.0f} ms)"
        + ("" if r["met"] else " MISSED")
        + ("" if r["same_logged_losses"] else " LOSSES DIFFER")
    )


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection); the loops not measured
    are named below the table."""
    rows = res["rows"]
    lines: list[str] = []
    cols = list(dict.fromkeys((r["task"], r["device"]) for r in rows))
    get = {(r["loop"], r["task"], r["device"]): r for r in rows}
    if rows:
        lines += md_table(
            ["loop"] + [f"{t}, {d}: accumlib / hand-written" for t, d in cols],
            [
                [loop] + [_cell(get[(loop, t, d)]) for t, d in cols]
                for loop in dict.fromkeys(r["loop"] for r in rows)
            ],
        )
        same = all(r["same_logged_losses"] for r in rows)
        lines += [
            "",
            "same logged losses as the hand-written twin: "
            + ("every loop" if same else "NO for some (see LOSSES DIFFER)"),
        ]
    for r in res.get("not_measured", []):
        lines += ["", f"not measured: {r['loop']} ({r['why']})"]
    return lines
