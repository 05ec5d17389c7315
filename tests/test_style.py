"""The lessons' shared style: colour-blind-safe roles, readable text, figures shown without pyplot."""

from __future__ import annotations

import base64
import threading

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from accumlib.lessons import _style
from accumlib.lessons._common import Table, check_float, check_int, check_ints


def test_roles_differ_by_more_than_colour():
    styles = [(r["marker"], str(r["linestyle"])) for r in _style.ROLE.values()]
    assert len(set(styles)) == len(styles)  # distinguishable in grey scale too
    assert _style.ROLE["correct"]["color"] != _style.ROLE["buggy"]["color"]
    assert not {"tab:red", "tab:green", "red", "green"} & {r["color"] for r in _style.ROLE.values()}


def test_a_styled_figure_has_no_text_below_10_pt_and_is_not_pyplots():
    fig, ax = _style.figure(title="relative error per step")
    ax.plot([1, 2, 3], [1e-3, 1e-5, 1e-7], label="x", **_style.ROLE["buggy"])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.legend()
    _style.png(fig)  # draws: tick labels exist only after a draw
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    assert fig not in map(plt.figure, plt.get_fignums())


def test_show_in_fills_an_output_with_a_figure_a_table_and_text():
    out = widgets.Output()
    fig, ax = _style.figure()
    ax.plot([0, 1], [0, 1])
    _style.show_in(out, Table(("k", "error"), [(1, "0")]), fig, "done", alt="a line")
    table, image, text = out.outputs
    assert "<table>" in table["data"]["text/html"] and "k  error" in table["data"]["text/plain"]
    assert base64.b64decode(image["data"]["image/png"])[:4] == b"\x89PNG"
    assert 'alt="a line"' in image["data"]["text/html"]
    assert text == {"output_type": "stream", "name": "stdout", "text": "done\n"}


def test_figures_drawn_from_two_threads_at_once_do_not_collide():
    # the lesson 8 crash: two threads laying out log-axis labels at once (see accumlib/lessons/distributed.py)
    errors = []

    def draw():
        try:
            for _ in range(5):
                fig, ax = _style.figure()
                ax.semilogy([1, 2, 3], [1e-2, 1e-4, 1e-6])
                _style.png(fig)
        except Exception as e:  # pragma: no cover - the failure this test exists to catch
            errors.append(e)

    threads = [threading.Thread(target=draw) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("call, message", [
    (lambda: check_int("batch_size", 0, low=1), r"batch_size must be an integer >= 1 \(got 0\)"),
    (lambda: check_int("k", 2.5, low=1), r"k must be an integer >= 1 \(got 2.5 of type float\)"),
    (lambda: check_int("k", True, low=1), r"k must be an integer >= 1 \(got True of type bool\)"),
    (lambda: check_int("world_size", 9, low=1, high=8), r"world_size must be an integer between 1 and 8 \(got 9\)"),
    (lambda: check_float("lr", 0.0, low=0.0, low_open=True), r"lr must be a number > 0.0 \(got 0.0\)"),
    (lambda: check_float("lr", float("nan"), low=0.0), r"lr must be a number >= 0.0 \(got nan\)"),
    (lambda: check_ints("accum_steps", [], low=1), r"accum_steps must be a non-empty sequence of integers \(got \[\]\)"),
    (lambda: check_ints("accum_steps", [2, 2.5], low=1), r"accum_steps\[1\] must be an integer >= 1 \(got 2.5"),
])
def test_checks_name_the_argument_the_rule_and_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_tables_refuse_rows_of_the_wrong_width():
    with pytest.raises(ValueError, match=r"rows must have 2 cells like the header \(got 3"):
        Table(("a", "b"), [(1, 2, 3)])
