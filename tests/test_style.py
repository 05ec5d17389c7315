"""The lessons' shared style: colour-blind-safe roles, readable text, figures shown without pyplot."""

from __future__ import annotations

import base64
import threading

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from accumlib.checks import check_float, check_int, check_ints
from accumlib.text import Table
from accumlib_course import _style


def test_roles_differ_by_more_than_colour():
    styles = [(r["marker"], str(r["linestyle"])) for r in _style.ROLE.values()]
    assert len(set(styles)) == len(styles)  # distinguishable in grey scale too
    assert _style.ROLE["correct"]["color"] != _style.ROLE["buggy"]["color"]
    assert not {"tab:red", "tab:green", "red", "green"} & {r["color"] for r in _style.ROLE.values()}


def test_a_styled_figure_has_no_text_below_14_pt_and_is_not_pyplots():
    @_style.styled
    def plot():  # as every lesson's plot() is built
        fig, ax = _style.figure(title="relative error per step")
        ax.plot([1, 2, 3], [1e-3, 1e-5, 1e-7], label="x", **_style.ROLE["buggy"])
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.legend(fontsize=9)  # asked for too small: raised to the minimum
        ax.annotate("tail", (3, 1e-7), fontsize=8)
        return fig

    fig = plot()
    _style.png(fig)  # draws: tick labels exist only after a draw
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT == 14
    assert fig not in map(plt.figure, plt.get_fignums())
    unstyled, ax = _style.figure()
    ax.legend(handles=ax.plot([0, 1], label="x"), fontsize=9)
    # the check can fail: readable() is what raises it
    assert min(_style.font_sizes(unstyled)) < _style.MIN_FONT_PT


def test_a_figure_is_never_wider_than_a_projector_shows_unscaled():
    fig, _ = _style.figure(2, width=12, height=4.8)
    assert fig.get_figwidth() == _style.MAX_WIDTH_IN and fig.get_figheight() == 4.8  # narrower, as tall
    assert fig.get_figwidth() * _style.RC["figure.dpi"] <= 1024
    narrow, _ = _style.figure(width=6, height=3)
    assert (narrow.get_figwidth(), narrow.get_figheight()) == (6, 3)


def test_long_titles_are_wrapped_to_the_figures_width():
    @_style.styled
    def plot():
        fig, ax = _style.figure(width=6, title="a very long figure title " * 6)
        ax.set_title("a long panel title that does not fit " * 3)
        return fig

    fig = plot()
    assert fig._suptitle.get_text().count("\n") >= 1 and fig.axes[0].get_title().count("\n") >= 1
    _style.png(fig)
    renderer = fig.canvas.get_renderer()
    assert fig._suptitle.get_window_extent(renderer).width <= fig.get_figwidth() * fig.dpi


def test_alt_text_is_built_from_the_figures_numbers():
    fig, (ax, bx) = _style.figure(2, title="gradient error per k")
    ax.plot([1, 2, 4], [1.0, 2.0, 4.0], label="naive")
    ax.plot([1, 2, 4], [1.00001, 1.0, 0.99999], label="divided")
    ax.set_xlabel("k")
    ax.set_ylabel("|g| / |g*|")
    bx.bar(["drop", "exact"], [0.125, 1e-7], label="tail weight")
    bx.set_yscale("log")
    alt = _style.describe(fig)
    assert alt.startswith(
        "Figure: gradient error per k. Panel 1: x k, y |g| / |g*|; naive: 1, 2, 4; divided: 1, 1, 1"
    )
    assert "Panel 2: y (log scale)" not in alt and "tail weight: 0.125, 1e-07" in alt
    long = _style.figure()[1]
    long.plot(range(100), [i / 10 for i in range(100)], label="loss")
    text = _style.describe(long.figure)
    assert "loss: 100 values from 0 to 9.9, min 0, max 9.9" in text
    assert _style.describe(_style.figure()[0]).startswith("Panel 1")  # nothing plotted: no numbers, no crash


def test_every_way_a_figure_is_shown_carries_alt_text():
    from IPython.core.interactiveshell import InteractiveShell

    fig, ax = _style.figure(title="t")
    ax.plot([0, 1], [0.5, 0.25], label="curve")
    out = _style.output(fig)  # a widget's output, no alt given
    assert (
        'alt="Figure: t. Panel 1; curve: 0.5, 0.25."' in out["data"]["text/html"]
        and "image/png" in out["data"]
    )
    shell = InteractiveShell.instance()
    try:
        # a plot() returned by a cell: IPython's HTML formatter gets the <img alt>
        _style.styled(lambda: fig)()
        data, _ = shell.display_formatter.format(fig)
        assert 'alt="Figure: t. Panel 1; curve: 0.5, 0.25."' in data["text/html"]
    finally:
        InteractiveShell.clear_instance()


def test_a_figure_a_cell_returns_is_drawn_once_for_both_its_mime_types(monkeypatch):
    """IPython asks the HTML formatter, then the PNG one: the PNG is the HTML's drawing, unless the
    figure changed since (then it is drawn anew, never a stale picture)."""
    from IPython.core.interactiveshell import InteractiveShell

    drawn = []
    real_png = _style.png
    monkeypatch.setattr(_style, "png", lambda fig: drawn.append(fig) or real_png(fig))
    fig, ax = _style.figure(title="t")
    ax.plot([0, 1], [0.5, 0.25], label="curve")
    shell = InteractiveShell.instance()
    try:
        _style.styled(lambda: fig)()
        data, _ = shell.display_formatter.format(fig)
        assert len(drawn) == 1 and f'base64,{data["image/png"]}"' in data["text/html"]
        assert base64.b64decode(data["image/png"])[:4] == b"\x89PNG"

        shell.display_formatter.format(fig, include=["text/html"])  # an HTML-only display, then a change
        ax.set_title("changed")
        only_png, _ = shell.display_formatter.format(fig, include=["image/png"])
        assert len(drawn) == 3 and only_png["image/png"] != data["image/png"]

        other, _ = _style.figure()  # another figure never gets this one's picture
        shell.display_formatter.format(fig, include=["text/html"])
        shell.display_formatter.format(other, include=["image/png"])
        assert drawn[-1] is other
    finally:
        InteractiveShell.clear_instance()


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
    # the lesson 8 crash: two threads laying out log-axis labels at once
    # (see accumlib_course/lessons/distributed.py)
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


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_int("batch_size", 0, low=1), r"batch_size must be an integer >= 1 \(got 0\)"),
        (lambda: check_int("k", 2.5, low=1), r"k must be an integer >= 1 \(got 2.5 of type float\)"),
        (lambda: check_int("k", True, low=1), r"k must be an integer >= 1 \(got True of type bool\)"),
        (
            lambda: check_int("world_size", 9, low=1, high=8),
            r"world_size must be an integer between 1 and 8 \(got 9\)",
        ),
        (lambda: check_float("lr", 0.0, low=0.0, low_open=True), r"lr must be a number > 0.0 \(got 0.0\)"),
        (lambda: check_float("lr", float("nan"), low=0.0), r"lr must be a number >= 0.0 \(got nan\)"),
        (
            lambda: check_ints("accum_steps", [], low=1),
            r"accum_steps must be a non-empty sequence of integers \(got \[\]\)",
        ),
        (
            lambda: check_ints("accum_steps", [2, 2.5], low=1),
            r"accum_steps\[1\] must be an integer >= 1 \(got 2.5",
        ),
    ],
)
def test_checks_name_the_argument_the_rule_and_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_tables_refuse_rows_of_the_wrong_width():
    with pytest.raises(ValueError, match=r"rows must have 2 cells like the header \(got 3"):
        Table(("a", "b"), [(1, 2, 3)])


def test_a_figure_legend_wider_than_the_figure_gets_fewer_columns_and_a_long_label_wraps():
    @_style.styled
    def plot():
        fig, ax = _style.figure(width=6)
        for i in range(4):
            ax.plot([0, 1], [i, i], label=f"a rather long curve name {i}")
        ax.set_xlabel("a very long x-axis label that cannot fit under a six-inch panel at fourteen points")
        fig.legend(loc="outside lower center", ncols=4)
        return fig

    fig = plot()
    image = _style.png(fig)
    assert fig.legends[0]._ncols < 4 and "\n" in fig.axes[0].get_xlabel()
    assert int.from_bytes(image[16:20], "big") <= 6 * fig.dpi + 20  # nothing pushed past the figure's width
