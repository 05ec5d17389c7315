"""Widget response, per control: the time a learner waits between moving a control and seeing its new output.

``make bench``'s section 6 (issue 12: "widgets respond in <= 0.5 s, median, per control, 2-core CPU").

1. **Discover** the widgets from the notebooks themselves (``discover``): a code cell whose saved
   outputs show a widget, or that calls a lesson function named like a widget builder
   (``*widget*``, ``*explorer*``, ``*box*``), names the builder it calls (``why.widget(...)``,
   ``box = vl.paste_box()`` then ``box``). Literal arguments are kept, ``device`` becomes
   ``"cpu"``, and notebook variables (``initial=result``) are left out: the widget computes
   its first figure itself, outside the timing.
2. **Drive** each widget in a real Jupyter kernel, one kernel per notebook, with
   ``%matplotlib inline`` as in JupyterLab (``Driver``, run inside the kernel). Every control
   found in the widget's tree is changed in turn, alternating between its start value A and a
   neighbour B (B, A, B, A, ...): the change to B is a *first change* (nothing cached for it
   yet), every later one a *repeat* (what a cache that a real user would also hit can serve).
   A button is pressed; its first press is the first change. Each change is one kernel request:
   its time is taken in the kernel, from setting the value (or ``click()``) to the callbacks'
   return, which includes the recomputation and the figure drawn to PNG (``_style.show``, or the
   inline backend for a pyplot figure) and sent to the front end. The request's messages tell
   what the learner saw: a figure, other output, an error or nothing (an Output widget filled by
   setting its ``outputs``, as ``_style.show_in`` does, is read from its state update). JupyterLab
   delivers the same change as a comm message, on a subshell thread in JupyterLab 4.6; the work
   timed here, the callbacks, is the same; only the message's transit (milliseconds) is left out.
3. **Judge** each control: ``met`` when the median over its changes is <= 0.5 s. A control
   whose change starts processes (lesson 8's Run spawns the ranks) is *exempt*: the issue puts
   it behind a Run button with a progress indicator, and its time is reported as it is. A control
   that redraws nothing (an input read when a button is pressed) is reported as *no redraw*.

    python benchmarks/bench.py --only widgets --merge   # this section into benchmarks/results/latest.*
    python benchmarks/widgets.py 01 04                  # print the table for some notebooks only

Discovery is in widget_discovery.py, the driver that runs inside the kernel in widget_driver.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, wherever it is loaded from

from _render import md_table  # noqa: E402
from widget_discovery import Found, discover  # noqa: E402
from widget_driver import _DEVICE, _MARK, _VARIABLE, _controls, _values  # noqa: E402, F401 (tests read them here)

ROOT = Path(__file__).resolve().parent.parent
NAME = "widgets"
TITLE = "6. Widget response"
WIDGET_MAX_S = 0.5  # the goal, per control (median)
LIMIT = WIDGET_MAX_S
GOALS = {
    "widget": "every lesson widget, each control: change -> recomputed figure <= 0.5 s on CPU (median); "
    "controls that start processes are exempt (behind a Run button) and their time is stated"
}
# changes per control: B A B A B A, so one first change, five repeats, and the control ends at its start
REPEATS = 6
BUDGET_S = 12.0  # a slow control stops after this many seconds of changes (with at least MIN_CHANGES done)
MIN_CHANGES = 2  # a first change and one repeat: the repeat shows whether a cache serves a value seen before
SLOW_CHANGE_S = 60.0  # a single change slower than this is not repeated
REQUEST_TIMEOUT_S = 600.0  # building a widget or one change that takes longer is reported, never waited on


# --- the client: one kernel per notebook --------------------------------------------------------------------


@dataclass
class Reply:
    """What one kernel request produced: the Driver's result line, and what a front end would show."""

    result: dict | None = None
    figures: int = 0  # PNG images displayed
    outputs: int = 0  # any other display: HTML, text, a widget
    errors: list[str] = field(default_factory=list)
    stderr: str = ""
    timed_out: bool = False


def _request(kc: Any, km: Any, code: str, timeout: float) -> Reply:
    msg_id = kc.execute(code, store_history=False)
    reply = Reply()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            km.interrupt_kernel()
            reply.timed_out = True
            timeout, deadline = 30.0, time.monotonic() + 30.0  # let the interrupted request finish
            continue
        try:
            msg = kc.get_iopub_msg(timeout=min(left, 5.0))
        except Exception:  # queue.Empty: nothing yet
            if not km.is_alive():
                reply.errors.append("the kernel died")
                return reply
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return reply
        if kind == "comm_msg" and "outputs" in content.get("data", {}).get("state", {}):
            # an Output widget filled by setting its ``outputs`` (``_style.show_in``): the front end shows these
            for o in content["data"]["state"]["outputs"]:
                _tally(reply, o["output_type"], o)
        else:
            _tally(reply, kind, content)


def _tally(reply: Reply, kind: str, content: dict) -> None:
    """Count one output (an IOPub message, or an entry of an Output widget's ``outputs``) as a learner sees it."""
    if kind == "stream":
        text = content["text"] if isinstance(content["text"], str) else "".join(content["text"])
        for line in text.splitlines():
            if line.startswith(_MARK):
                reply.result = json.loads(line[len(_MARK) :])
            elif content["name"] == "stderr":
                reply.stderr += line + "\n"
            elif re.match(r"^\w+(Error|Exception)\b.*:", line):  # Explorer shows a callback's error as text
                reply.errors.append(line)
            elif line.strip():
                reply.outputs += 1
    elif kind in ("display_data", "execute_result", "update_display_data"):
        data = content["data"]
        if "image/png" in data or "<img" in "".join(data.get("text/html", "")):
            reply.figures += 1
        else:
            reply.outputs += 1
    elif kind == "error":
        reply.errors.append(f"{content['ename']}: {content['evalue']}")


def _kernel(threads: int) -> tuple[Any, Any]:
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")  # "python" in the spec is this interpreter
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("MPLBACKEND", None)  # the kernel's default, the inline backend, as in JupyterLab
    # the kernel's own log (its start-up notices) goes to a file; what the widgets print comes over IOPub
    log = tempfile.NamedTemporaryFile("w", prefix="widget-bench-kernel-", suffix=".log", delete=False)
    km.start_kernel(cwd=str(ROOT / "notebooks"), env=env, stdout=log, stderr=log)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
    except RuntimeError as err:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise RuntimeError(f"{err} (the kernel's log: {log.name})") from err
    setup = (
        "%matplotlib inline\n"
        # torch takes its thread count from OMP_NUM_THREADS when a lesson imports it
        "import importlib.util, sys\n"
        f"_spec = importlib.util.spec_from_file_location('accumlib_bench_widgets', {str(Path(__file__).resolve().with_name('widget_driver.py'))!r})\n"
        "_bench = importlib.util.module_from_spec(_spec); sys.modules[_spec.name] = _bench; _spec.loader.exec_module(_bench)\n"
    )
    r = _request(kc, km, setup, 120)
    if r.errors:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise RuntimeError(f"kernel setup failed: {r.errors} (the kernel's log: {log.name})")
    os.unlink(log.name)  # it started: what the widgets print comes over IOPub
    return km, kc


def _stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return {"median_s": statistics.median(times), "quartiles_s": [q[0], q[2]], "n": len(times)}


def drive(
    found: list[Found],
    *,
    threads: int = 1,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
    min_changes: int = MIN_CHANGES,
    log: Any = print,
) -> tuple[list[dict], list[dict]]:
    """Rows, one per control of every widget; and the widgets that could not be built or driven, with why."""
    rows, unavailable = [], []
    by_notebook: dict[str, list[Found]] = {}
    for f in found:
        by_notebook.setdefault(f.notebook, []).append(f)
    for notebook, widgets in by_notebook.items():
        try:
            km, kc = _kernel(threads)
        except Exception as err:  # no kernel, no figures: said per widget, never a number
            unavailable += [
                asdict(f) | {"widget": f.name, "not_available": f"no kernel: {type(err).__name__}: {err}"}
                for f in widgets
            ]
            continue
        try:
            for n, f in enumerate(widgets):
                var = f"_driver{n}"
                code = (
                    f"{var} = _bench.Driver({f.module!r}, {f.builder!r}, {list(f.args)!r}, {dict(f.kwargs)!r})\n"
                    f"{var}.describe()"
                )
                built = _request(kc, km, code, REQUEST_TIMEOUT_S)
                if built.result is None:
                    why = "; ".join(built.errors) or ("timed out" if built.timed_out else "no result")
                    unavailable.append(asdict(f) | {"widget": f.name, "not_available": why})
                    log(f"    {notebook:<36} {f.name:<28} not available: {why}")
                    continue
                if not built.result["controls"]:
                    unavailable.append(asdict(f) | {"widget": f.name, "not_available": "no control to drive"})
                for i, c in enumerate(built.result["controls"]):
                    row = _drive_control(kc, km, var, i, f, c, built.result, repeats, budget_s, min_changes)
                    rows.append(row)
                    log("    " + _line(row))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return rows, unavailable


def _drive_control(
    kc: Any,
    km: Any,
    var: str,
    i: int,
    f: Found,
    c: dict,
    built: dict,
    repeats: int,
    budget_s: float,
    min_changes: int,
) -> dict:
    times, firsts, figures, outputs, errors, stderr, processes = [], [], 0, 0, [], "", 0
    spent = 0.0
    while len(times) < repeats and (len(times) < min_changes or spent < budget_s):
        r = _request(kc, km, f"{var}.change({i})", REQUEST_TIMEOUT_S)
        errors += r.errors
        stderr += r.stderr
        if r.result is None:
            break
        if r.result["error"]:
            errors.append(r.result["error"])
        times.append(r.result["seconds"])
        firsts.append(r.result["first"])
        spent += r.result["seconds"]
        figures, outputs, processes = (
            figures + r.figures,
            outputs + r.outputs,
            processes + r.result["processes"],
        )
        if processes or r.result["seconds"] > SLOW_CHANGE_S:
            break  # a Run that starts processes, or a change of minutes: one is its figure
    _request(kc, km, f"{var}.restore({i})", REQUEST_TIMEOUT_S)
    row = {
        "notebook": f.notebook,
        "widget": f.name,
        "main": f.main,
        "control": c["control"],
        "class": c["class"],
        "change": "press" if c["how"] == "press" else f"{c['values'][0]} <-> {c['values'][1]}",
        "times_s": times,
        "first_s": times[0] if times else None,
        "repeat_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
        "shown": "figure" if figures else "other output" if outputs else "nothing",
        "processes": processes,
        "errors": errors[:3],
        "stderr": stderr[-300:],
        "build_s": built["build_s"],
        "built_with": built["built_with"],
        "not_driven": built["skipped"],
    }
    if times:
        row |= _stats(times)
    if errors or not times:
        row["status"] = "ERROR"
    elif processes:
        row["status"] = "exempt"  # starts processes: behind a Run button, its time stated
    elif not figures and not outputs:
        row["status"] = "no redraw"  # an input a button reads
    else:
        row["status"] = "met" if row["median_s"] <= WIDGET_MAX_S else "MISSED"
    return row


def _line(row: dict) -> str:
    if "median_s" not in row:
        return f"{row['notebook'][:2]} {row['widget']:<26} {row['control']:<18} ERROR: {'; '.join(row['errors'])[:100]}"
    q = row["quartiles_s"]
    first = "" if row["first_s"] is None else f"first {row['first_s']:.3f} s"
    return (
        f"{row['notebook'][:2]} {row['widget']:<26} {row['control']:<18} {row['class']:<15} median {row['median_s']:7.3f} s "
        f"[{q[0]:.3f}, {q[1]:.3f}] n={row['n']}  {first:<16} {row['shown']:<12} {row['status']}"
        + (f"  ({row['processes']} processes)" if row["processes"] else "")
    )


# --- 3. the section: rows, goal, tables -------------------------------------------------------------------


def run(
    quick: bool = False,
    paths: list[Path] | None = None,
    threads: int | None = None,
    repeats: int | None = None,
) -> dict:
    """The section: every widget's every control, judged against the goal; ``quick`` drives one widget once.

    ``threads``: the kernel's torch threads (default: this process's, which ``bench.py --threads`` sets).
    """
    try:
        import ipywidgets  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError as err:
        return {"not_available": f"ipywidgets / jupyter_client is not installed ({err})"}
    paths = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")) if paths is None else paths
    found, unnamed = discover(paths)
    without = [p.name for p in paths if p.name not in {f.notebook for f in found}]
    if quick:
        found = [f for f in found if f.main and "distributed" not in f.module][:1]
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    repeats = repeats or (1 if quick else REPEATS)
    rows, unavailable = drive(found, threads=threads, repeats=repeats, min_changes=min(repeats, MIN_CHANGES))
    judged = [r for r in rows if r["status"] in ("met", "MISSED", "ERROR")]
    exempt = [r for r in rows if r["status"] == "exempt"]
    missed = [r for r in judged if r["status"] != "met"]
    timed = [r for r in judged if "median_s" in r]
    if timed:
        worst = max(timed, key=lambda r: r["median_s"])
        measured = (
            f"{len(judged) - len(missed)} of {len(judged)} controls met; slowest {worst['notebook'][:2]} {worst['widget']} "
            f"{worst['control']}: {worst['median_s']:.2f} s"
        )
    else:
        measured = "no control could be timed"
    if exempt:
        measured += "; exempt (start processes): " + ", ".join(
            f"{r['notebook'][:2]} {r['control']} {r['median_s']:.1f} s" for r in exempt
        )
    goal = {
        "measured": measured,
        "met": (not missed and not unavailable) if timed else None,
        "missed": [
            f"{r['notebook'][:2]} {r['widget']} {r['control']}: "
            + (
                f"{r['median_s']:.2f} s"
                if r["status"] == "MISSED"
                else "ERROR " + "; ".join(r["errors"])[:80]
            )
            for r in missed
        ]
        + [f"{u['notebook']} {u['widget']}: not available ({u['not_available']})" for u in unavailable],
    }
    note = (
        "time in the kernel from setting a control's value (or pressing a button) to its callbacks' return: "
        "recomputation, figure drawn to PNG and sent to the front end; changes alternate between the start value A "
        "and a neighbour B, so 'first' is the change to B (nothing cached), the rest are repeats; "
        f"at most {REPEATS} changes or {BUDGET_S:.0f} s per control; built on CPU with the notebook's literal arguments, "
        "notebook variables left out (the widget computes its first figure itself, untimed)"
    )
    if without:
        note += f"; notebooks with no widget: {', '.join(without)}"
    if unnamed:
        note += f"; cells that show a widget no builder could be named for: {', '.join(unnamed)}"
    if quick:
        note += "; --quick changes each control of one widget once, so the goal is not measured for real"
        goal["met"] = None
    return {
        "rows": rows,
        "unavailable": unavailable,
        "notebooks_without_widget": without,
        "unnamed_cells": unnamed,
        "goals": {"widget": goal},
        "note": note,
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """The per-control table (goal controls), then the exempt and no-redraw controls, then what could not be driven."""
    rows = res["rows"]
    if rows and "control" not in rows[0]:
        return ["results in the format before per-control rows: run `bench.py --only widgets --merge` again"]
    s = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
    judged = [r for r in rows if r["status"] in ("met", "MISSED", "ERROR")]
    lines = md_table(
        [
            "notebook",
            "widget",
            "control",
            "change",
            "median s",
            "quartiles s",
            "n",
            "first change s",
            "repeats median s",
            "shows",
            "goal <= 0.5 s",
        ],
        [
            [
                r["notebook"][:2],
                r["widget"],
                f"{r['control']} ({r['class']})",
                r["change"],
                s(r.get("median_s")),
                f"{s(r['quartiles_s'][0])}-{s(r['quartiles_s'][1])}" if "quartiles_s" in r else "",
                r.get("n", 0),
                s(r["first_s"]),
                s(r["repeat_median_s"]),
                r["shown"],
                "met"
                if r["status"] == "met"
                else f"**{r['status']}**" + (f" {'; '.join(r['errors'])[:80]}" if r["errors"] else ""),
            ]
            for r in judged
        ],
    )
    exempt = [r for r in rows if r["status"] == "exempt"]
    if exempt:
        lines += [
            "",
            "Exempt from the 0.5 s goal: these start processes (behind a Run button), time as measured:",
            "",
        ]
        lines += md_table(
            ["notebook", "widget", "control", "processes the kernel started", "time s", "n"],
            [
                [
                    r["notebook"][:2],
                    r["widget"],
                    f"{r['control']} ({r['class']})",
                    r["processes"],
                    s(r["median_s"]),
                    r["n"],
                ]
                for r in exempt
            ],
        )
    quiet = [r for r in rows if r["status"] == "no redraw"]
    if quiet:
        lines += [
            "",
            "No redraw on change (inputs a button reads): "
            + ", ".join(
                f"{r['notebook'][:2]} {r['widget']} {r['control']} ({r['median_s']:.3f} s)" for r in quiet
            ),
        ]
    noisy = [r for r in rows if r["stderr"].strip()]
    if noisy:
        lines += [
            "",
            "stderr during changes: "
            + "; ".join(
                f"{r['notebook'][:2]} {r['control']}: {r['stderr'].strip().splitlines()[-1][:100]}"
                for r in noisy
            ),
        ]
    for u in res.get("unavailable", []):
        lines += ["", f"not available: {u['notebook']} {u['widget']}: {u['not_available']}"]
    return lines


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "notebooks", nargs="*", help="notebook name prefixes (default: every numbered notebook), e.g. 01 04"
    )
    p.add_argument(
        "--quick", action="store_true", help="one widget, one change per control: checks the script only"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="the kernel's torch threads (default 1, as bench.py)"
    )
    args = p.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    if args.notebooks:
        paths = [q for q in paths if any(q.name.startswith(n) for n in args.notebooks)]
        if not paths:
            p.error(
                f"notebooks must name prefixes of notebooks/[0-9]*.ipynb (got {' '.join(args.notebooks)})"
            )
    res = run(quick=args.quick, paths=paths, threads=args.threads)
    print("\n".join(lines(res)))
    print(f"\n{res['goals']['widget']['measured']}")
    return res


if __name__ == "__main__":
    main()
