"""What accumulation saves and costs, measured side by side: ``make bench``.

One module per section, each with the same face: ``NAME`` (its file name, and its key in latest.json),
``TITLE``, ``GOALS`` (goal key -> the target, as the issue states it), ``LIMIT`` (the figure's goal
line, if any), ``run(quick: bool = False) -> dict`` (its knobs are module constants, or follow
``quick``) and ``lines(result, short) -> list[str]`` (its markdown):

    memory.py          activation bytes per micro-batch for k = 1..16, as a ratio to the full batch
    overhead.py        every reference loop against a hand-written twin, interleaved, median time ratio
                       (a registered loop without a twin is reported as not measured)
    price.py           one effective batch as k micro-batches against one large batch, k = 1..16
    verify.py          accumlib.verify on correct and buggy loops against the loop alone
    notebook_times.py  wall time of every notebook under nbval, and of the suite
    widgets.py         every control of every lesson widget: change -> recomputed figure, in a real
                       kernel (_widget_discovery.py finds them, _widget_kernel.py drives the kernel,
                       _widget_driver.py runs inside it)
    allreduce.py       all-reduce calls and bytes per optimizer step under DDP, with and without no_sync
    verify_scale.py    verify's extra peak memory and time on a 39.4M-parameter MLP (its runs in
                       _verify_scale_runs.py; _peak.py: peak memory)
    verify_trainer.py  accumlib.hf.verify_trainer against trainer.train() alone: a tiny Llama, 25 steps
                       of k = 4
    verify_ranks.py    verify(ranks='all') on 2 gloo ranks against the same DDP loop alone: time, extra
                       peak memory per rank, and verify's collectives per optimizer step, counted (an
                       11.3M MLP and lm-tokens; _ranks_worker.py runs on each rank)
    run_cost.py        a loop under accumlib.watch() (the engine of accumlib run) against the loop alone:
                       time, and the engine's extra bytes against the parameters'
    run_nanogpt.py     accumlib run on nanoGPT's own train.py (tiny config, 20 iterations) against the
                       script alone, 1 process and 2 gloo ranks (read from a clone: ACCUMLIB_NANOGPT_SRC)
    kernel_memory.py   every notebook's Run All in a fresh kernel: its private memory (USS) after, its peak
                       and held resident memory (_kernel_memory_proc.py reads /proc, the kernel's processes
                       summed with it); the 90-minute route in order, one kernel at a time, with a Jupyter
                       server's footprint

Shared, private (``_``): ``_timing.py`` (interleaved runs, ratios, the machine and its load) and
``_render.py`` (tables, the goals table, the README's Performance section, the figure). To add a
section, write ``benchmarks/<name>.py`` with that face (``NAME = "<name>"``) and add its name to
``SECTION_MODULES`` below; a module whose name starts with ``_`` is a helper, never a section.

Figures, not tests: every goal is stated as met or MISSED, never hidden, and a section
whose pieces are missing says "not available: <reason>" instead of printing a number.
Writes ``latest.json``, ``latest.md`` (the README's Performance section) and ``latest.png``.

    python benchmarks/bench.py                    # the full run (under 10 minutes on 2 cores)
    python benchmarks/bench.py --quick --out /tmp/b   # tiny sizes: keeps the script working
    python benchmarks/bench.py --only memory,price
    # one section, the others kept from the last latest.json
    python benchmarks/bench.py --only widgets --merge
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the section modules, however this file is loaded

import torch  # noqa: E402
from _render import figure, goals_table, markdown, section_lines  # noqa: E402
from _timing import BUSY_CORES, ROOT, cpu_now, machine, other_cores  # noqa: E402

import accumlib  # noqa: E402, F401  (imported before any section, so a broken install fails here)

# The sections, in the order of the report: the module file of each.
SECTION_MODULES = (
    "memory",
    "overhead",
    "price",
    "verify",
    "notebook_times",
    "widgets",
    "allreduce",
    "verify_scale",
    "verify_trainer",
    "verify_ranks",
    "kernel_memory",
    "run_cost",
    "run_nanogpt",
)


def _section(name: str) -> Any:
    """A section module, held to the face every section has: its NAME is its file name."""
    module = importlib.import_module(name)
    if module.NAME != name:
        raise ValueError(
            f"benchmarks/{name}.py must set NAME = {name!r}, its file name (got {module.NAME!r})"
        )
    return module


MODULES: dict[str, Any] = {name: _section(name) for name in SECTION_MODULES}
SECTIONS = tuple(MODULES)
GOALS = {key: text for m in MODULES.values() for key, text in m.GOALS.items()}
RUNNERS: dict[str, Callable[..., dict]] = {name: m.run for name, m in MODULES.items()}
widgets = MODULES["widgets"]
verify_scale = MODULES["verify_scale"]


def _carry_over(report: dict, previous: Path) -> None:
    """``--merge``: the sections this run did not measure, kept from ``previous`` with the date and commit
    they were measured at."""
    if not previous.exists():
        return
    old = json.loads(previous.read_text())
    if old.get("quick") != report["quick"]:
        return  # never mix --quick figures with real ones
    carried = {}
    for name, res in old.get("sections", {}).items():
        if name in report["sections"] or name not in RUNNERS:
            continue
        report["sections"][name] = res
        report["section_wall_s"][name] = old.get("section_wall_s", {}).get(name)
        report["other_cores"][name] = old.get("other_cores", {}).get(name)
        carried[name] = old.get("carried", {}).get(name) or {
            k: old["machine"].get(k) for k in ("date_utc", "commit")
        }
    report["sections"] = {n: report["sections"][n] for n in SECTIONS if n in report["sections"]}
    report["carried"] = carried


def run(only: list[str], quick: bool, out: Path, threads: int, merge: bool = False) -> dict:
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine(threads),
        "quick": quick,
        "sections": {},
        "section_wall_s": {},
    }
    m = report["machine"]
    print(f"accumlib benchmarks{' (--quick: tiny sizes, figures only)' if quick else ''}")
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, torch.set_num_threads({threads}), "
        f"CUDA: {m['cuda'] or 'none'}, load average {m['load_average_start']:.1f}"
        if m["load_average_start"] is not None
        else "",
        flush=True,
    )
    start = time.perf_counter()
    report["other_cores"] = {}  # per section: cores other processes kept busy meanwhile
    for name in only:
        print(f"\n== {name}", flush=True)
        t0 = time.perf_counter()
        cpu0 = cpu_now()
        torch.manual_seed(0)
        try:
            res = RUNNERS[name](quick=quick)
        except Exception as err:  # a section that breaks says why; the other sections still run
            traceback.print_exc()
            res = {"not_available": f"the section raised {type(err).__name__}: {err}"}
        report["sections"][name] = res
        report["section_wall_s"][name] = time.perf_counter() - t0
        report["other_cores"][name] = busy = other_cores(cpu0, cpu_now())
        print("\n".join(section_lines(name, res, MODULES)), flush=True)
        print(
            f"({report['section_wall_s'][name]:.1f} s"
            + ("" if busy is None else f"; other processes kept {busy:.2f} cores busy meanwhile")
            + ")",
            flush=True,
        )
    report["wall_s"] = time.perf_counter() - start
    if merge:
        _carry_over(report, out / "latest.json")
    report["goals"] = goals_table(report["sections"], MODULES)
    m["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    busy = {k: v for k, v in report["other_cores"].items() if v is not None}
    if busy and max(busy.values()) > BUSY_CORES:
        worst = max(busy, key=busy.get)
        report["busy_warning"] = (
            f"other processes kept up to {busy[worst]:.1f} of {m['cores']} cores busy (during '{worst}'; "
            f"{', '.join(f'{k} {v:.1f}' for k, v in busy.items())}): every time and time ratio here is "
            "contaminated; re-run `make bench` on a quiet machine"
        )
    print("\n== goals")
    for g in report["goals"]:
        print(f"  {g['status']:<13} {g['goal']:<15} {g['measured']}")
        for miss in g.get("missed", []):
            print(f"  {'':<13} {'':<15}   missed: {miss}")
    if report.get("busy_warning"):
        print(f"\nWARNING: {report['busy_warning']}")
    (out / "latest.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "latest.md").write_text(markdown(report, MODULES))
    figure(report, out / "latest.png", MODULES)
    print(
        f"\nwrote {out / 'latest.json'}, {out / 'latest.md'}, {out / 'latest.png'}  "
        f"({report['wall_s']:.0f} s in all)"
    )
    return report


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and one repeat: checks the script, measures nothing for real",
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections (default all): {','.join(SECTIONS)}",
    )
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results", help="where latest.json/.md/.png go"
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the sections not run from the existing latest.json in --out (each with its own date "
        "and commit)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads for the timed sections (default 1: stable on 2 cores)",
    )
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"--only must name sections from {','.join(SECTIONS)} (got {','.join(unknown)})")
    if set(only) != set(SECTIONS) and not args.merge and (args.out / "latest.json").exists():
        # latest.md holds every section, each with its date and commit: one section run must not drop the rest
        p.error(
            f"--only {','.join(only)} without --merge would replace {args.out / 'latest.md'} (every "
            "section's figures) with these sections alone: add --merge, as `make bench ONLY=...` does, or "
            "name an empty --out"
        )
    return run(only, args.quick, args.out, args.threads, merge=args.merge)


if __name__ == "__main__":
    main()
