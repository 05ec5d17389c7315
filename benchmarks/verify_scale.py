"""Verify at real scale: the peak memory and the time ``accumlib.verify`` adds on a 39.4M-parameter MLP and
a nanoGPT-sized GPT.

The cases of the issue: an MLP of 39.4M float32 parameters (150 MiB), and a GPT of nanoGPT's
shakespeare-char shape (10.7M parameters; sequences of 64 tokens), each k = 8, 4 optimizer steps,
one CPU thread, two loops as a user writes them (in ``_verify_scale_runs.py``, with the models and the
measuring process), one correct and one that never divides its loss.
Each measurement is a fresh process, so the peak resident memory of its runs (the kernel's
high-water mark, reset at the start of each run) is their own:

    loop alone   train_fn(model, SGD, DataLoader) on a copy of the model made before the run
    verify       accumlib.verify(train_fn, model=..., ...), which makes its own copies inside the run: by
                 default in place (the loop's own backward is the oracle, ``inplace_verify.py``)
    recompute    the same with oracle="recompute" (every micro-batch replayed): printed beside it
    pairs        the loop alone and verify in turn, 3 times, in one more process: the time ratio is the
                 median of the pairs' (fresh processes doing the same work differ by up to 40% here)

Both peaks are taken above the same kind of baseline (model and data built, one warm-up run on a
tiny MLP done so one-time imports are outside), and verify's extra peak is verify's minus the
loop's. Goals of the issue, stated as met or MISSED:

    memory   verify's extra peak <= 2 x the parameter bytes + one micro-batch's activations: the copy of
             the model verify promises (1x), and the engine's own bytes at most 1x (issue 27)
    time     verify / loop alone <= 1.2 (median of the pairs), for the correct and the buggy loop alike

A guard (RLIMIT_AS of each run, default 12 GiB or 3/4 of the free memory) makes a run that
needs too much fail instead of taking the machine down; such a run reads "over the guard".

    python benchmarks/verify_scale.py                          # the issue's cases (6 minutes on 2 cores)
    python benchmarks/verify_scale.py --cases correct --steps 1
    python benchmarks/verify_scale.py --models GPT
    python benchmarks/verify_scale.py --quick                  # tiny models: keeps the script working
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, wherever it is loaded from
from _peak import default_guard  # noqa: E402
from _render import md_table  # noqa: E402
from _verify_scale_runs import FULL, GPT_FULL, GPT_QUICK, LOOPS, QUICK, THREADS, K, Scale, _gb, measure  # noqa: E402

# verify's extra peak, in parameter bytes (plus one micro-batch's activations): its copy of the model (1x)
# and the in-place engine's one buffer (1x)
MEMORY_MAX_PARAMS = 2.0
TIME_MAX = 1.2
# the two models: (full size, --quick size)
SCALES = {"MLP": {False: FULL, True: QUICK}, "GPT": {False: GPT_FULL, True: GPT_QUICK}}
MODELS = tuple(SCALES)

NAME = "verify_scale"
TITLE = "8. Verify at scale: 39.4M-parameter MLP and nanoGPT-sized GPT, k = 8"
LIMIT = TIME_MAX
GOALS = {
    "verify_scale_memory": "verify's extra peak memory over the loop alone <= 2x parameter bytes (its copy "
    "of the model, and at most 1x for the engine) + one micro-batch's activations (39.4M-parameter MLP and "
    "10.7M-parameter GPT, k = 8, correct and never-divided loops)",
    "verify_scale_time": "verify / loop alone <= 1.2 (median), 39.4M-parameter MLP and 10.7M-parameter GPT, "
    "correct and never-divided loops",
}


def run(quick: bool = False) -> dict:
    """The section as bench.py runs it (the face every section has): ``run_cases`` with its defaults."""
    return run_cases(quick)


def run_cases(
    quick: bool = False,
    cases: tuple[str, ...] = tuple(LOOPS),
    steps: int | None = None,
    repeats: int | None = None,
    guard_bytes: int | None = None,
    verbose: bool = True,
    models: tuple[str, ...] = MODELS,
) -> dict:
    """Both measurements of every loop in ``cases`` on each of ``models`` ("MLP", "GPT"); rows and the issue's
    two goals, as plain dicts (the command line's ``--cases``, ``--steps``, ``--repeats``, ``--guard-gb``
    and ``--models``)."""
    repeats = repeats or (1 if quick else 3)
    guard = guard_bytes or default_guard()
    rows: list[dict] = []
    facts: dict[str, dict] = {}  # per model: parameters, activations, its scale
    for model in models:
        scale = SCALES[model][quick]
        if steps is not None:
            scale = replace(scale, steps=steps)
        label, got = _measure_model(scale, quick, cases, repeats, guard, verbose)
        rows += got
        facts[label] = {"scale": asdict(scale)} | {
            k: got[0][k] for k in ("param_count", "param_bytes", "activation_bytes") if k in got[0]
        }
    first = next(iter(facts.values()))
    return {
        "scale": first["scale"],
        "k": K,
        "threads": THREADS,
        "guard_bytes": guard,
        "rows": rows,
        "models": facts,
        **{k: v for k, v in first.items() if k != "scale"},
        "accumlib": next((r["accumlib"] for r in rows if "accumlib" in r), "?"),
        "goals": goals(rows, quick, steps, cases, models),
        "note": note(facts, guard),
    }


def _measure_model(
    scale: Scale, quick: bool, cases: tuple[str, ...], repeats: int, guard: int, verbose: bool
) -> tuple[str, list[dict]]:
    """Every loop of ``cases`` on one model: its label ("MLP 39.4M") and its rows."""
    # memory and verdicts: one run in a fresh process each (its peak is its own); time: the loop alone and
    # verify in turn in one more process (``pairs``), whose ratios are each measured under the same conditions
    specs = [
        {
            "loop": loop,
            "mode": mode,
            "scale": asdict(scale),
            "repeats": repeats if mode == "pairs" else 1,
            "budget_s": 5.0 if quick else 40.0,
        }
        for loop in cases
        for mode in ("alone", "verify", "recompute", "pairs")
    ]
    # the two peaks again with glibc's mmap threshold fixed (``FIXED_MALLOC``): what the runs hold, without
    # what the allocator keeps; a process each, so at full size only
    fixed = (
        []
        if quick
        else [{**spec, "malloc": "fixed"} for spec in specs if spec["mode"] in ("alone", "verify")]
    )
    if quick:  # one process for every measurement: the figures are noise anyway, and each start costs seconds
        results = iter(measure(specs, guard, timeout_s=300.0))
    else:  # one fresh process per measurement: its peak is its own
        results = (r for spec in specs for r in measure([spec], guard, timeout_s=600.0))
    rows = []
    label = scale.model
    for loop in cases:
        alone, verified, recomputed, paired = next(results), next(results), next(results), next(results)
        held = [measure([spec], guard, timeout_s=600.0)[0] for spec in fixed if spec["loop"] == loop]
        row: dict[str, Any] = {"loop": loop, "k": K, "steps": scale.steps, "batch_size": scale.batch_size}
        if "error" in alone:
            row["error"] = f"loop alone: {alone['error']}"
        else:
            n = alone["param_count"]
            label = f"{scale.model} {f'{n / 1e6:.1f}M' if n >= 1e5 else f'{n:,}'}"
            row |= {f: alone[f] for f in ("param_count", "param_bytes", "activation_bytes", "accumlib")}
            row |= {
                "alone_s": statistics.median(r["wall_s"] for r in alone["runs"]),
                "alone_extra_peak_bytes": max(r["extra_peak_bytes"] for r in alone["runs"]),
                "alone_runs_s": [r["wall_s"] for r in alone["runs"]],
            }
            if "pairs" in paired:  # the times the ratio is taken from: the loop alone and verify in turn
                row["alone_runs_s"] = paired["pairs"]["alone"]
                row["alone_s"] = statistics.median(row["alone_runs_s"])
            row["alone_process_s"] = alone["runs"][0]["wall_s"]  # one run in the fresh process of its peak
        if "error" in verified:
            row["verify_error"] = verified["error"]
            row["over_guard"] = verified.get("over_guard", False)
        elif "error" not in alone:
            runs = paired["pairs"]["verify"] if "pairs" in paired else [r["wall_s"] for r in verified["runs"]]
            pair_ratios = (
                [v / a for v, a in zip(runs, paired["pairs"]["alone"])]
                if "pairs" in paired
                else [statistics.median(runs) / row["alone_s"]]
            )
            verify_peak = max(r["extra_peak_bytes"] for r in verified["runs"])
            row |= {
                "verify_s": statistics.median(runs),
                "verify_peak_bytes": verify_peak,
                "verify_runs_s": runs,
                "verify_extra_peak_bytes": verify_peak - row["alone_extra_peak_bytes"],
                "time_ratio": statistics.median(pair_ratios),
                "time_ratio_range": [min(pair_ratios), max(pair_ratios)],
                "time_from": "pairs" if "pairs" in paired else f"two processes ({paired.get('error', '?')})",
                "ok": verified["ok"],
                "codes": verified["codes"],
                "verify_steps": verified["steps"],
                "verdict_as_expected": LOOPS[loop][1] <= set(verified["codes"])
                if LOOPS[loop][1]
                else verified["ok"],
                "oracle": verified["oracle"],
                "exact_peak": all(r["exact_peak"] for r in alone["runs"] + verified["runs"]),
            }
        if len(held) == 2 and not any("error" in h for h in held):  # (alone, verify) under FIXED_MALLOC
            row["held_extra_peak_bytes"] = (
                held[1]["runs"][0]["extra_peak_bytes"] - held[0]["runs"][0]["extra_peak_bytes"]
            )
        if "error" not in recomputed and "alone_s" in row:  # the recompute oracle's figures, beside
            recompute_s = statistics.median(r["wall_s"] for r in recomputed["runs"])
            row |= {
                "recompute_s": recompute_s,
                # against the loop alone's one run in its own fresh process, as this one is
                "recompute_ratio": recompute_s / row["alone_process_s"],
                "recompute_extra_peak_bytes": max(r["extra_peak_bytes"] for r in recomputed["runs"])
                - row["alone_extra_peak_bytes"],
                "recompute_codes": recomputed["codes"],
            }
        rows.append(row)
    for row in rows:
        row["model"] = label
        if "verify_extra_peak_bytes" in row:
            limit = MEMORY_MAX_PARAMS * row["param_bytes"] + row["activation_bytes"]
            row |= {
                "extra_over_params": row["verify_extra_peak_bytes"] / row["param_bytes"],
                "memory_limit_bytes": limit,
                "memory_met": row["verify_extra_peak_bytes"] <= limit,
                "time_met": row["time_ratio"] <= TIME_MAX,
            }
        elif row.get("over_guard"):
            row["memory_met"] = False  # past a guard of gigabytes: far past the goal, whatever the model
        if verbose:
            print(
                f"    {label:<10} {row['loop']:<14} "
                + ("  ".join(line_of(row)) if "verify_s" in row else row.get("error") or row["verify_error"]),
                flush=True,
            )
    return label, rows


def goals(
    rows: list[dict], quick: bool, steps: int | None, cases: tuple[str, ...], models: tuple[str, ...]
) -> dict:
    """The issue's two goals over every loop and model: MISSED if one misses, met only when every loop was
    measured and met it."""

    def judge(key: str, flag: str, value: Any) -> dict:
        judged = [r for r in rows if flag in r]
        missed = [f"{r['model']} {r['loop']}: {value(r)}" for r in judged if not r[flag]]
        unmeasured = [
            f"{r['model']} {r['loop']}: not measured ({r.get('verify_error') or r.get('error')})"
            for r in rows
            if flag not in r
        ]
        # a run over the guard is the worst
        worst = max(judged, key=lambda r: r.get(key, math.inf)) if judged else None
        return {
            "measured": f"worst {worst['model']} {worst['loop']}: {value(worst)}"
            if worst
            else "no loop could be measured",
            "met": False if missed else (None if unmeasured else True),
            "missed": missed + unmeasured,
        }

    out = {
        "verify_scale_memory": judge(
            "extra_over_params",
            "memory_met",
            lambda r: (
                f"{_gb(r['verify_extra_peak_bytes'])}, {r['extra_over_params']:.1f}x the parameters (goal "
                f"{_gb(r['memory_limit_bytes'])})"
                if "verify_extra_peak_bytes" in r
                else r["verify_error"]
            ),
        ),
        "verify_scale_time": judge("time_ratio", "time_met", lambda r: f"{r['time_ratio']:.2f}x"),
    }
    for g in out.values():
        if quick:
            # tiny models: resident memory is the interpreter's noise, and times are milliseconds
            g["met"] = None
        elif (steps not in (None, FULL.steps)) or set(cases) != set(LOOPS) or set(models) != set(MODELS):
            g["note"] = (
                f"{', '.join(models)}: {', '.join(sorted(cases))} at {steps or FULL.steps} optimizer "
                f"step{'s' if steps != 1 else ''}: not the issue's full case"
            )
    return out


def note(facts: dict[str, dict], guard: int) -> str:
    heads = []
    for f in facts.values():
        sc = Scale(**{**f["scale"], "widths": tuple(f["scale"]["widths"])})
        if sc.seq:
            head = (
                f"GPT of nanoGPT's layout, {sc.layers} layer(s) of {sc.heads} heads, {sc.in_features} wide, "
                f"vocabulary {sc.classes}, micro-batches of {sc.batch_size} sequences of {sc.seq} tokens"
            )
        else:
            sizes = "-".join(map(str, (sc.in_features, *sc.widths, sc.classes)))
            head = f"MLP {sizes}, micro-batches of {sc.batch_size}"
        if "param_count" in f:
            head += (
                f": {f['param_count']:,} float32 parameters ({_mib(f['param_bytes'])}), one "
                f"micro-batch's activations {_mib(f['activation_bytes'])}"
            )
        heads.append(head)
    steps = next(iter(facts.values()))["scale"]["steps"] if facts else 0
    return (
        f"{'; '.join(heads)}; k = {K}, {steps} optimizer step{'s' if steps != 1 else ''} of {K} "
        f"micro-batches, {THREADS} thread; each measurement a "
        "fresh process; extra peak = peak resident memory (VmHWM) above the run's baseline (model and data "
        "built, one warm-up run on a tiny MLP done); verify's extra = its extra peak - the loop's; time: the "
        "loop alone and verify in turn in one more process, the median of the pairs' ratios [their range], "
        "run only (two processes doing the same work differ by up to 40% on this kind of host); the "
        "recompute oracle's time against the loop alone's in its own process; the last column: both peaks "
        "again, each in a fresh process under glibc with a fixed mmap threshold "
        "(MALLOC_MMAP_THRESHOLD_=65536, MALLOC_TRIM_THRESHOLD_=0: what the runs hold, without what the "
        "allocator keeps; the goal is judged on the default); guard "
        f"{guard / 2**30:.1f} GiB of address space per run"
    )


def _held(r: dict) -> str:
    if "held_extra_peak_bytes" not in r:
        return "not measured"
    return f"{_gb(r['held_extra_peak_bytes'])} ({r['held_extra_peak_bytes'] / r['param_bytes']:.2f}x)"


def _range(pair: list[float]) -> str:
    return f"{pair[0]:.2f}, {pair[1]:.2f}"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def line_of(row: dict) -> list[str]:
    return [
        f"loop alone +{_gb(row['alone_extra_peak_bytes'])} {row['alone_s']:.2f} s",
        f"verify +{_gb(row['verify_peak_bytes'])} {row['verify_s']:.2f} s",
        f"verify's extra {_gb(row['verify_extra_peak_bytes'])} "
        f"({row['verify_extra_peak_bytes'] / row['param_bytes']:.1f}x params)",
        f"time {row['time_ratio']:.2f}x",
        f"verdict {'ok' if row['ok'] else ', '.join(row['codes'])} ({row['oracle']})",
    ] + ([f"recompute oracle {row['recompute_ratio']:.2f}x"] if "recompute_ratio" in row else [])


def lines(res: dict, short: bool = False) -> list[str]:
    """The section as markdown: one row per loop, both goals per row."""
    head = [
        "model",
        "loop",
        "verdict",
        "loop alone: extra peak, time",
        "verify's extra peak",
        "x parameter bytes",
        "goal <= 2x + activations",
        "verify / loop time [range]",
        "goal <= 1.2x",
        "oracle",
        "recompute oracle: extra peak, time",
        "verify's extra peak, glibc's mmap threshold fixed (x parameter bytes)",
    ]
    body = []
    for r in res["rows"]:
        if "verify_extra_peak_bytes" in r:
            verdict = ("ok" if r["ok"] else ", ".join(r["codes"])) + (
                "" if r["verdict_as_expected"] else " (NOT the expected verdict)"
            )
            body.append(
                [
                    r["model"],
                    r["loop"],
                    verdict,
                    f"{_gb(r['alone_extra_peak_bytes'])}, {r['alone_s']:.2f} s",
                    _gb(r["verify_extra_peak_bytes"]),
                    f"{r['extra_over_params']:.1f}x",
                    f"{'met' if r['memory_met'] else 'MISSED'} ({_gb(r['memory_limit_bytes'])})",
                    f"{r['time_ratio']:.2f}x [{_range(r['time_ratio_range'])}] "
                    f"({r['verify_s']:.2f} / {r['alone_s']:.2f} s)",
                    "met" if r["time_met"] else "MISSED",
                    r["oracle"],
                    f"{_gb(r['recompute_extra_peak_bytes'])}, {r['recompute_ratio']:.2f}x"
                    if "recompute_s" in r
                    else "not measured",
                    _held(r),
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
                    r["model"],
                    r["loop"],
                    "",
                    alone,
                    f"not available: {why}",
                    "",
                    "MISSED" if r.get("memory_met") is False else "not measured",
                    "not measured",
                    "not measured",
                    "",
                    "",
                    "",
                ]
            )
    lines = md_table(head, body)
    if not all(r.get("exact_peak", True) for r in res["rows"]):
        lines += [
            "",
            "peaks sampled every 2 ms (the kernel's high-water mark could not be reset here): a short spike "
            "may be missed",
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
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated models (default both): {','.join(MODELS)}",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = [c for c in cases if c not in LOOPS]
    if unknown or not cases:
        p.error(f"--cases must name loops from {','.join(LOOPS)} (got {args.cases!r})")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if not models or any(m not in MODELS for m in models):
        p.error(f"--models must name models from {','.join(MODELS)} (got {args.models!r})")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1 (got {args.steps})")
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"verify at scale{' (--quick: tiny models, figures only)' if args.quick else ''}: "
        f"{torch.__version__}, {THREADS} thread{load}",
        flush=True,
    )
    res = run_cases(
        args.quick,
        cases,
        args.steps,
        args.repeats,
        int(args.guard_gb * 2**30) if args.guard_gb else None,
        models=models,
    )
    print(f"accumlib from {res.get('accumlib', '?')}\n")
    print("\n".join(lines(res)))
    print(f"\n{res['note']}\n")
    for key, g in res["goals"].items():
        status = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        print(f"  {status:<13} {key:<20} {g['measured']}" + (f"  ({g['note']})" if g.get("note") else ""))
    if hasattr(os, "getloadavg"):
        print(
            f"\nload average at the end: {os.getloadavg()[0]:.1f} (this run keeps one core busy; more means "
            "other work shared the machine)"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
