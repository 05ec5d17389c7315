"""Section 5, the notebook suite: wall time of every notebook under nbval, each in its own pytest process, and
of the suite: all notebooks in one pytest process, as `make test` and a plain `pytest --nbval notebooks/` run
them (the sum of the separate processes is printed beside it: it pays pytest's start-up once per notebook).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _render import md_table
from _timing import ROOT

NAME = "notebook_times"
TITLE = "5. Notebook suite under nbval"
GOALS = {
    "notebook_each": "every notebook under nbval <= 30 s (2-core CPU)",
    "notebook_suite": "the whole notebook suite, one nbval run over every notebook, <= 180 s (2-core CPU)",
}
NOTEBOOK_MAX_S = 30.0
SUITE_MAX_S = 180.0
LIMIT = NOTEBOOK_MAX_S


def _notebooks(quick: bool, out: Path) -> tuple[list[Path], list[str]]:
    """The notebooks to run, and the numbered notebooks that do not exist (yet): gaps in 01, 02, ..."""
    if quick:  # nbval's machinery on a one-cell notebook: a real notebook takes tens of seconds
        nb = out / "quick_check.ipynb"
        nb.write_text(
            json.dumps(
                {
                    "cells": [
                        {
                            "cell_type": "code",
                            "execution_count": 1,
                            "id": "c0",
                            "metadata": {},
                            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["2\n"]}],
                            "source": ["print(1 + 1)"],
                        }
                    ],
                    "metadata": {
                        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
                    },
                    "nbformat": 4,
                    "nbformat_minor": 5,
                }
            )
        )
        return [nb], []
    found = sorted((ROOT / "notebooks").glob("*.ipynb"))
    numbers = sorted(int(m.group(1)) for p in found if (m := re.match(r"(\d+)_", p.name)))
    missing = [f"{n:02d}_*.ipynb" for n in range(1, max(numbers, default=0) + 1) if n not in numbers]
    return found, missing


def run(quick: bool = False) -> dict:
    """Each notebook in its own ``pytest --nbval`` process; the suite is the sum of those runs."""
    try:
        import nbval  # noqa: F401
    except ImportError as err:
        return {"not_available": f"nbval is not installed ({err})"}
    with tempfile.TemporaryDirectory() as scratch:  # --quick's one-cell notebook lives here
        return _run(quick, Path(scratch))


def _nbval(paths: list[Path]) -> tuple[float, subprocess.CompletedProcess]:
    """One ``pytest --nbval`` process over ``paths``: its wall time and what it printed."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(ROOT),
        "--nbval",
        "--nbval-current-env",
        *map(str, paths),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"MPLBACKEND": "Agg"}
    )
    return time.perf_counter() - t0, proc


def _run(quick: bool, scratch: Path) -> dict:
    paths, missing = _notebooks(quick, scratch)
    rows = []
    for nb in paths:
        wall, proc = _nbval([nb])
        tail = (proc.stdout.strip().splitlines() or [""])[-1]
        rel = nb.relative_to(ROOT) if nb.is_relative_to(ROOT) else Path(nb.name)
        rows.append(
            {
                "notebook": str(rel),
                "wall_s": wall,
                "passed": proc.returncode == 0,
                "pytest": tail[-120:],
                "met": wall <= NOTEBOOK_MAX_S,
            }
        )
        print(
            f"    {str(rel):<44} {wall:6.1f} s  "
            f"{'passed' if proc.returncode == 0 else 'FAILED: ' + tail[-80:]}",
            flush=True,
        )
    separate = sum(r["wall_s"] for r in rows)
    suite, proc = _nbval(paths)
    suite_passed = proc.returncode == 0
    print(
        f"    {'all notebooks, one process':<44} {suite:6.1f} s  (separately: {separate:.1f} s)", flush=True
    )
    worst = max(rows, key=lambda r: r["wall_s"])
    goals = {
        "notebook_each": {
            "measured": f"slowest {worst['notebook']}: {worst['wall_s']:.1f} s",
            "met": all(r["met"] for r in rows),
            "missed": [f"{r['notebook']}: {r['wall_s']:.1f} s" for r in rows if not r["met"]],
        },
        "notebook_suite": {
            "measured": f"{suite:.1f} s, {len(rows)} notebooks in one process ({separate:.1f} s one each)",
            "met": suite <= SUITE_MAX_S,
            "missed": [] if suite <= SUITE_MAX_S else [f"suite: {suite:.1f} s"],
        },
    }
    failed = [r["notebook"] for r in rows if not r["passed"]] + (
        [] if suite_passed else ["the one-process run"]
    )
    if failed:
        for g in goals.values():
            g["note"] = f"nbval failed on {failed}: their times are of a failing run"
    note = (
        "one `pytest --nbval --nbval-current-env` process per notebook (pytest and kernel start-up "
        "included); suite = one such process over every notebook, as `make test` runs them"
    )
    if quick:
        note += "; --quick runs a one-cell notebook only, so these goals are not measured for real"
        for g in goals.values():
            g["met"] = None
    return {
        "rows": rows,
        "suite_s": suite,
        "suite_passed": suite_passed,
        "separate_s": separate,
        "missing": missing,
        "goals": goals,
        "note": note,
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection)."""
    rows = res["rows"]
    lines: list[str] = []
    lines += md_table(
        ["notebook", "wall", "nbval", "goal <= 30 s"],
        [
            [
                r["notebook"],
                f"{r['wall_s']:.1f} s",
                "passed" if r["passed"] else "FAILED",
                "met" if r["met"] else "MISSED",
            ]
            for r in rows
        ]
        + [
            ["sum of the runs above", f"{res['separate_s']:.1f} s", "", ""],
            [
                "**suite (all notebooks, one process)**",
                f"**{res['suite_s']:.1f} s**",
                "passed" if res["suite_passed"] else "FAILED",
                "met" if res["suite_s"] <= SUITE_MAX_S else "MISSED (goal 180 s)",
            ],
        ],
    )
    if res["missing"]:
        lines += ["", f"not present yet, skipped: {', '.join(res['missing'])}"]
    return lines
