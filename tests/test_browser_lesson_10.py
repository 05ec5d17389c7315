"""Lesson 10 in a real JupyterLab in headless Chromium: Run All shows no error or stderr, and each
control of its widget (micro-batch, k, loop), changed once, redraws the curves with no error.

It reuses tests/test_browser.py's server, page and checks (its ``LESSONS`` globs ``0[0-9]_*`` and
so does not reach lesson 10). Skips without Chromium, as those tests do.
"""

from __future__ import annotations

import pytest
from test_browser import BROWSER_TEST_TIMEOUT_S, _describe, _exercise_notebook, _need, lab, page  # noqa: F401

NAME = "10_your_own_project.ipynb"


@pytest.mark.browser
@pytest.mark.timeout(BROWSER_TEST_TIMEOUT_S)
def test_lesson_10_runs_and_its_widget_redraws_for_every_control(lab, page, request):  # noqa: F811
    path = _need(NAME)
    try:
        record = _exercise_notebook(page, lab, path, request)
    finally:
        lab.shutdown_kernel(path)
    assert not _describe(record), f"{NAME}:\n{_describe(record)}"
    kinds = sorted(c["kind"] for c in record["controls"])
    assert len(kinds) == 3, (
        f"the widget's three controls (micro-batch, k, loop) were not all found: {record['controls']}"
    )
    for c in record["controls"]:
        assert c["figure"] == "redrawn", (
            f"{c['kind']} {c['label']!r}: the curves were not redrawn ({c['figure']})"
        )
