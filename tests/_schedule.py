"""make test's two workers (pytest-xdist), and the record of each test's seconds they are balanced by.

`--dist loadfile` keeps a file in one worker, so a file's module fixtures (its shared runs and launches)
are made once. Two refinements, for the 2-core CI box (docs/development.md, "CI's time"):

- the browser tests (tests/test_browser*.py) are units of their own: each lesson's Run All and controls
  (up to a minute each) lands on whichever worker is free, each worker reusing one JupyterLab
  (test_browser's session-scoped ``lab``), where the whole file in one worker was the run's longest tail;
- units start longest first, by their seconds in tests/durations.json, so that both workers end together;
  a unit the table does not know counts 1 s. `make durations` runs the suite and rewrites the table
  (``ACCUMLIB_DURATIONS`` names the file each test's seconds go to; tools/durations.py sums them).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
OWN_UNITS = "tests/test_browser"  # files whose every test is a scheduling unit of its own


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or the test itself in a browser test file."""
    file = nodeid.split("::", 1)[0]
    return nodeid if file.startswith(OWN_UNITS) else file


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest_xdist_make_scheduler``: under `--dist loadfile`, files as units but for the browser tests,
    longest first; any other --dist gets xdist's own scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}

    class Balanced(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # once, before the first unit goes out (sorted is stable: ties keep order)
                units = sorted(self.workqueue.items(), key=lambda unit: -seconds.get(unit[0], 1.0))
                self.workqueue = OrderedDict(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return Balanced(config, log)


_seconds: dict[str, float] = {}


def record_report(report: pytest.TestReport) -> None:
    """``pytest_runtest_logreport``: each test's setup, call and teardown seconds, where
    ACCUMLIB_DURATIONS asks for them (in the process that reports, once per test under xdist)."""
    if os.environ.get("ACCUMLIB_DURATIONS"):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def write_record(session: pytest.Session) -> None:
    """``pytest_sessionfinish``: the controller (or the one process) writes what it recorded."""
    out = os.environ.get("ACCUMLIB_DURATIONS")
    if out and not hasattr(session.config, "workerinput"):
        Path(out).write_text(json.dumps(_seconds, indent=1, sort_keys=True) + "\n")
