"""Presentation mode: lesson figures readable on a projector, with alt text built from their numbers,
lesson 3's figure without overlapping labels; every owned notebook's figures carry alt text with numbers."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from accumlib.lessons import _style, ragged_windows

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))
ALT = re.compile(r'<img [^>]*alt="([^"]*)"')


def _text_boxes(fig):
    from matplotlib.text import Text

    _style.png(fig)
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip()]


def _overlaps(fig):
    boxes = _text_boxes(fig)
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2)
            if ba.overlaps(bb) and ba.width * ba.height > 0 and bb.width * bb.height > 0
            and min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 1 and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 1]


@pytest.fixture(scope="module")
def lesson_3_figure():
    return ragged_windows.plot(ragged_windows.compute(4, 8, n=110))


def test_lesson_3_names_its_strategies_and_no_labels_overlap(lesson_3_figure):
    fig = lesson_3_figure
    _, bx = fig.axes[:2]
    assert [t.get_text() for t in bx.get_yticklabels()] == list(ragged_windows.STRATEGIES)
    assert not _overlaps(fig), _overlaps(fig)
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    assert fig.get_figwidth() <= _style.MAX_WIDTH_IN


def test_the_overlap_check_can_fail():
    fig, ax = _style.figure()
    ax.text(0.5, 0.5, "one label")
    ax.text(0.52, 0.5, "another label")
    assert _overlaps(fig)


def test_lesson_3_alt_text_gives_its_numbers(lesson_3_figure):
    alt = _style.describe(lesson_3_figure)
    assert "110 samples in micro-batches of 8, k = 4" in alt
    assert "96" in alt and "no step" in alt
    assert "exact: accumlib.ragged" in alt


def _figure_outputs(path):
    """Every output of a notebook (cells and saved widget states) that holds an image."""
    nb = json.loads(path.read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    states = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    outputs += [o for s in states.values() for o in s.get("state", {}).get("outputs", [])]
    return [o for o in outputs if "image/png" in o.get("data", {}) or "<img" in "".join(o.get("data", {}).get("text/html", ""))]


OWNED = ["01_why_accumulate.ipynb", "02_normalizing_the_loss.ipynb", "03_ragged_windows_and_tokens.ipynb",
         "04_mixed_precision.ipynb", "05_batchnorm_vs_groupnorm.ipynb", "06_gans_two_optimizers.ipynb",
         "08_distributed.ipynb"]


@pytest.mark.parametrize("name", OWNED)
def test_every_figure_in_the_notebook_has_alt_text_with_numbers(name):
    figures = _figure_outputs(NOTEBOOKS / name)
    assert figures, f"{name} shows no figure"
    for output in figures:
        html = "".join(output["data"].get("text/html", ""))
        alts = ALT.findall(html)
        assert alts, f"{name}: a figure without alt text"
        assert all(re.search(r"\d", alt) and len(alt) > 40 for alt in alts), alts
