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

Discovery is in _widget_discovery.py, the client that starts a kernel per notebook and drives each
control in _widget_kernel.py, the driver that runs inside the kernel in _widget_driver.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, wherever it is loaded from

from _render import md_table  # noqa: E402

# Found: the tests build rows with it
from _widget_discovery import Found, discover  # noqa: E402, F401

# the driver's markers and control walk: the tests read them here
from _widget_driver import _DEVICE, _VARIABLE, _controls, _values  # noqa: E402, F401
from _widget_kernel import BUDGET_S, MIN_CHANGES, REPEATS, WIDGET_MAX_S, drive  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAME = "widgets"
TITLE = "6. Widget response"
LIMIT = WIDGET_MAX_S
GOALS = {
    "widget": "every lesson widget, each control: change -> recomputed figure <= 0.5 s on CPU (median); "
    "controls that start processes are exempt (behind a Run button) and their time is stated"
}


# --- 3. the section: rows, goal, tables -------------------------------------------------------------------


def run(quick: bool = False) -> dict:
    """The section as bench.py runs it (the face every section has): ``measure`` on every numbered
    notebook."""
    return measure(quick=quick)


def measure(
    paths: list[Path] | None = None,
    *,
    quick: bool = False,
    threads: int | None = None,
    repeats: int | None = None,
) -> dict:
    """Every widget's every control in ``paths`` (default: every numbered notebook), judged against the
    goal; ``quick`` drives one widget once.

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
            f"{len(judged) - len(missed)} of {len(judged)} controls met; slowest {worst['notebook'][:2]} "
            f"{worst['widget']} {worst['control']}: {worst['median_s']:.2f} s"
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
        "recomputation, figure drawn to PNG and sent to the front end; changes alternate between the start "
        "value A and a neighbour B, so 'first' is the change to B (nothing cached), the rest are repeats; "
        f"at most {REPEATS} changes or {BUDGET_S:.0f} s per control; built on CPU with the notebook's "
        "literal arguments, notebook variables left out (the widget computes its first figure itself, "
        "untimed)"
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
    """The per-control table (goal controls), then the exempt and no-redraw controls, then what could not be
    driven."""
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
    res = measure(paths, quick=args.quick, threads=args.threads)
    print("\n".join(lines(res)))
    print(f"\n{res['goals']['widget']['measured']}")
    return res


if __name__ == "__main__":
    main()
