"""Kernel memory, per notebook: what a learner's kernel holds once Run All is done, its private memory
judged against the goal, and what the 90-minute route's kernels and a Jupyter server take together (issue 46,
restating issue 29's 400 MiB peak: a kernel that builds one optimizer under torch 2.13 already peaks at 388).

``make bench``'s section 11. Every notebook in notebooks/ (the course map, the lessons, report.ipynb) runs
in a fresh kernel of this environment, as JupyterLab starts one (``%matplotlib inline``, the notebook's
folder as working directory, ``OMP_NUM_THREADS`` as the widget section sets it), every code cell executed as
committed, in order, as Run All does (an error is recorded and the next cell still runs). Then, from /proc:

- **private**: once Run All is done, the kernel's private memory (USS: Private_Clean + Private_Dirty of
  /proc/<pid>/smaps_rollup) plus that of its live descendants, judged against the goal (every notebook);
- **peak**: the kernel process's peak resident memory (VmHWM, exact), beside it;
- **held**: its resident memory once Run All is done (VmRSS), with RssAnon;
- **processes**: processes the kernel started (lesson 8's ranks), their resident memory summed with the
  kernel's at the same moment, sampled every 20 ms (_kernel_memory_proc.py); reported beside the goal.

The route: the course map and the 90-minute route's lessons, run in route order, each kernel shut down
before the next starts (JupyterLab shuts a kernel down when its tab closes: binder/overrides.json), the
bench's own descendants sampled every 20 ms throughout: the most resident memory its live kernels (and their
processes) hold at once, plus the footprint of a JupyterLab server of this environment (started here,
/lab, its settings and a kernel session opened and deleted through its REST API; its peak resident memory),
judged against a Binder session's 2 GB. Resident sums count the libraries' file pages once per process: an
upper bound of what the session's cgroup is charged for them.

Beside them, never judged, the floor: a kernel that imports torch, draws one figure and builds one optimizer,
what every lesson that trains pays before its own work.

    python benchmarks/bench.py --only kernel_memory --merge   # this section into benchmarks/results/latest.*
    python benchmarks/kernel_memory.py 01 09                  # print the table for some notebooks only
    python benchmarks/kernel_memory.py 00 --route             # the course map, then the route with a server
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, wherever it is loaded from

from _kernel_memory_proc import MIB, Tree, children, private, private_parts, status, tree_private  # noqa: E402
from _render import md_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAME = "kernel_memory"
TITLE = "11. Kernel memory after Run All"
GOAL_MIB = 300.0  # issue 46: private memory of a kernel after Run All (restated from a 400 MiB peak)
SESSION_MIB = 2048.0  # a Binder session's 2 GB: mybinder.org's mem_limit 2G, which JupyterHub reads as 2 GiB
ROUTE = "90-minute workshop"  # the route whose kernels must fit one session (course.py's ROUTES)
LIMIT = GOAL_MIB
GOALS = {
    "kernel_memory": f"every notebook's kernel, Run All in a fresh kernel: its private memory after Run All "
    f"(USS, with its live processes) <= {GOAL_MIB:.0f} MiB",
    "kernel_memory_route": f"the {ROUTE} route's notebooks in order, each kernel shut down before the next "
    f"opens (as on tab close): its live kernels' most resident memory at once + a Jupyter server's "
    f"<= {SESSION_MIB / 1024:.0f} GB (a Binder session)",
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
    """The section as bench.py runs it (the face every section has): ``measure`` on every notebook, then the
    route."""
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as err:
        return {"not_available": f"nbclient / nbformat is not installed ({err})"}
    with tempfile.TemporaryDirectory() as scratch:  # --quick's notebook and the floor's live here
        if quick:  # a two-cell notebook that allocates and frees QUICK_MIB: a real notebook takes seconds
            nb = _scratch_notebook(Path(scratch) / "quick_check.ipynb", QUICK_CELLS)
            return measure([nb], quick=True, route=("quick", [nb, nb]))
        floor = _scratch_notebook(Path(scratch) / "floor.ipynb", FLOOR_CELLS)
        return measure(sorted((ROOT / "notebooks").glob("*.ipynb")), floor=floor, route=route_notebooks())


def route_notebooks(name: str = ROUTE) -> tuple[str, list[Path]]:
    """A route's notebooks in the order a learner opens them: the course map, then its lessons."""
    from accumlib_course.lessons.course import ROUTES, by_number

    files = ["00_start_here.ipynb", *(by_number(n).file for n in ROUTES[name])]
    return name, [ROOT / "notebooks" / f for f in files]


def run_all(path: Path, *, threads: int = 1) -> dict:
    """Run All of ``path`` in a fresh kernel; its memory from /proc (bytes) and the cells that raised. The
    kernel is shut down, and its process gone, when this returns."""
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
            found = _measured(client, nb)
        _gone(found["pid"])
        return found
    except Exception as err:
        log.close()
        raise RuntimeError(f"{err} (the kernel's log: {Path(log.name).read_text()[-300:]!r})") from err
    finally:
        log.close()
        Path(log.name).unlink(missing_ok=True)


def _gone(pid: int, wait_s: float = 10.0) -> None:
    """Wait until process ``pid`` has exited (a tab closed: its kernel shut down), or say it has not."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return  # exited, not yet reaped: it holds no memory
        except (OSError, IndexError):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the kernel (pid {pid}) still runs {wait_s:.0f} s after its shutdown")


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
    clean, dirty = private_parts(pid)
    with_live, live = tree_private(pid)
    errors = [
        f"cell {i}: {o['ename']}: {o['evalue']}"[:160]
        for i, c in enumerate(nb.cells)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    return {
        "pid": pid,
        "start": start["rss"],
        "peak": end["peak"],
        "held": end["rss"],
        "held_private": end["anon"],
        "private": with_live,
        "kernel_private": clean + dirty,
        "kernel_private_clean": clean,  # file pages no other process maps now: what else runs moves them
        "live_processes": live,
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
    keys = ("start", "peak", "held", "held_private", "private", "kernel_private", "kernel_private_clean")
    keys += ("with_processes_peak",)
    return {
        "notebook": str(rel),
        **{f"{k}_mib": m[k] / MIB for k in keys},
        "live_processes": m["live_processes"],
        "processes": m["processes"],
        "processes_peak_mib": m["processes_peak"] / MIB,
        "wall_s": m["wall_s"],
        "errors": m["errors"],
        "met": m["private"] / MIB <= GOAL_MIB,
    }


def _open_tabs(rows: list[dict]) -> list[dict]:
    """What a route's kernels would hold together if every tab stayed open after Run All (no shutdown on
    close): their resident and private memory summed, for reference beside the route's measured figure."""
    from accumlib_course.lessons.course import ROUTES

    held = {Path(r["notebook"]).name: r for r in rows if "held_mib" in r}
    found = []
    for name in ROUTES:
        files = [p.name for p in route_notebooks(name)[1]]
        if all(f in held for f in files):
            found.append(
                {
                    "route": name,
                    "notebooks": [f[:2] for f in files],
                    "held_mib": sum(held[f]["held_mib"] for f in files),
                    "private_mib": sum(held[f]["private_mib"] for f in files),
                }
            )
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_footprint(timeout_s: float = 60.0) -> dict:
    """A JupyterLab server of this environment, started here as a learner's session starts one: its page
    /lab and its settings served, a notebook's session (kernel) opened and deleted through its REST API, as
    a tab opened and closed; then its own peak resident memory (VmHWM, its kernel not counted) and USS."""
    port, token = _free_port(), secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as runtime:
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1"]
        cmd += [f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}"]
        cmd += ["--allow-root"] if os.geteuid() == 0 else []  # a container's root (Binder's user is not)
        env = os.environ | {"JUPYTER_RUNTIME_DIR": runtime, "OMP_NUM_THREADS": "1"}
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"

        def call(path: str, method: str = "GET", body: dict | None = None) -> bytes:
            req = urllib.request.Request(
                base + path,
                method=method,
                data=None if body is None else json.dumps(body).encode(),
                headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.read()

        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    call("/api/status")
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"jupyter lab did not start (exit code {server.poll()})") from None
                    time.sleep(0.2)
            for path in ("/lab", "/lab/api/settings", "/api/kernelspecs", "/api/contents/notebooks"):
                call(path)
            body = {"path": "notebooks/00_start_here.ipynb", "type": "notebook", "name": "", "kernel": {}}
            session = json.loads(call("/api/sessions", "POST", body | {"kernel": {"name": "python3"}}))
            for _ in range(int(timeout_s / 0.2)):  # until its kernel has started and answered
                if json.loads(call(f"/api/kernels/{session['kernel']['id']}"))["execution_state"] == "idle":
                    break
                time.sleep(0.2)
            call(f"/api/sessions/{session['id']}", "DELETE")
            s = status(server.pid)
            return {
                "peak_mib": s["peak"] / MIB,
                "held_mib": s["rss"] / MIB,
                "private_mib": private(server.pid) / MIB,
                "how": "a JupyterLab server of this environment started here: /lab, its settings, the "
                "kernelspecs and notebooks/ listed, a session of 00_start_here.ipynb opened and deleted "
                "through its REST API; its own peak resident memory (VmHWM), its kernel not counted",
            }
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def route_memory(name: str, paths: list[Path], threads: int, log: Any = print) -> dict:
    """The route's notebooks in order, each Run All in its own kernel, shut down before the next starts; the
    bench's own descendants (the kernels and what they start) sampled throughout: their most resident memory
    at once, and the most kernels alive at once (1 when each is shut down before the next opens)."""
    rows = []
    # this process's own memory is not the route's (children_peak leaves it out), nor are the children it
    # had before the route (an earlier section's multiprocessing resource tracker)
    with Tree(os.getpid(), exclude=frozenset(children(os.getpid()))) as tree:
        for path in paths:
            rows.append(row := _row(path, threads))
            log("    route: " + _line(row), flush=True)
    missing = [r for r in rows if "not_available" in r]
    found: dict[str, Any] = {
        "route": name,
        "notebooks": [Path(r["notebook"]).name[:2] if name != "quick" else r["notebook"] for r in rows],
        # sampled every 20 ms, the sum can miss a short spike; a kernel's own VmHWM cannot, so the route's
        # figure is never below its largest kernel's exact peak (with what that kernel started)
        "kernels_peak_mib": max(
            [tree.children_peak / MIB]
            + [r["with_processes_peak_mib"] for r in rows if "not_available" not in r]
        ),
        "most_kernels_alive": tree.most_children,
        "samples": tree.samples,
        "errors": [f"{r['notebook']}: {e}" for r in rows for e in r.get("errors", [])],
    }
    if missing:
        found["not_available"] = "; ".join(f"{r['notebook']}: {r['not_available']}" for r in missing)
    try:
        found["server"] = server_footprint()
    except Exception as err:  # no server, no sum: said, never a number
        found["not_available"] = f"the Jupyter server could not be measured: {type(err).__name__}: {err}"[
            :300
        ]
    if "not_available" not in found:
        found["total_mib"] = found["kernels_peak_mib"] + found["server"]["peak_mib"]
        found["met"] = found["total_mib"] <= SESSION_MIB
    return found


def measure(
    paths: list[Path],
    *,
    quick: bool = False,
    threads: int | None = None,
    floor: Path | None = None,
    route: tuple[str, list[Path]] | None = None,
    log: Any = print,
) -> dict:
    """Every notebook of ``paths`` run in its own fresh kernel, judged against the goal; ``floor``, a notebook
    measured the same way for reference, never judged; ``route``, a route's name and notebooks, run in order
    and judged with a Jupyter server's footprint against a session's memory."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()  # bench.py --threads sets it (default 1)
    rows = []
    for path in paths:
        rows.append(row := _row(path, threads))
        log("    " + _line(row), flush=True)
    measured_rows = [r for r in rows if "private_mib" in r]
    missed = [r for r in measured_rows if not r["met"]]
    unavailable = [r for r in rows if "not_available" in r]
    if measured_rows:
        worst = max(measured_rows, key=lambda r: r["private_mib"])
        highest = max(measured_rows, key=lambda r: r["peak_mib"])
        measured = (
            f"{len(measured_rows) - len(missed)} of {len(rows)} met; largest {Path(worst['notebook']).stem}: "
            f"{worst['private_mib']:.0f} MiB private after Run All; highest peak "
            f"{Path(highest['notebook']).stem[:2]}: {highest['peak_mib']:.0f} MiB resident"
        )
        spawning = [r for r in measured_rows if r["processes"]]
        if spawning:
            measured += "; with the processes they start: " + ", ".join(
                f"{Path(r['notebook']).stem[:2]} {r['with_processes_peak_mib']:.0f} MiB" for r in spawning
            )
    else:
        measured = "no notebook could be measured"
    reference = None
    if floor is not None:
        reference = _row(floor, threads)
        log("    " + _line(reference) + "  (reference: torch, a figure, one optimizer)", flush=True)
        if "peak_mib" in reference:
            measured += (
                f"; the floor (torch, a figure, one optimizer): {reference['private_mib']:.0f} MiB private, "
                f"peak {reference['peak_mib']:.0f} MiB"
            )
    goal = {
        "measured": measured,
        "met": (not missed and not unavailable) if measured_rows else None,
        "missed": [f"{r['notebook']}: {r['private_mib']:.0f} MiB private" for r in missed]
        + [f"{r['notebook']}: not available ({r['not_available']})" for r in unavailable],
    }
    failed = [r["notebook"] for r in measured_rows if r["errors"]]
    if failed:
        goal["note"] = f"cells raised during Run All in {failed}: their memory is of a failing run"
    walk = None if route is None else route_memory(*route, threads=threads, log=log)
    goals = {"kernel_memory": goal, "kernel_memory_route": _route_goal(walk)}
    note = (
        "a fresh kernel per notebook (this environment's python3, %matplotlib inline, "
        f"OMP_NUM_THREADS={threads}), every code cell run in order as committed; private = the kernel's "
        "USS after Run All (Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup), with its live "
        "processes' (its clean file pages, a library's code no other process maps at that moment, move to "
        "shared when one does, as this bench's own torch does); peak = the kernel's VmHWM; held = its VmRSS "
        "after Run All (RssAnon beside it); processes the kernel starts are not in its peak: their resident "
        "memory is summed with the kernel's at the same moment, sampled every 20 ms, in 'with its processes'"
    )
    if quick:
        note += (
            f"; --quick runs a two-cell notebook that allocates and frees {QUICK_MIB} MiB (twice as its "
            "route), so no goal is measured for real"
        )
        for g in goals.values():
            g["met"] = None
    return {
        "rows": rows,
        "route": walk,
        "open_tabs": [] if quick else _open_tabs(rows),
        "floor": reference,
        "goals": goals,
        "note": note,
    }


def _route_goal(walk: dict | None) -> dict:
    if walk is None:
        return {"measured": "no route measured", "met": None}
    if "not_available" in walk:
        return {"measured": f"not available: {walk['not_available']}", "met": None}
    measured = (
        f"{walk['total_mib']:.0f} MiB ({', '.join(walk['notebooks'])} in order: kernels "
        f"{walk['kernels_peak_mib']:.0f} MiB at most, {walk['most_kernels_alive']} alive at once; the "
        f"Jupyter server {walk['server']['peak_mib']:.0f} MiB) of {SESSION_MIB:.0f} MiB"
    )
    goal: dict[str, Any] = {"measured": measured, "met": walk["met"] and walk["most_kernels_alive"] <= 1}
    if walk["most_kernels_alive"] > 1:
        goal["missed"] = [f"{walk['most_kernels_alive']} kernels alive at once: one was not shut down"]
    if walk["errors"]:
        goal["note"] = f"cells raised during the route: {walk['errors'][:3]}"
    return goal


def _line(row: dict) -> str:
    if "not_available" in row:
        return f"{row['notebook']:<44} not available: {row['not_available']}"
    procs = (
        f"  {row['processes']} processes: {row['with_processes_peak_mib']:.0f} MiB with them"
        if row["processes"]
        else ""
    )
    return (
        f"{row['notebook']:<44} private {row['private_mib']:4.0f} MiB  peak {row['peak_mib']:6.0f} MiB  "
        f"held {row['held_mib']:6.0f} MiB  {row['wall_s']:5.1f} s  "
        f"{'met' if row['met'] else 'MISSED'}"
        + procs
        + (f"  ERRORS: {row['errors'][0]}" if row["errors"] else "")
    )


def lines(res: dict, short: bool = False) -> list[str]:
    """The per-notebook table (MiB), then the route's kernels with the server, then open tabs' sums."""
    f = lambda x: f"{x:.0f}"  # noqa: E731
    rows = [r for r in res["rows"] if "peak_mib" in r]
    out = md_table(
        [
            "notebook",
            "private after Run All MiB",
            "of it live processes",
            "of it clean file pages",
            "peak MiB",
            "held after Run All MiB",
            "processes started",
            "peak with its processes MiB",
            "Run All s",
            f"goal private <= {GOAL_MIB:.0f} MiB",
        ],
        [
            [
                Path(r["notebook"]).stem,
                f(r["private_mib"]),
                f(r["private_mib"] - r["kernel_private_mib"]) if r["live_processes"] else "",
                f(r["kernel_private_clean_mib"]) if "kernel_private_clean_mib" in r else "",
                f(r["peak_mib"]),
                f(r["held_mib"]),
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
            "optimizer (torch.optim imports torch._dynamo on first use) holds "
            f"{floor['private_mib']:.0f} MiB private after its cells, and peaks at "
            f"{floor['peak_mib']:.0f} MiB resident ({floor['held_mib']:.0f} MiB held).",
        ]
    walk = res.get("route")
    if walk:
        out += [""]
        if "not_available" in walk:
            out += [f"The {walk['route']} route: not available: {walk['not_available']}"]
        else:
            server = walk["server"]
            out += [
                f"The {walk['route']} route ({', '.join(walk['notebooks'])}, in order, Run All each, every "
                f"kernel shut down before the next opens): its kernels held at most "
                f"{walk['kernels_peak_mib']:.0f} MiB resident at once ({walk['most_kernels_alive']} alive at "
                f"once, {walk['samples']} samples); with the Jupyter server's {server['peak_mib']:.0f} MiB "
                f"({server['how']}; {server['private_mib']:.0f} MiB of it private once idle): "
                f"**{walk['total_mib']:.0f} MiB** of a Binder session's {SESSION_MIB:.0f} MiB, "
                + ("met." if walk["met"] else "**MISSED**.")
            ]
    for r in res.get("open_tabs", []):
        out += [
            "",
            f"Were every tab left open after Run All (no shutdown on close), the {r['route']} route's "
            f"{len(r['notebooks'])} kernels ({', '.join(r['notebooks'])}) would hold {r['held_mib']:.0f} MiB "
            f"resident together ({r['private_mib']:.0f} MiB of it private).",
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
    p.add_argument(
        "--route", action="store_true", help=f"then the {ROUTE} route in order, with a Jupyter server"
    )
    args = p.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.notebooks:
        paths = [x for x in paths if any(x.name.startswith(n) for n in args.notebooks)]
        if not paths:
            p.error(f"notebooks must name prefixes of notebooks/*.ipynb (got {' '.join(args.notebooks)})")
    res = measure(paths, threads=args.threads, route=route_notebooks() if args.route else None)
    print("\n".join(lines(res)))
    return res


if __name__ == "__main__":
    main()
