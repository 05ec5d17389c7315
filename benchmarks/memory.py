"""Section 1, memory: activation bytes held for backward by the largest micro-batch of k, over the full
batch's,
for the MLP, the CNN and the tiny LM (and CUDA's peak where a GPU is present; untested here).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch
from _render import fmt_bytes, md_table

import accumlib
import accumlib_course.memory
from accumlib import data as _data

NAME = "memory"
TITLE = "1. Memory: activations per micro-batch / full batch"
GOALS = {"memory": "activations per micro-batch <= 1/k + 0.05 of the full batch's, every model and k"}
MEMORY_SLACK = 0.05  # the "+ 5% of the full batch"
LIMIT = MEMORY_SLACK


def cases(quick: bool) -> dict[str, tuple[str, Any, int]]:
    """model -> (task, dataset, effective batch): the full batch is the first ``effective`` items."""
    if quick:
        return {
            "MLP": ("mlp-digits", _data.digits(32), 32),
            "CNN": ("cnn-groupnorm", _data.digits(32, image=True), 32),
            "tiny LM": ("lm-tokens", _data.TokenSequences(16), 16),
        }
    return {
        "MLP": ("mlp-digits", _data.digits(256), 256),
        "CNN": ("cnn-groupnorm", _data.digits(256, image=True), 256),
        "tiny LM": ("lm-tokens", _data.TokenSequences(64), 64),
    }


KS = (1, 2, 4, 8, 16)  # accumulation steps measured, quick or not: sizes decide this goal, not speed


def run(quick: bool = False) -> dict:
    """Activation bytes held for backward by the largest micro-batch, over the full batch's."""
    ks = KS
    rows = []
    cuda = torch.cuda.is_available()
    for model_name, (task_name, dataset, effective) in cases(quick).items():
        task = accumlib.get_task(task_name)
        model = task.make_model(0)
        full = next(iter(task.loader(batch_size=effective, dataset=dataset)))
        full_bytes = accumlib_course.memory.activation_bytes(model, full, task.item_losses)
        full_peak = _cuda_peak(model, full, task) if cuda else None
        for k in ks:
            micro = list(
                task.loader(
                    batch_size=effective // k, dataset=torch.utils.data.Subset(dataset, range(effective))
                )
            )
            per_micro = [accumlib_course.memory.activation_bytes(model, b, task.item_losses) for b in micro]
            ratio = max(per_micro) / full_bytes  # the peak is set by the largest micro-batch
            row = {
                "model": model_name,
                "task": task_name,
                "effective_batch": effective,
                "k": k,
                "micro_batch": effective // k,
                "full_bytes": full_bytes,
                "micro_bytes_max": max(per_micro),
                "ratio": ratio,
                "ratio_mean": statistics.mean(per_micro) / full_bytes,
                "goal": 1 / k + MEMORY_SLACK,
                "met": ratio <= 1 / k + MEMORY_SLACK,
            }
            if cuda:
                peaks = [_cuda_peak(model, b, task) for b in micro]
                row |= {
                    "cuda_full_peak_bytes": full_peak,
                    "cuda_micro_peak_bytes": max(peaks),
                    "cuda_ratio": max(peaks) / full_peak,
                }
            rows.append(row)
    worst = max(rows, key=lambda r: r["ratio"] - r["goal"])
    goal = {
        "measured": f"worst {worst['model']} k={worst['k']}: {worst['ratio']:.3f} (goal {worst['goal']:.3f})",
        "met": all(r["met"] for r in rows),
        "missed": [
            f"{r['model']} k={r['k']}: {r['ratio']:.3f} > {r['goal']:.3f}" for r in rows if not r["met"]
        ],
    }
    note = (
        "activation bytes: tensors autograd saves for backward (accumlib_course.memory.activation_bytes), "
        "parameters excluded; ratio = largest micro-batch / full batch"
    )
    if cuda:
        note += (
            "; CUDA: torch.cuda.max_memory_allocated over one forward+backward above the resident model and "
            "its .grad (reported, not held to the goal: it includes backward temporaries)"
        )
    else:
        note += "; no CUDA device here, so torch.cuda.max_memory_allocated is not measured"
    return {"rows": rows, "goals": {"memory": goal}, "note": note}


def _cuda_peak(model: torch.nn.Module, batch: Any, task: Any) -> int:
    """Peak CUDA bytes of one forward+backward, above the model and its already allocated .grad."""
    m = copy.deepcopy(model).cuda()
    b = accumlib.batches.to_device(batch, "cuda")
    task.item_losses(m, b).sum().backward()  # allocates .grad once, outside the measurement
    m.zero_grad(set_to_none=False)
    return accumlib_course.memory.cuda_peak_bytes(lambda: task.item_losses(m, b).sum().backward())


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection)."""
    rows = res["rows"]
    lines: list[str] = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    ks = list(dict.fromkeys(r["k"] for r in rows))
    get = {(r["model"], r["k"]): r for r in rows}
    head = ["model (effective batch, full-batch activations)"] + [f"k={k}" for k in ks]
    body = [
        [f"{m} ({get[(m, ks[0])]['effective_batch']}, {fmt_bytes(get[(m, ks[0])]['full_bytes'])})"]
        + [f"{get[(m, k)]['ratio']:.3f}{'' if get[(m, k)]['met'] else ' MISSED'}" for k in ks]
        for m in models
    ]
    lines += md_table(head, body + [["goal 1/k + 0.05"] + [f"{1 / k + MEMORY_SLACK:.3f}" for k in ks]])
    if "cuda_ratio" in rows[0]:
        lines += ["", "CUDA max_memory_allocated, largest micro-batch / full batch:", ""]
        lines += md_table(
            ["model"] + [f"k={k}" for k in ks],
            [[m] + [f"{get[(m, k)]['cuda_ratio']:.3f}" for k in ks] for m in models],
        )
    return lines
