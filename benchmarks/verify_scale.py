"""Verify at real scale: the peak memory and the time ``accumlib.verify`` adds on a 39.4M-parameter MLP.

The case of the issue: an MLP of 39.4M float32 parameters (150 MiB), k = 8, 4 optimizer steps,
one CPU thread, two loops written below, one correct and one that never divides its loss.
Each measurement is a fresh process, so the peak resident memory of its runs (the kernel's
high-water mark, reset at the start of each run) is their own:

    loop alone   train_fn(model, SGD, DataLoader) on a copy of the model made before the run
    verify       accumlib.verify(train_fn, model=..., ...), which makes its own copies inside the run

Both peaks are taken above the same kind of baseline (model and data built, one warm-up run on a
tiny MLP done so one-time imports are outside), and verify's extra peak is verify's minus the
loop's. Goals of the issue, stated as met or MISSED:

    memory   verify's extra peak <= 4 x the parameter bytes + one micro-batch's activations
    time     verify / loop alone <= 3 (medians of each), for the correct and the buggy loop alike

A guard (RLIMIT_AS of each run, default 12 GiB or 3/4 of the free memory) makes a run that
needs too much fail instead of taking the machine down; such a run reads "over the guard".

    python benchmarks/verify_scale.py                          # the issue's case (about 3 minutes on 2 cores)
    python benchmarks/verify_scale.py --cases correct --steps 1
    python benchmarks/verify_scale.py --quick                  # a tiny MLP: keeps the script working
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when run as --child
from _peak import Peak, default_guard  # noqa: E402
from _render import md_table  # noqa: E402

K = 8  # the accumulation
THREADS = 1  # the issue measured on one CPU thread
MEMORY_MAX_PARAMS = 4.0  # verify's extra peak, in parameter bytes (plus one micro-batch's activations)
TIME_MAX = 3.0

NAME = "verify_scale"
TITLE = "8. Verify at scale: 39.4M-parameter MLP, k = 8"
LIMIT = TIME_MAX
GOALS = {
    "verify_scale_memory": "verify's extra peak memory over the loop alone <= 4x parameter bytes + one micro-batch's activations "
    "(39.4M-parameter MLP, k = 8, correct and never-divided loops)",
    "verify_scale_time": "verify / loop alone <= 3.0 at 39.4M parameters (median), correct and never-divided loops",
}


@dataclass(frozen=True)
class Scale:
    """The MLP ``in_features -> widths... -> classes`` and the run: micro-batch size and optimizer steps."""

    in_features: int
    widths: tuple[int, ...]
    classes: int
    batch_size: int
    steps: int

    @property
    def n_items(self) -> int:
        # a whole number of full windows: every loop below steps on each
        return self.steps * K * self.batch_size


FULL = Scale(1024, (4096, 4096, 4096), 400, 16, 4)  # 39,399,824 parameters: the 39.4M (150.3 MiB)
QUICK = Scale(32, (64, 64), 10, 4, 2)


def build(scale: Scale, seed: int = 0) -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    """The MLP and a synthetic classification set, both from ``seed`` (no download)."""
    torch.manual_seed(seed)
    sizes = (scale.in_features, *scale.widths)
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], scale.classes))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(scale.n_items, scale.in_features, generator=g)
    y = torch.randint(scale.classes, (scale.n_items,), generator=g)
    return model, torch.utils.data.TensorDataset(x, y)


def item_losses(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


# --- the two loops of the issue, as a user writes them ----------------------------------------------


def correct(model, optimizer, loader):
    """grad of (1/N) sum_i l_i  ==  sum over the window's micro-batches of grad(sum_{i in mb} l_i / N)."""
    n = K * loader.batch_size  # N: the dataset is a whole number of full windows
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def never_divided(model, optimizer, loader):
    """Each micro-batch's mean loss goes to backward as it is, so every step sees about K x the true gradient."""
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


# loop -> (train_fn, the finding codes verify must report: none for a correct loop)
LOOPS = {"correct": (correct, frozenset()), "never-divided": (never_divided, frozenset({"unscaled-sum"}))}


# --- one run, in a fresh process -----------------------------------------------------------------------


def prepare(mode: str, fn: Any, model: torch.nn.Module, dataset: Any, batch_size: int) -> Any:
    """The run to measure, as a zero-argument call; what the loop alone needs is built here, outside it."""
    import accumlib

    if mode == "verify":
        return lambda: accumlib.verify(
            fn, model=model, dataset=dataset, item_losses=item_losses, accum_steps=K, batch_size=batch_size
        )
    net = copy.deepcopy(model)  # made before the run: verify's own copies are part of what verify adds
    opt = torch.optim.SGD(net.parameters(), lr=0.05)  # verify's default optimizer
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    return lambda: fn(net, opt, loader)


def measure_here(spec: dict) -> dict:
    """Measure ``spec['mode']`` ('alone' or 'verify') of one loop in this process: peak above the baseline, wall time per run."""
    import accumlib

    scale = Scale(**{**spec["scale"], "widths": tuple(spec["scale"]["widths"])})
    fn, _ = LOOPS[spec["loop"]]
    tiny, tiny_data = build(QUICK)
    # one-time imports (torch.optim loads torch._dynamo), before the baseline
    prepare(spec["mode"], fn, tiny, tiny_data, QUICK.batch_size)()
    model, dataset = build(scale)
    out: dict[str, Any] = {"runs": [], "accumlib": str(Path(accumlib.__file__).parent)}
    spent = time.perf_counter()
    while len(out["runs"]) < spec["repeats"] and (
        not out["runs"] or time.perf_counter() - spent < spec["budget_s"]
    ):
        run = prepare(spec["mode"], fn, model, dataset, scale.batch_size)
        with Peak() as peak:
            t0 = time.perf_counter()
            result = run()
            wall = time.perf_counter() - t0
        out["runs"].append(
            {
                "wall_s": wall,
                "extra_peak_bytes": peak.extra,
                "base_bytes": peak.base,
                "exact_peak": peak.exact,
            }
        )
        if spec["mode"] == "verify":
            out |= {
                "ok": bool(result.ok),
                "codes": sorted(getattr(result, "codes", [])),
                "steps": len(getattr(result, "steps", [])),
            }
        del result, run  # the next run's baseline holds the model and data only
    if spec["mode"] == "alone":
        x, y = dataset[: scale.batch_size]
        out["param_count"] = sum(p.numel() for p in model.parameters())
        out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        out["activation_bytes"] = accumlib.memory.activation_bytes(model, (x, y), item_losses)
    return out


def child(specs: list[dict], guard_bytes: int) -> list[dict]:
    """The ``--child`` process: the guard first, so that everything it allocates is under it."""
    resource.setrlimit(resource.RLIMIT_AS, (guard_bytes, guard_bytes))
    torch.set_num_threads(THREADS)
    return [measure_here(spec) for spec in specs]


def measure(specs: list[dict], guard_bytes: int, timeout_s: float) -> list[dict]:
    """``specs`` in one fresh process: their figures, or each {'error': why}."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({"specs": specs, "guard_bytes": guard_bytes}),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [{"error": f"ran past {timeout_s:.0f} s"}] * len(specs)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode == 0 and last.startswith("["):
        return json.loads(last)
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    memory = [
        line
        for line in proc.stderr.splitlines()
        if re.search(r"MemoryError|can't allocate memory|bad_alloc", line)
    ]
    if memory:  # anywhere in the traceback: verify re-raises the loop's error as its own
        size = re.search(r"allocate (\d+) bytes", memory[-1])
        why = f"an allocation of {_gb(int(size.group(1)))} was refused" if size else memory[-1].strip()[:120]
        return [{"error": f"over the {guard_bytes / 2**30:.1f} GiB guard: {why}", "over_guard": True}] * len(
            specs
        )
    return [{"error": err[-240:]}] * len(specs)


def run(
    quick: bool = False,
    cases: tuple[str, ...] = tuple(LOOPS),
    steps: int | None = None,
    repeats: int | None = None,
    guard_bytes: int | None = None,
    verbose: bool = True,
) -> dict:
    """Both measurements of every loop in ``cases``; rows and the issue's two goals, as plain dicts."""
    scale = QUICK if quick else FULL
    if steps is not None:
        scale = Scale(scale.in_features, scale.widths, scale.classes, scale.batch_size, steps)
    repeats = repeats or (1 if quick else 3)
    guard = guard_bytes or default_guard()
    specs = [
        {
            "loop": loop,
            "mode": mode,
            "scale": asdict(scale),
            "repeats": repeats,
            "budget_s": 5.0 if quick else 40.0,
        }
        for loop in cases
        for mode in ("alone", "verify")
    ]
    if quick:  # one process for every measurement: the figures are noise anyway, and each start costs seconds
        results = iter(measure(specs, guard, timeout_s=300.0))
    else:  # one fresh process per measurement: its peak is its own
        results = (r for spec in specs for r in measure([spec], guard, timeout_s=600.0))
    rows = []
    facts: dict[str, Any] = {}
    for loop in cases:
        alone, verified = next(results), next(results)
        row: dict[str, Any] = {"loop": loop, "k": K, "steps": scale.steps, "batch_size": scale.batch_size}
        if "error" in alone:
            row["error"] = f"loop alone: {alone['error']}"
        else:
            facts = {f: alone[f] for f in ("param_count", "param_bytes", "activation_bytes", "accumlib")}
            row |= {
                "alone_s": statistics.median(r["wall_s"] for r in alone["runs"]),
                "alone_extra_peak_bytes": max(r["extra_peak_bytes"] for r in alone["runs"]),
                "alone_runs_s": [r["wall_s"] for r in alone["runs"]],
            }
        if "error" in verified:
            row["verify_error"] = verified["error"]
            row["over_guard"] = verified.get("over_guard", False)
        elif "error" not in alone:
            verify_s = statistics.median(r["wall_s"] for r in verified["runs"])
            verify_peak = max(r["extra_peak_bytes"] for r in verified["runs"])
            row |= {
                "verify_s": verify_s,
                "verify_peak_bytes": verify_peak,
                "verify_runs_s": [r["wall_s"] for r in verified["runs"]],
                "verify_extra_peak_bytes": verify_peak - row["alone_extra_peak_bytes"],
                "time_ratio": verify_s / row["alone_s"],
                "ok": verified["ok"],
                "codes": verified["codes"],
                "verify_steps": verified["steps"],
                "verdict_as_expected": LOOPS[loop][1] <= set(verified["codes"])
                if LOOPS[loop][1]
                else verified["ok"],
                "exact_peak": all(r["exact_peak"] for r in alone["runs"] + verified["runs"]),
            }
        rows.append(row)
        if verbose:
            print(
                f"    {loop:<14} "
                + (
                    "  ".join(line_of(row, facts))
                    if "verify_s" in row
                    else row.get("error") or row["verify_error"]
                ),
                flush=True,
            )
    for row in rows:
        if "verify_extra_peak_bytes" in row:
            limit = MEMORY_MAX_PARAMS * facts["param_bytes"] + facts["activation_bytes"]
            row |= {
                "extra_over_params": row["verify_extra_peak_bytes"] / facts["param_bytes"],
                "memory_limit_bytes": limit,
                "memory_met": row["verify_extra_peak_bytes"] <= limit,
                "time_met": row["time_ratio"] <= TIME_MAX,
            }
        elif row.get("over_guard"):
            row["memory_met"] = False  # past a guard of gigabytes: far past the goal, whatever the model
    res = {
        "scale": asdict(scale),
        "k": K,
        "threads": THREADS,
        "guard_bytes": guard,
        "rows": rows,
        **facts,
        "goals": goals(rows, scale, quick),
        "note": note(scale, facts, guard),
    }
    return res


def goals(rows: list[dict], scale: Scale, quick: bool) -> dict:
    """The issue's two goals over every loop: MISSED if one loop misses, met only when every loop was measured and met it."""

    def judge(key: str, flag: str, value: Any) -> dict:
        judged = [r for r in rows if flag in r]
        missed = [f"{r['loop']}: {value(r)}" for r in judged if not r[flag]]
        unmeasured = [
            f"{r['loop']}: not measured ({r.get('verify_error') or r.get('error')})"
            for r in rows
            if flag not in r
        ]
        # a run over the guard is the worst
        worst = max(judged, key=lambda r: r.get(key, math.inf)) if judged else None
        return {
            "measured": f"worst {worst['loop']}: {value(worst)}" if worst else "no loop could be measured",
            "met": False if missed else (None if unmeasured else True),
            "missed": missed + unmeasured,
        }

    out = {
        "verify_scale_memory": judge(
            "extra_over_params",
            "memory_met",
            lambda r: (
                f"{_gb(r['verify_extra_peak_bytes'])}, {r['extra_over_params']:.1f}x the parameters (goal {_gb(r['memory_limit_bytes'])})"
                if "verify_extra_peak_bytes" in r
                else r["verify_error"]
            ),
        ),
        "verify_scale_time": judge("time_ratio", "time_met", lambda r: f"{r['time_ratio']:.2f}x"),
    }
    covered = {r["loop"] for r in rows}
    for g in out.values():
        if quick:
            # a tiny MLP: resident memory is the interpreter's noise, and times are milliseconds
            g["met"] = None
        elif scale.steps != FULL.steps or covered != set(LOOPS):
            g["note"] = (
                f"{', '.join(sorted(covered))} at {scale.steps} optimizer step{'s' if scale.steps != 1 else ''}: not the issue's full case"
            )
    return out


def note(scale: Scale, facts: dict, guard: int) -> str:
    head = f"MLP {'-'.join(map(str, (scale.in_features, *scale.widths, scale.classes)))}"
    if facts:
        head += f": {facts['param_count']:,} float32 parameters ({_mib(facts['param_bytes'])}), one micro-batch's activations {_mib(facts['activation_bytes'])}"
    return (
        f"{head}; k = {K}, {scale.steps} optimizer step{'s' if scale.steps != 1 else ''} of {K} micro-batches of {scale.batch_size} ({scale.n_items} items), "
        f"{THREADS} thread; each measurement a fresh process; extra peak = peak resident memory (VmHWM) above the run's baseline "
        f"(model and data built, one warm-up run on a tiny MLP done); verify's extra = its extra peak - the loop's; times: medians, run only; "
        f"guard {guard / 2**30:.1f} GiB of address space per run"
    )


def _gb(n: float) -> str:
    # the unit; MB for the tiny --quick MLP
    return f"{n / 1e9:.2f} GB" if abs(n) >= 1e8 else f"{n / 1e6:.1f} MB"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def line_of(row: dict, facts: dict) -> list[str]:
    return [
        f"loop alone +{_gb(row['alone_extra_peak_bytes'])} {row['alone_s']:.2f} s",
        f"verify +{_gb(row['verify_peak_bytes'])} {row['verify_s']:.2f} s",
        f"verify's extra {_gb(row['verify_extra_peak_bytes'])} ({row['verify_extra_peak_bytes'] / facts['param_bytes']:.1f}x params)",
        f"time {row['time_ratio']:.2f}x",
        f"verdict {'ok' if row['ok'] else ', '.join(row['codes'])}",
    ]


def lines(res: dict, short: bool = False) -> list[str]:
    """The section as markdown: one row per loop, both goals per row."""
    head = [
        "loop",
        "verdict",
        "loop alone: extra peak, time",
        "verify's extra peak",
        "x parameter bytes",
        "goal <= 4x + activations",
        "verify / loop time",
        "goal <= 3x",
    ]
    body = []
    for r in res["rows"]:
        if "verify_extra_peak_bytes" in r:
            verdict = ("ok" if r["ok"] else ", ".join(r["codes"])) + (
                "" if r["verdict_as_expected"] else " (NOT the expected verdict)"
            )
            body.append(
                [
                    r["loop"],
                    verdict,
                    f"{_gb(r['alone_extra_peak_bytes'])}, {r['alone_s']:.2f} s",
                    _gb(r["verify_extra_peak_bytes"]),
                    f"{r['extra_over_params']:.1f}x",
                    f"{'met' if r['memory_met'] else 'MISSED'} ({_gb(r['memory_limit_bytes'])})",
                    f"{r['time_ratio']:.2f}x ({r['verify_s']:.2f} / {r['alone_s']:.2f} s)",
                    "met" if r["time_met"] else "MISSED",
                ]
            )
        else:
            alone = (
                f"{_gb(r['alone_extra_peak_bytes'])}, {r['alone_s']:.2f} s"
                if "alone_s" in r
                else r.get("error", "")
            )
            why = r.get("verify_error", "")
            body.append(
                [
                    r["loop"],
                    "",
                    alone,
                    f"not available: {why}",
                    "",
                    "MISSED" if r.get("memory_met") is False else "not measured",
                    "not measured",
                    "not measured",
                ]
            )
    lines = md_table(head, body)
    if not all(r.get("exact_peak", True) for r in res["rows"]):
        lines += [
            "",
            "peaks sampled every 2 ms (the kernel's high-water mark could not be reset here): a short spike may be missed",
        ]
    return lines


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="a tiny MLP: checks the script, measures nothing for real"
    )
    p.add_argument(
        "--cases", default=",".join(LOOPS), help=f"comma-separated loops (default all): {','.join(LOOPS)}"
    )
    p.add_argument("--steps", type=int, help=f"optimizer steps (default {FULL.steps}, the issue's)")
    p.add_argument(
        "--repeats", type=int, help="runs per measurement, within one process (default 3; 1 with --quick)"
    )
    p.add_argument(
        "--guard-gb",
        type=float,
        help="address space one run may take, GiB (default 12, or 3/4 of the free memory)",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(child(job["specs"], job["guard_bytes"])))
        return {}
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = [c for c in cases if c not in LOOPS]
    if unknown or not cases:
        p.error(f"--cases must name loops from {','.join(LOOPS)} (got {args.cases!r})")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1 (got {args.steps})")
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"verify at scale{' (--quick: a tiny MLP, figures only)' if args.quick else ''}: {torch.__version__}, {THREADS} thread{load}",
        flush=True,
    )
    res = run(
        args.quick, cases, args.steps, args.repeats, int(args.guard_gb * 2**30) if args.guard_gb else None
    )
    print(f"accumlib from {res.get('accumlib', '?')}\n")
    print("\n".join(lines(res)))
    print(f"\n{res['note']}\n")
    for key, g in res["goals"].items():
        status = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        print(f"  {status:<13} {key:<20} {g['measured']}" + (f"  ({g['note']})" if g.get("note") else ""))
    if hasattr(os, "getloadavg"):
        print(
            f"\nload average at the end: {os.getloadavg()[0]:.1f} (this run keeps one core busy; more means other work shared the machine)"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
