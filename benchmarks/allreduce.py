"""Section 7, distributed: all-reduce calls and bytes per optimizer step under DDP, with and without no_sync,
counted by accumlib.distributed's communication hook (gloo on loopback).
"""

from __future__ import annotations

from _render import md_table

import accumlib

NAME = "allreduce"
TITLE = "7. Distributed: all-reduce per optimizer step, world size 2"
GOALS = {}


WORLD_SIZE = 2  # two loopback ranks: what a 2-core machine runs side by side


def run(quick: bool = False) -> dict:
    """All-reduce calls and bytes per optimizer step, counted by accumlib.distributed's DDP comm hook."""
    world_size = WORLD_SIZE
    try:
        import torch.distributed as dist

        from accumlib.distributed import shard_loader
        from accumlib_course.distributed import COMM_VARIANTS, RunSpec, run_specs
    except ImportError as err:
        return {"not_available": f"accumlib.distributed cannot be imported ({err})"}
    if not dist.is_available():
        return {"not_available": "torch.distributed is not available in this build of torch"}
    plan = {"mlp-digits": (4,)} if quick else {"lm-tokens": (1, 2, 4, 8), "mlp-digits": (1, 2, 4)}
    specs = []
    for task_name, ks in plan.items():
        per_rank = len(shard_loader(accumlib.get_task(task_name), 0, world_size))
        specs += [RunSpec(v, task_name, k, oracle=False) for k in ks if k <= per_rank for v in COMM_VARIANTS]
    try:
        results = run_specs(specs, world_size=world_size, timeout=300.0)
    except Exception as err:
        return {"not_available": f"spawning {world_size} loopback ranks failed: {type(err).__name__}: {err}"}
    by = {(r.spec.task, r.spec.accum_steps, r.spec.variant): r for r in results}
    rows = []
    for (task_name, k, variant), r in by.items():
        ref = by[(task_name, k, "no_sync")]
        rows.append(
            {
                "task": task_name,
                "k": k,
                "variant": variant,
                "world_size": world_size,
                "calls_per_step": r.calls_per_step,
                "bytes_per_step": r.bytes_per_step,
                "window_batches": r.window_batches[0],
                "bytes_vs_no_sync": r.bytes_per_step / ref.bytes_per_step,
            }
        )
    return {
        "rows": rows,
        "goals": {},
        "note": "first optimizer step (a full window), per rank, from the DDP communication hook; gloo on "
        "loopback",
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection)."""
    rows = res["rows"]
    lines: list[str] = []
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    get = {(r["task"], r["k"], r["variant"]): r for r in rows}
    keys = list(dict.fromkeys((r["task"], r["k"]) for r in rows))
    lines += md_table(
        ["task", "k"] + [f"{v}: calls, bytes" for v in variants],
        [
            [t, k]
            + [
                f"{get[(t, k, v)]['calls_per_step']}, {get[(t, k, v)]['bytes_per_step']:,}"
                + ("" if v == "no_sync" else f" ({get[(t, k, v)]['bytes_vs_no_sync']:.0f}x)")
                for v in variants
            ]
            for t, k in keys
        ],
    )
    return lines
