"""Kernel memory, per notebook: what a learner's kernel takes at its peak during Run All, and what it still
holds afterwards, an open tab's cost (issue 29: a Binder session has about 2 GB).

``make bench``'s section 11. Every notebook in notebooks/ (the course map, the lessons, report.ipynb) runs
in a fresh kernel of this environment, as JupyterLab starts one (``%matplotlib inline``, the notebook's
folder as working directory, ``OMP_NUM_THREADS`` as the widget section sets it), every code cell executed as
committed, in order, as Run All does (an error is recorded and the next cell still runs). Then, from /proc:

- **peak**: the kernel process's peak resident memory (VmHWM, exact), judged against the goal;
- **held**: its resident memory once Run All is done (VmRSS), with the private part (RssAnon: file pages,
  torch's libraries among them, are shared by every kernel of the session and counted in each);
- **processes**: processes the kernel started (lesson 8's ranks), their resident memory summed with the
  kernel's at the same moment, sampled every 20 ms (_kernel_memory_proc.py); reported beside the goal.

Beside them, never judged, the floor: a kernel that imports torch, draws one figure and builds one optimizer,
what every lesson that trains pays before its own work.

    python benchmarks/bench.py --only kernel_memory --merge   # this section into benchmarks/results/latest.*
    python benchmarks/kernel_memory.py 01 09                  # print the table for some notebooks only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, wherever it is loaded from

from _kernel_memory_proc import MIB, Tree, status  # noqa: E402
from _render import md_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAME = "kernel_memory"
TITLE = "11. Kernel memory after Run All"
GOAL_MIB = 400.0  # issue 29: a few open lessons must fit a Binder session's ~2 GB
LIMIT = GOAL_MIB
GOALS = {
    "kernel_memory": f"every notebook's kernel, Run All in a fresh kernel: peak resident memory <= "
    f"{GOAL_MIB:.0f} MiB (a Binder session has about 2 GB)"
}
CELL_TIMEOUT_S = 600  # as `make notebooks`: a cell that takes longer is an error, never waited on
QUICK_MIB = 64  # --quick's notebook allocates this much, then frees it: peak above held by as much


# What every lesson that trains pays before its own work: torch, the inline backend's figure, and one
# optimizer (torch.optim imports torch._dynamo on its first use). Measured beside the notebooks, never judged.
FLOOR_CELLS = (
    "%matplotlib inline\nimport ipywidgets\nimport matplotlib.pyplot as plt\nimport torch",
    "opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)",
    "plt.plot([0, 1])\nplt.show()",
)
QUICK_CELLS = (f"x = bytearray(b'x') * ({QUICK_MIB} * 2**20)  # written, so resident", "del x")


def _scratch_notebook(path: Path, cells: tuple[str, ...]) -> Path:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": s,
            }
            for i, s in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def run(quick: bool = False) -> dict:
    """The section as bench.py runs it (the face every section has): ``measure`` on every notebook."""
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as err:
        return {"not_available": f"nbclient / nbformat is not installed ({err})"}
    with tempfile.TemporaryDirectory() as scratch:  # --quick's notebook and the floor's live here
        if quick:  # a two-cell notebook that allocates and frees QUICK_MIB: a real notebook takes seconds
            return measure([_scratch_notebook(Path(scratch) / "quick_check.ipynb", QUICK_CELLS)], quick=True)
        floor = _scratch_notebook(Path(scratch) / "floor.ipynb", FLOOR_CELLS)
        return measure(sorted((ROOT / "notebooks").glob("*.ipynb")), floor=floor)


def run_all(path: Path, *, threads: int = 1) -> dict:
    """Run All of ``path`` in a fresh kernel; its memory from /proc (bytes) and the cells that raised."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("MPLBACKEND", None)  # the kernel's default, the inline backend, as in JupyterLab
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",  # this environment's kernel, as nbval --nbval-current-env
        allow_errors=True,  # a cell's error is recorded; Run All's later cells still count
        resources={"metadata": {"path": str(path.parent)}},
    )
    # the kernel's own log (its start-up notices) goes to a file, shown only if it fails to start
    log = tempfile.NamedTemporaryFile("w", prefix="kernel-memory-", suffix=".log", delete=False)
    try:
        with client.setup_kernel(env=env, stdout=log, stderr=log):
            return _measured(client, nb)
    except Exception as err:
        log.close()
        raise RuntimeError(f"{err} (the kernel's log: {Path(log.name).read_text()[-300:]!r})") from err
    finally:
        log.close()
        Path(log.name).unlink(missing_ok=True)


def _measured(client: Any, nb: Any) -> dict:
    """Run All in the client's started kernel, its process tree sampled meanwhile; read before shutdown."""
    pid = client.km.provisioner.pid
    start = status(pid)
    t0 = time.perf_counter()
    with Tree(pid) as tree:
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    wall = time.perf_counter() - t0
    end = status(pid)
    errors = [
        f"cell {i}: {o['ename']}: {o['evalue']}"[:160]
        for i, c in enumerate(nb.cells)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    return {
        "start": start["rss"],
        "peak": end["peak"],
        "held": end["rss"],
        "held_private": end["anon"],
        "processes": len(tree.children),
        "with_processes_peak": max(tree.peak, end["peak"]) if tree.children else end["peak"],
        "processes_peak": tree.children_peak,
        "samples": tree.samples,
        "wall_s": wall,
        "errors": errors,
    }


def _row(path: Path, threads: int) -> dict:
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)
    try:
        m = run_all(path, threads=threads)
    except Exception as err:  # no kernel, no figure: said, never a number
        return {"notebook": str(rel), "not_available": f"{type(err).__name__}: {err}"[:300]}
    mib = {f"{k}_mib": m[k] / MIB for k in ("start", "peak", "held", "held_private", "with_processes_peak")}
    return {
        "notebook": str(rel),
        **mib,
        "processes": m["processes"],
        "processes_peak_mib": m["processes_peak"] / MIB,
        "wall_s": m["wall_s"],
        "errors": m["errors"],
        "met": m["peak"] / MIB <= GOAL_MIB,
    }


def _routes(rows: list[dict]) -> list[dict]:
    """The memory a route's kernels hold together once each has run: what a learner with those tabs open
    costs (VmRSS summed, so shared file pages count once per kernel, as the issue's figures did)."""
    from accumlib_course.lessons.course import CLOSING, ROUTES, by_number

    held = {Path(r["notebook"]).name: r for r in rows if "held_mib" in r}
    found = []
    for name, numbers in ROUTES.items():
        files = [by_number(n).file for n in numbers]
        if name in CLOSING:  # the course map opens it, and its closing notebook is read in the last minutes
            files = ["00_start_here.ipynb", *files, CLOSING[name].split("#")[0]]
        if all(f in held for f in files):
            found.append(
                {
                    "route": name,
                    "notebooks": [f[:2] for f in files],
                    "held_mib": sum(held[f]["held_mib"] for f in files),
                    "held_private_mib": sum(held[f]["held_private_mib"] for f in files),
                }
            )
    return found


def measure(
    paths: list[Path],
    *,
    quick: bool = False,
    threads: int | None = None,
    floor: Path | None = None,
    log: Any = print,
) -> dict:
    """Every notebook of ``paths`` run in its own fresh kernel, judged against the goal; ``floor``, a notebook
    measured the same way for reference, never judged."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()  # bench.py --threads sets it (default 1)
    rows = []
    for path in paths:
        rows.append(row := _row(path, threads))
        log("    " + _line(row), flush=True)
    measured_rows = [r for r in rows if "peak_mib" in r]
    missed = [r for r in measured_rows if not r["met"]]
    unavailable = [r for r in rows if "not_available" in r]
    if measured_rows:
        worst = max(measured_rows, key=lambda r: r["peak_mib"])
        measured = (
            f"{len(measured_rows) - len(missed)} of {len(rows)} met; largest {Path(worst['notebook']).stem}: "
            f"peak {worst['peak_mib']:.0f} MiB, held {worst['held_mib']:.0f} MiB"
        )
        spawning = [r for r in measured_rows if r["processes"]]
        if spawning:
            measured += "; with the processes they start: " + ", ".join(
                f"{Path(r['notebook']).stem[:2]} {r['with_processes_peak_mib']:.0f} MiB" for r in spawning
            )
    else:
        measured = "no notebook could be measured"
    routes = [] if quick else _routes(rows)
    reference = None
    if floor is not None:
        reference = _row(floor, threads)
        log("    " + _line(reference) + "  (reference: torch, a figure, one optimizer)", flush=True)
        if "peak_mib" in reference:
            measured += f"; the floor (torch, a figure, one optimizer): {reference['peak_mib']:.0f} MiB"
    goal = {
        "measured": measured,
        "met": (not missed and not unavailable) if measured_rows else None,
        "missed": [f"{r['notebook']}: peak {r['peak_mib']:.0f} MiB" for r in missed]
        + [f"{r['notebook']}: not available ({r['not_available']})" for r in unavailable],
    }
    failed = [r["notebook"] for r in measured_rows if r["errors"]]
    if failed:
        goal["note"] = f"cells raised during Run All in {failed}: their memory is of a failing run"
    note = (
        "a fresh kernel per notebook (this environment's python3, %matplotlib inline, "
        f"OMP_NUM_THREADS={threads}), every code cell run in order as committed; peak = the kernel's VmHWM, "
        "held = its VmRSS after Run All (private = RssAnon; the rest, file pages such as torch's libraries, "
        "is shared by a session's kernels); processes the kernel starts are not in its peak: their resident "
        "memory is summed with the kernel's at the same moment, sampled every 20 ms, in 'with its processes'"
    )
    if quick:
        note += (
            f"; --quick runs a two-cell notebook that allocates and frees {QUICK_MIB} MiB, so the goal is "
        )
        note += "not measured for real"
        goal["met"] = None
    return {
        "rows": rows,
        "routes": routes,
        "floor": reference,
        "goals": {"kernel_memory": goal},
        "note": note,
    }


def _line(row: dict) -> str:
    if "not_available" in row:
        return f"{row['notebook']:<44} not available: {row['not_available']}"
    procs = (
        f"  {row['processes']} processes: {row['with_processes_peak_mib']:.0f} MiB with them"
        if row["processes"]
        else ""
    )
    return (
        f"{row['notebook']:<44} peak {row['peak_mib']:6.0f} MiB  held {row['held_mib']:6.0f} MiB "
        f"(private {row['held_private_mib']:4.0f})  {row['wall_s']:5.1f} s  "
        f"{'met' if row['met'] else 'MISSED'}"
        + procs
        + (f"  ERRORS: {row['errors'][0]}" if row["errors"] else "")
    )


def lines(res: dict, short: bool = False) -> list[str]:
    """The per-notebook table (MiB), then what a route's open tabs hold together."""
    f = lambda x: f"{x:.0f}"  # noqa: E731
    rows = [r for r in res["rows"] if "peak_mib" in r]
    out = md_table(
        [
            "notebook",
            "peak MiB",
            "held after Run All MiB",
            "of it private MiB",
            "processes started",
            "peak with its processes MiB",
            "Run All s",
            f"goal peak <= {GOAL_MIB:.0f} MiB",
        ],
        [
            [
                Path(r["notebook"]).stem,
                f(r["peak_mib"]),
                f(r["held_mib"]),
                f(r["held_private_mib"]),
                r["processes"],
                f(r["with_processes_peak_mib"]) if r["processes"] else "",
                f"{r['wall_s']:.1f}",
                ("met" if r["met"] else "**MISSED**")
                + (f" (errors: {'; '.join(r['errors'])[:80]})" if r["errors"] else ""),
            ]
            for r in rows
        ],
    )
    floor = res.get("floor") or {}
    if "peak_mib" in floor:
        out += [
            "",
            "The floor, for reference: a kernel that imports torch, draws one figure and builds one "
            "optimizer (torch.optim imports torch._dynamo on first use) peaks at "
            f"{floor['peak_mib']:.0f} MiB and holds {floor['held_mib']:.0f} MiB "
            f"({floor['held_private_mib']:.0f} MiB private).",
        ]
    for r in res.get("routes", []):
        out += [
            "",
            f"After Run All, the {r['route']} route's {len(r['notebooks'])} kernels "
            f"({', '.join(r['notebooks'])}) hold {r['held_mib']:.0f} MiB together "
            f"({r['held_private_mib']:.0f} MiB of it private).",
        ]
    for r in res["rows"]:
        if "not_available" in r:
            out += ["", f"not available: {r['notebook']}: {r['not_available']}"]
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "notebooks", nargs="*", help="notebook name prefixes (default: every notebook), e.g. 01 report"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="the kernels' OMP_NUM_THREADS (default 1, as bench.py)"
    )
    args = p.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.notebooks:
        paths = [x for x in paths if any(x.name.startswith(n) for n in args.notebooks)]
        if not paths:
            p.error(f"notebooks must name prefixes of notebooks/*.ipynb (got {' '.join(args.notebooks)})")
    res = measure(paths, threads=args.threads)
    print("\n".join(lines(res)))
    return res


if __name__ == "__main__":
    main()
