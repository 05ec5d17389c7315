"""The course map and the lessons agree: every lesson listed, linked, titled alike, chained by "Next" links."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from accumlib.lessons import course

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSON_FILES = sorted(p.name for p in NOTEBOOKS.glob("0[1-9]_*.ipynb"))
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def _markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def test_the_course_lists_every_lesson_notebook_once_in_order():
    assert [lesson.file for lesson in course.COURSE] == LESSON_FILES
    assert [lesson.number for lesson in course.COURSE] == list(range(1, len(LESSON_FILES) + 1))


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_titles_match_the_notebooks(lesson):
    assert course.title_of(NOTEBOOKS / lesson.file) == lesson.title


def test_the_map_links_every_lesson_and_only_files_that_exist():
    text = "\n".join(_markdown(NOTEBOOKS / "00_start_here.ipynb"))
    targets = {target for _, target in LINK.findall(text)}
    assert {lesson.file for lesson in course.COURSE} <= targets
    for target in targets:
        if not target.startswith("http"):
            assert (NOTEBOOKS / target).exists(), f"00_start_here links {target}, which does not exist"


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_every_lesson_ends_with_questions_and_a_next_link(lesson):
    cells = _markdown(NOTEBOOKS / lesson.file)
    last = cells[-1].strip()
    links = LINK.findall(last)
    assert last.startswith("**Next:**"), f"{lesson.file}: last markdown cell is not the navigation line: {last[:80]!r}"
    following = [x for x in course.COURSE if x.number == lesson.number + 1]
    expected = ([(f"{following[0].number} · {following[0].title}", following[0].file)] if following else []) \
        + [("Course map", "00_start_here.ipynb")]
    assert links == expected
    questions = [c for c in cells if c.lstrip().startswith("## Questions to think about")]
    assert len(questions) == 1, f"{lesson.file}: no '## Questions to think about' cell"
    asked = [line for line in questions[0].splitlines() if re.match(r"\s*(\d+\.|-)\s+\S", line)]
    assert 2 <= len(asked) <= 4, f"{lesson.file}: {len(asked)} questions"


def test_prerequisites_come_first_and_the_routes_respect_them():
    for lesson in course.COURSE:
        assert all(n < lesson.number for n in lesson.requires)
    for name, numbers in course.ROUTES.items():
        for i, n in enumerate(numbers):
            missing = set(course.by_number(n).requires) - set(numbers[:i])
            assert not missing, f"route {name!r}: lesson {n} comes before its prerequisites {sorted(missing)}"


def test_a_lesson_number_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"number must be a lesson number between 1 and 9 \(got 0\)"):
        course.by_number(0)


def test_tables_render_as_html():
    html = course.table()._repr_html_()
    assert html.count("<tr>") == len(course.COURSE) + 1
    assert "Why accumulate gradients?" in html
