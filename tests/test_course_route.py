"""The routes' times, measured: every time the course map shows is the reading rule's (words at 120 a minute
plus the allowances per code cell, widget, exercise and question) over the sections a route lists; the
90-minute route keeps 15 minutes of slack; a route's links open at sections it lists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from accumlib_course.lessons import _route_time, course

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
MAP = NOTEBOOKS / "00_start_here.ipynb"
GUIDE = NOTEBOOKS / "INSTRUCTORS.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _rule_by_hand(file: str, wanted, skimmed) -> float:
    """A second count of the rule, line by line: a '# ' or '## ' line opens a section; words are runs with a
    letter or digit, a link counted as its text; optional and folded cells are left out."""
    minutes: dict[int, float] = {}
    index = -1
    for cell in _cells(NOTEBOOKS / file):
        tags = set(cell["metadata"].get("tags", []))
        skip = bool({"optional", "assertions"} & tags)
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in source.splitlines():
                if re.match(r"#{1,2} ", line):
                    index += 1
                if not skip:
                    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", line)
                    words = sum(bool(re.search(r"[^\W_]", w)) for w in text.split())
                    minutes[index] = minutes.get(index, 0) + words / 120
            if not skip and re.match(r"## (\d+\. )?Questions to think about", source.lstrip()):
                minutes[index] += sum(bool(re.match(r"\s*\d+\.\s+\S", x)) for x in source.splitlines())
        elif not skip:
            index = max(index, 0)
            kind = (
                "exercise"
                if "exercise" in tags
                else "widget"
                if re.search(r"\b(widget|explorer|paste_box)\(", source)
                else "code"
            )
            minutes[index] = minutes.get(index, 0) + {"code": 0.25, "widget": 2, "exercise": 6}[kind]
    return sum(1.0 if i in skimmed else m for i, m in minutes.items() if wanted is None or i in wanted)


@pytest.mark.parametrize("name", course.ROUTES)
def test_a_routes_time_is_the_reading_rule_counted_again_by_hand(name):
    _, plan, skimmed = course.ROUTE_PLANS[name]
    by_hand = {
        n: _rule_by_hand(course.by_number(n).file, wanted, {i for m, i in skimmed if m == n})
        for n, wanted in plan
    }
    assert course.route_time(name) == pytest.approx(sum(by_hand.values()), abs=1)
    table = str(course.route(name))
    for n, minutes in by_hand.items():
        row = next(line for line in table.splitlines() if line.startswith(f"{n} "))
        assert f"{minutes:.1f} min" in row, (name, n, row)


def test_the_90_minute_route_keeps_15_minutes_of_slack_by_the_rule():
    assert course.ROUTE_MINUTES["90-minute workshop"] - course.route_time("90-minute workshop") >= 15
    assert course.slack("90-minute workshop") >= 15


def test_the_map_shows_the_times_the_rule_computes_now():
    """00_start_here's committed outputs (the routes table, each route's table) are the rule's numbers today:
    a lesson whose text changed needs the map re-executed (make notebooks NB=00)."""
    shown = {
        "".join(c["source"]): "".join(o.get("data", {}).get("text/plain", ""))
        for c in _cells(MAP)
        if c["cell_type"] == "code"
        for o in c["outputs"]
    }
    assert shown["course.routes()"] == str(course.routes())
    for name in course.ROUTES:
        assert shown[f'course.route("{name}")'] == str(course.route(name)), name


def test_every_route_lists_every_section_it_links_to():
    text = "\n".join("".join(c["source"]) for c in _cells(MAP) if c["cell_type"] == "markdown")
    for name in course.ROUTES:
        line = next(line for line in text.splitlines() if line.startswith(f"- **{name}**"))
        listed = {section.link for section, *_ in course.route_sections(name)}
        linked = [target for _, target in LINK.findall(line)]
        assert linked and set(linked) <= listed, (name, sorted(set(linked) - listed))
    ninety = [t for _, t in LINK.findall(next(x for x in text.splitlines() if x.startswith("- **90-minute")))]
    assert any(t.startswith("10_your_own_project.ipynb#cell-id=") for t in ninety)  # lesson 10 §1, at §1
    assert {(s.file, s.index) for s, *_ in course.route_sections("90-minute workshop")} >= {
        ("10_your_own_project.ipynb", 1)
    }


def test_the_guide_states_the_times_the_rule_computes_and_links_sections_that_exist():
    text = GUIDE.read_text()
    for name in course.ROUTES:
        line = next(line for line in text.splitlines() if line.startswith(f"- **{name}**"))
        assert f"{course.route_time(name)} min by the reading rule" in line, (name, line)
        listed = {section.link for section, *_ in course.route_sections(name)} | {
            course.by_number(n).file for n in course.ROUTES[name]
        }
        assert set(t for _, t in LINK.findall(line)) <= listed, line


def test_every_section_link_opens_at_a_heading_that_exists():
    """A section's link names the cell holding its heading; the heading's JupyterLab anchor (its text, spaces
    as '-') is one of the notebook's headings too."""
    for name in course.ROUTES:
        for section, *_ in course.route_sections(name):
            if section.index == 0:
                assert section.link == section.file
                continue
            cell = next(c for c in _cells(NOTEBOOKS / section.file) if c.get("id") == section.cell_id)
            assert f"## {section.heading}" in "".join(cell["source"]), (section.file, section.heading)
            assert section.link == f"{section.file}#cell-id={section.cell_id}"
            rendered = re.sub(r"`", "", section.heading).replace(" ", "-")
            assert section.anchor == rendered, section.heading


def test_the_recorded_runtime_is_inside_the_code_allowance():
    """The rule leaves the runtime out: on every route the seconds the notebooks' last execution recorded are
    less than a tenth of the minutes the rule already allows for running cells."""
    for name in course.ROUTES:
        used = [s for s, skim, _ in course.route_sections(name) if not skim]
        runtime_min = sum(s.counts.runtime_s for s in used) / 60
        allowance = sum(0.25 * s.counts.code + 2 * s.counts.widget + 6 * s.counts.exercise for s in used)
        assert runtime_min < allowance / 10, (name, runtime_min, allowance)


def test_the_rule_cuts_at_headings_counts_words_and_skips_optional_cells(tmp_path):
    cells = [
        {
            "cell_type": "markdown",
            "id": "a",
            "metadata": {},
            "source": "# 1 · T\n\nfour words [in](x.ipynb) here",
        },
        {"cell_type": "code", "id": "b", "metadata": {}, "source": "x = 1"},
        {
            "cell_type": "markdown",
            "id": "c",
            "metadata": {},
            "source": "tail · |---|\n## 1. The `loop_fn` part",
        },
        {"cell_type": "code", "id": "d", "metadata": {}, "source": "why.widget()"},
        {
            "cell_type": "markdown",
            "id": "e",
            "metadata": {"tags": ["optional"]},
            "source": "### (optional) " + "w " * 99,
        },
        {"cell_type": "code", "id": "f", "metadata": {"tags": ["exercise"]}, "source": "check(fn)"},
        {
            "cell_type": "markdown",
            "id": "g",
            "metadata": {},
            "source": "## 2. Questions to think about\n\n1. a?\n2. b?",
        },
    ]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    found = _route_time.sections(path)
    assert [(s.index, s.heading, s.cell_id) for s in found] == [
        (0, "1 · T", "a"),
        (1, "1. The `loop_fn` part", "c"),
        (2, "2. Questions to think about", "g"),
    ]
    assert found[0].counts.words == 2 + 4 + 1  # "1", "T", four words, "tail"; "·" and "|---|" are no words
    assert (found[1].counts.words, found[1].counts.widget, found[1].counts.exercise) == (4, 1, 1)
    assert found[1].anchor == "1.-The-loop_fn-part" and found[1].link == "n.ipynb#cell-id=c"
    assert found[2].counts.question == 2
    assert found[1].minutes == pytest.approx(4 / 120 + 2 + 6)
