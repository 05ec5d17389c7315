"""Section 10, verify across ranks: ``accumlib.verify(..., ranks="all")`` on 2 gloo ranks (CPU) against the
same correct DDP loop alone (``accumlib_course.examples.ddp_loops.LOOPS["correct"]``), same data, same ranks.

Two models: an MLP of 11.3M float32 parameters (45.2 MB; built like verify_scale's) and the lm-tokens
task's tiny causal LM (16.8K parameters: time and traffic only, its memory is below the noise). Three
figures, each per rank:

    time      median over 3 interleaved pairs of verify / loop alone, on rank 0 (both ranks start
              each run at a barrier; their collectives keep them in step), after a warm-up of each
    memory    verify's extra peak resident memory over the loop alone's, per rank: two fresh launches
              (one runs the loop alone first, one verify first), each run's peak (VmHWM, reset at its
              start: _peak.Peak, inside each rank) above the same kind of baseline (model and data
              built, a warm-up of both on a tiny MLP done so one-time imports are outside)
    traffic   counted, not computed: torch.distributed's Python collectives (all_reduce, broadcast,
              all_gather_object, all_gather, ...) are wrapped in each rank during verify's measured run and
              every call is attributed to verify (a caller in accumlib/_verify) or to the loop (its
              4-byte item-count all-reduce); the loop's DDP gradient all-reduce goes through DDP's C++
              reducer, which such a wrap never sees, so a DDP communication hook counts it apart

Goals (the single-process ones of verify_scale, plus what the exchange itself may add):

    time      verify / loop alone <= 1.2 (median), as verify_scale_time for one process (issue 27)
    memory    extra per rank <= 3 x parameter bytes + one micro-batch's activations: one process's
              budget in place (2x + activations) plus the exchange's one P-sized float32 buffer
    traffic   verify's collectives per optimizer step and rank <= 4 x parameter bytes + 64 KiB
              (ranks.py: at most 4 P-sized collectives per step, plus a few gathered numbers)

    python benchmarks/verify_ranks.py            # the full section (about a minute on 2 cores)
    python benchmarks/verify_ranks.py --quick    # tiny sizes, one launch: keeps the script working
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also in the spawned ranks
from _render import md_table  # noqa: E402

NAME = "verify_ranks"
TITLE = "10. Verify across ranks: verify(ranks='all') on 2 gloo ranks, a correct DDP loop"
WORLD = 2
TIME_MAX = 1.2  # issue 27: in place, as for one process
MEMORY_MAX_PARAMS = (
    3.0  # one process's 2x (verify's copy, the engine's sum) + the exchange's one P-sized buffer
)
TRAFFIC_MAX_PARAMS = 4.0  # P-sized collectives per step (ranks.py's docstring)
TRAFFIC_SLACK = 64 * 1024  # the gathered numbers beside them
LIMIT = TIME_MAX
GOALS = {
    "verify_ranks_time": "verify(ranks='all') / the same DDP loop alone <= 1.2 on 2 gloo ranks (median), "
    "11.3M-parameter MLP and lm-tokens",
    "verify_ranks_memory": "verify(ranks='all')'s extra peak memory per rank over the loop alone <= 3x "
    "parameter bytes + one micro-batch's activations (one process's 2x in place, plus one P-sized exchange "
    "buffer), "
    "11.3M-parameter MLP",
    "verify_ranks_traffic": "verify(ranks='all')'s collectives per optimizer step and rank <= 4x parameter "
    "bytes + 64 KiB (counted)",
}
LAUNCH_TIMEOUT_S = 300.0


from _ranks_worker import FULL, QUICK, WARM, Case, Scale, Traffic, build, count_items, item_losses, rank_main  # noqa: E402,F401


def _launch(plan: dict, out: str) -> list[dict]:
    from accumlib.distributed import launch

    launch(rank_main, (json.dumps(plan), out), world_size=WORLD, timeout=LAUNCH_TIMEOUT_S)
    return [json.loads(Path(out, f"{plan['label']}-rank{r}.json").read_text()) for r in range(WORLD)]


def _activation_bytes(scale: Scale) -> int:
    import accumlib_course.memory

    model, data = build(scale)
    return accumlib_course.memory.activation_bytes(model, data[: scale.batch_size], item_losses)


# --- the section ------------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict:
    """The section as bench.py runs it (the face every section has): ``measure`` with its defaults."""
    return measure(quick)


def measure(quick: bool = False, repeats: int | None = None, verbose: bool = True) -> dict:
    """Two launches of 2 gloo ranks (one with --quick); rows per model and the three goals, as plain
    dicts. ``repeats``: interleaved timing pairs per model (the command line's ``--repeats``)."""
    try:
        import torch.distributed as dist

        import accumlib.distributed  # noqa: F401
    except ImportError as err:
        return {"not_available": f"accumlib.distributed cannot be imported ({err})"}
    if not dist.is_available():
        return {"not_available": "torch.distributed is not available in this build of torch"}
    scale = QUICK if quick else FULL
    sizes = (scale.in_features, *scale.widths, scale.classes)
    mlp = f"MLP {sum(a * b + b for a, b in zip(sizes, sizes[1:])) / 1e6:.1f}M"
    repeats = repeats or (1 if quick else 3)
    names = [mlp, "lm-tokens"]
    common = {"scale": asdict(scale), "cases": names, "repeats": repeats}
    # the loop alone's peak first in one fresh launch, verify's first in another: each peak is its process's
    # own
    # the loop alone's peak in one fresh launch, verify's first in another (its collectives counted
    # meanwhile),
    # where the timings follow: each peak is its process's own
    plans = (
        [
            {
                **common,
                "label": "all",
                "memory": [[mlp, "alone"], [mlp, "verify"]],
                "time": names,
                "traffic": names,
            }
        ]
        if quick
        else [
            {**common, "label": "alone-first", "memory": [[mlp, "alone"]]},
            {**common, "label": "verify-first", "memory": [[mlp, "verify"]], "traffic": names, "time": names},
        ]
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="accumlib-verify-ranks-") as out:
        try:
            got = [_launch(p, out) for p in plans]
        except Exception as err:
            return {
                "not_available": f"spawning {WORLD} loopback ranks failed: {type(err).__name__}: "
                f"{str(err)[-300:]}"
            }
    launches_s = time.perf_counter() - t0
    # per rank, both launches merged
    ranks = [{k: v for r in (g[i] for g in got) for k, v in r.items()} for i in range(WORLD)]
    for i in range(WORLD):
        ranks[i]["memory"] = {k: v for g in got for k, v in g[i].get("memory", {}).items()}
    activations = _activation_bytes(scale)
    rows = []
    for name in names:
        facts = ranks[0]["cases"][name]
        t = [r["time"][name] for r in ranks]
        # rank 0's clock; the ranks wait on each other in every collective
        alone, verified = t[0]["alone"], t[0]["verify"]
        pair = [v / a for v, a in zip(verified, alone)]
        tr = [r["traffic"][name] for r in ranks]
        row: dict[str, Any] = {
            "model": name,
            **facts,
            "world_size": WORLD,
            "verdict_ok": all(x["ok"] for x in t) and all(x["ok"] for x in tr),
            "codes": t[0]["codes"],
            "steps": t[0]["steps"],
            "oracle": t[0].get("oracle", "?"),  # in place by default (issue 27); every rank says the same
            "alone_s": statistics.median(alone),
            "verify_s": statistics.median(verified),
            "ratio": statistics.median(pair),
            "ratio_range": [min(pair), max(pair)],
            "alone_runs_s": alone,
            "verify_runs_s": verified,
            "repeats": repeats,
            # traffic: the worst rank (they are equal but for the gathered numbers' pickled sizes)
            "bytes_per_step": max(x["bytes_per_step"] for x in tr),
            "calls_per_step": max(x["calls_per_step"] for x in tr),
            "traffic_per_rank": tr,
        }
        row["bytes_over_params"] = row["bytes_per_step"] / facts["param_bytes"]
        row["traffic_limit_bytes"] = TRAFFIC_MAX_PARAMS * facts["param_bytes"] + TRAFFIC_SLACK
        row["traffic_met"] = row["bytes_per_step"] <= row["traffic_limit_bytes"]
        row["time_met"] = row["ratio"] <= TIME_MAX
        mem = [(r["memory"].get(f"{name}/alone"), r["memory"].get(f"{name}/verify")) for r in ranks]
        if all(a and v for a, v in mem):
            extra = [v["extra_peak_bytes"] - a["extra_peak_bytes"] for a, v in mem]
            limit = MEMORY_MAX_PARAMS * facts["param_bytes"] + activations
            row |= {
                "alone_peak_bytes": [a["extra_peak_bytes"] for a, _ in mem],
                "verify_peak_bytes": [v["extra_peak_bytes"] for _, v in mem],
                "verify_extra_peak_bytes_per_rank": extra,
                "verify_extra_peak_bytes": max(extra),
                "extra_over_params": max(extra) / facts["param_bytes"],
                "activation_bytes": activations,
                "memory_limit_bytes": limit,
                "memory_met": max(extra) <= limit,
                "exact_peak": all(a["exact_peak"] and v["exact_peak"] for a, v in mem),
            }
        rows.append(row)
        if verbose:
            print("    " + "  ".join(line_of(row)), flush=True)
    return {
        "rows": rows,
        "goals": goals(rows, quick),
        "launches_s": launches_s,
        "note": note(scale, rows, quick),
    }


def goals(rows: list[dict], quick: bool) -> dict:
    def judge(flag: str, value: Any, only: list[dict] | None = None) -> dict:
        judged = [r for r in (only if only is not None else rows) if flag in r]
        missed = [f"{r['model']}: {value(r)}" for r in judged if not r[flag]]
        measured = "; ".join(f"{r['model']}: {value(r)}" for r in judged) or "not measured"
        met = None if quick or not judged else not missed
        return {"measured": measured, "met": met, "missed": [] if quick else missed}

    out = {
        "verify_ranks_time": judge(
            "time_met", lambda r: f"{r['ratio']:.2f}x ({r['verify_s']:.2f} / {r['alone_s']:.2f} s)"
        ),
        "verify_ranks_memory": judge(
            "memory_met",
            lambda r: (
                f"{_mb(r['verify_extra_peak_bytes'])} worst rank, {r['extra_over_params']:.1f}x the "
                f"parameters (goal {_mb(r['memory_limit_bytes'])})"
            ),
        ),
        "verify_ranks_traffic": judge(
            "traffic_met",
            lambda r: (
                f"{_mb(r['bytes_per_step'])} per step and rank, {r['bytes_over_params']:.2f}x the parameters "
                f"({r['calls_per_step']:.0f} calls)"
            ),
        ),
    }
    if quick:
        for g in out.values():
            g["note"] = "--quick: tiny sizes, no verdict"
    return out


def note(scale: Scale, rows: list[dict], quick: bool) -> str:
    mlp = rows[0]
    return (
        f"{WORLD} gloo ranks on loopback, 1 thread each, the correct DDP loop of "
        "accumlib_course.examples.ddp_loops; MLP "
        f"{'-'.join(map(str, (scale.in_features, *scale.widths, scale.classes)))} ({mlp['param_count']:,} "
        f"parameters, {_mb(mlp['param_bytes'])}), k = {scale.k}, micro-batches of {scale.batch_size}, "
        f"{scale.steps} optimizer steps per rank (equal counts: no per-rank-mean all-reduce); lm-tokens: its "
        "task's k = 4, batches of 4, 64 sequences (token counts differ between ranks: the per-rank-mean "
        f"all-reduce runs). Time: rank 0's, median of {mlp['repeats']} interleaved pairs, each of loop alone "
        "and verify warmed up once in the process first. Memory: per rank, peak resident memory (VmHWM) "
        "above the run's baseline (model and data built, a tiny MLP's runs done), the loop alone and verify "
        "each first in its own fresh launch; verify's extra = its peak - the loop's. Traffic: "
        "torch.distributed's Python collectives counted in each rank during verify's run (bytes this rank "
        "hands in: a tensor's, a gathered object's pickled size), per optimizer step; the loop's DDP "
        "gradient all-reduce (C++ reducer, unseen by such a count) counted apart by a DDP communication hook"
        + ("; --quick: tiny sizes, everything in one launch, no verdict" if quick else "")
    )


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if abs(n) >= 1e5 else f"{n / 1e3:.1f} kB"


def line_of(r: dict) -> list[str]:
    out = [f"{r['model']:<10}", f"time {r['ratio']:.2f}x ({r['verify_s']:.2f} / {r['alone_s']:.2f} s)"]
    if "verify_extra_peak_bytes" in r:
        out.append(
            "verify's extra peak per rank "
            + ", ".join(_mb(x) for x in r["verify_extra_peak_bytes_per_rank"])
            + f" ({r['extra_over_params']:.1f}x params)"
        )
    ddp = r["traffic_per_rank"][0]["ddp_bytes_per_step"]
    out += [
        f"traffic {_mb(r['bytes_per_step'])}/step ({r['bytes_over_params']:.2f}x params "
        f"{_mb(r['param_bytes'])}; DDP's own {_mb(ddp)})",
        f"verdict {'ok' if r['verdict_ok'] else 'NOT ok: ' + ', '.join(r['codes'])} ({r.get('oracle', '?')})",
    ]
    return out


def lines(res: dict, short: bool = False) -> list[str]:
    """The section as markdown: one row per model, the three goals per row."""
    head = [
        "model (parameter bytes)",
        "verdict",
        "oracle",
        "loop alone",
        "verify",
        "ratio [range]",
        f"goal <= {TIME_MAX:g}x",
        "verify's extra peak per rank (x params)",
        f"goal <= {MEMORY_MAX_PARAMS:g}x + activations",
        "verify's traffic per step and rank: calls, bytes (x params)",
        "goal <= 4x + 64 KiB",
        "DDP's own gradient all-reduce per step",
    ]
    body = []
    for r in res["rows"]:
        ddp = r["traffic_per_rank"][0]
        mem = (
            "not measured (16.8K parameters: below resident-memory noise)"
            if "verify_extra_peak_bytes" not in r
            else ", ".join(_mb(x) for x in r["verify_extra_peak_bytes_per_rank"])
            + f" ({r['extra_over_params']:.1f}x)"
        )
        body.append(
            [
                f"{r['model']} ({_mb(r['param_bytes'])})",
                "ok" if r["verdict_ok"] else "NOT ok: " + ", ".join(r["codes"]),
                r.get("oracle", "?"),
                f"{r['alone_s']:.2f} s",
                f"{r['verify_s']:.2f} s",
                f"{r['ratio']:.2f}x [{r['ratio_range'][0]:.2f}, {r['ratio_range'][1]:.2f}]",
                _status(r.get("time_met")),
                mem,
                _status(r.get("memory_met"))
                + (f" ({_mb(r['memory_limit_bytes'])})" if "memory_limit_bytes" in r else ""),
                f"{r['calls_per_step']:.0f}, {_mb(r['bytes_per_step'])} ({r['bytes_over_params']:.2f}x)",
                _status(r.get("traffic_met")),
                f"{ddp['ddp_calls_per_step']:.0f} bucket(s), {_mb(ddp['ddp_bytes_per_step'])}",
            ]
        )
    out = md_table(head, body)
    if not short:
        out += [
            "",
            "verify's collectives per step and rank, by operation: "
            + "; ".join(
                f"{r['model']}: "
                + ", ".join(
                    f"{op} {c:.0f} call(s), {_mb(b)} in all"
                    for op, (c, b) in r["traffic_per_rank"][0]["per_op_per_step"].items()
                )
                for r in res["rows"]
            ),
        ]
    if not all(r.get("exact_peak", True) for r in res["rows"]):
        out += [
            "",
            "peaks sampled every 2 ms (the kernel's high-water mark could not be reset here): a short spike "
            "may be missed",
        ]
    return out


def _status(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, one launch: checks the script, measures nothing for real",
    )
    p.add_argument(
        "--repeats", type=int, help="interleaved timing pairs per model (default 3; 1 with --quick)"
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    res = measure(args.quick, args.repeats)
    if "not_available" in res:
        print(f"not available: {res['not_available']}")
        return res
    print("\n".join(lines(res)))
    print(f"\n{res['note']}\n")
    for key, g in res["goals"].items():
        print(f"  {_status(g['met']):<13} {key:<22} {g['measured']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    import verify_ranks  # the ranks import rank_main from the module by name, never from __main__

    verify_ranks.main()
