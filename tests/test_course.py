"""The course map and the lessons agree: every lesson listed, linked, titled alike, chained by "Next"
links.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from accumlib_course.lessons import course

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSON_FILES = sorted(
    (p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_")),
    key=lambda name: int(name.split("_", 1)[0]),
)
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def _markdown(path: Path) -> list[str]:
    return [
        "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"
    ]


LESSONS_DIR = Path(course.__file__).parent


def _anchor_ok(path: Path, anchor: str) -> bool:
    """A heading's anchor as JupyterLab forms it (its text, spaces as '-'), or ``cell-id=<id>`` of a markdown
    cell that holds a heading."""
    cells = json.loads(path.read_text())["cells"]
    if anchor.startswith("cell-id="):
        held = [c for c in cells if c.get("id") == anchor.removeprefix("cell-id=")]
        return (
            bool(held) and held[0]["cell_type"] == "markdown" and "\n#" in "\n" + "".join(held[0]["source"])
        )
    headings = [
        line.lstrip("#").strip().replace(" ", "-")
        for cell in _markdown(path)
        for line in cell.splitlines()
        if line.startswith("#")
    ]
    return anchor in headings


def _code(path: Path) -> str:
    return "\n".join(
        "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
    )


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_every_lesson_notebook_is_taught_from_the_module_named_after_it(lesson):
    """NN_<name>.ipynb: the course map names accumlib_course/lessons/<name>.py, which the notebook imports."""
    name = lesson.file.removesuffix(".ipynb").split("_", 1)[1]
    assert lesson.module == name and (LESSONS_DIR / f"{name}.py").is_file(), name
    assert importlib.import_module(f"accumlib_course.lessons.{name}").__file__ == str(
        LESSONS_DIR / f"{name}.py"
    )
    assert re.search(
        rf"^from accumlib_course\.lessons import {name}\b", _code(NOTEBOOKS / lesson.file), re.M
    ), name


def test_no_public_lesson_module_is_left_without_its_notebook():
    """A public module of accumlib_course.lessons is a lesson's (or the course map): a module kept under an
    old name (``norms.py`` for lesson 5) has no notebook of its name and fails here."""
    public = {p.stem for p in LESSONS_DIR.glob("*.py") if not p.stem.startswith("_")} - {"course"}
    assert public == {lesson.module for lesson in course.COURSE}
    renamed = course.Lesson(5, "05_batchnorm_vs_groupnorm.ipynb", "t", "t", 1)
    assert renamed.module == "batchnorm_vs_groupnorm" != "norms"


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
            path, _, anchor = target.partition("#")
            assert (NOTEBOOKS / path).exists(), f"00_start_here links {target}, which does not exist"
            if anchor:  # JupyterLab's heading anchor, or the cell holding a heading (#cell-id=)
                assert _anchor_ok(NOTEBOOKS / path, anchor), f"00_start_here links {target}: no such heading"


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_every_lesson_ends_with_questions_and_a_next_link(lesson):
    cells = _markdown(NOTEBOOKS / lesson.file)
    last = cells[-1].strip()
    links = LINK.findall(last)
    assert last.startswith("**Next:**"), (
        f"{lesson.file}: last markdown cell is not the navigation line: {last[:80]!r}"
    )
    following = [x for x in course.COURSE if x.number == lesson.number + 1]
    expected = (
        [(f"{following[0].number} · {following[0].title}", following[0].file)] if following else []
    ) + [("Course map", "00_start_here.ipynb")]
    assert links == expected
    questions = [c for c in cells if re.match(r"## (\d+\. )?Questions to think about", c.lstrip())]
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
    with pytest.raises(
        ValueError, match=r"number must be an integer between 1 and 10; a lesson number \(got 0\)"
    ):
        course.by_number(0)


def test_tables_render_as_html():
    html = course.table()._repr_html_()
    assert html.count("<tr>") == len(course.COURSE) + 1
    assert "Why accumulate gradients?" in html


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_every_stated_time_meets_the_rule_of_cells_and_runtime(lesson):
    """minutes >= 0.5 per markdown cell + 0.25 per code cell + 2 per widget + 6 per exercise + 1 per
    question (core path: cells tagged 'optional' left out) + the recorded runtime; and not padded past it."""
    least = course.minimum_minutes(NOTEBOOKS / lesson.file)
    assert least <= lesson.minutes <= least + 10, (
        f"{lesson.file}: states {lesson.minutes} min, the rule gives {least}"
    )


def _notebook(tmp_path, cells):
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _cell(kind, source, tags=(), seconds=None):
    metadata = {"tags": list(tags)} if tags else {}
    if seconds is not None:
        metadata["execution"] = {
            "iopub.execute_input": "2026-01-01T00:00:00.000000Z",
            "shell.execute_reply": f"2026-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}.000000Z",
        }
    return {"cell_type": kind, "metadata": metadata, "source": source}


def test_the_rule_counts_each_kind_of_cell_and_the_runtime_and_skips_optional_cells(tmp_path):
    cells = [
        _cell("markdown", "# 1 · T"),
        _cell("markdown", "## Questions to think about\n\n1. one?\n2. two?\n"),
        _cell("code", "x = 1", seconds=90),
        _cell("code", "why.widget(device=device)", seconds=30),
        _cell("code", "why.EXERCISE.check(train_fn)", tags=["exercise"]),
    ]
    counts = course.cell_counts(_notebook(tmp_path, cells))
    assert counts == {"markdown": 2, "code": 1, "widget": 1, "exercise": 1, "question": 2, "runtime_s": 120.0}
    # 1 + 0.25 + 2 + 6 + 2 + 2 (runtime) = 13.25 -> 14
    assert course.minimum_minutes(_notebook(tmp_path, cells)) == 14
    optional = cells + [
        _cell("markdown", "### (optional) more", tags=["optional"]),
        _cell("code", "more()", tags=["optional"], seconds=60),
    ]
    # optional reading is not planned time
    assert course.cell_counts(_notebook(tmp_path, optional))["markdown"] == 2
    # but its runtime is (Run All runs it)
    assert course.minimum_minutes(_notebook(tmp_path, optional)) == 15
    more = [_cell("markdown", "more text"), _cell("markdown", "and more")]  # 13.25 + 1 = 14.25 -> 15
    assert course.minimum_minutes(_notebook(tmp_path, cells + more)) == 15


def test_the_routes_leave_slack_by_the_reading_rule():
    for name in course.ROUTES:
        assert (
            course.slack(name) >= 15
            and course.slack(name) >= course.SLACK_MIN_FRACTION * course.ROUTE_MINUTES[name]
        ), (name, course.slack(name))
    assert course.ROUTE_MINUTES["90-minute workshop"] == 90
    half_day = next(numbers for name, numbers in course.ROUTES.items() if name.startswith("half day"))
    assert 8 in half_day
    with pytest.raises(ValueError, match=r"route must be one of .* \(got 'two days'\)"):
        course.slack("two days")


def test_the_routes_table_shows_each_routes_slack():
    text = str(course.routes())
    for name in course.ROUTES:
        row = next(line for line in text.splitlines() if line.startswith(name))
        assert f"{course.slack(name)} min" in row and f"{course.ROUTE_MINUTES[name]} min" in row


def test_the_map_shows_each_route_as_links_to_its_lessons_in_order():
    """Each route's line links its lessons in order: a notebook where the route starts at its opening,
    the section's cell (#cell-id=) where it starts further in."""
    text = "\n".join(_markdown(NOTEBOOKS / "00_start_here.ipynb"))
    for name in course.ROUTES:
        line = next(line for line in text.splitlines() if line.startswith(f"- **{name}**"))
        used = course.route_sections(name)
        first = [s.link for i, (s, *_) in enumerate(used) if i == 0 or used[i - 1][0].file != s.file]
        linked = [target for _, target in LINK.findall(line)]
        assert [t for t in linked if "#" not in t or t in first] == first, name


def test_lesson_1_marks_its_optional_parts_and_states_the_core_path():
    cells = json.loads((NOTEBOOKS / "01_why_accumulate.ipynb").read_text())["cells"]
    optional = [c for c in cells if "optional" in c["metadata"].get("tags", [])]
    headings = [
        "".join(c["source"]).splitlines()[0]
        for c in optional
        if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("#")
    ]
    assert headings and all("(optional)" in h for h in headings), headings
    assert not any("exercise" in c["metadata"].get("tags", []) for c in optional)


# --- sources cited by their own addresses, links that lead somewhere ------------------------------------

GUIDE = NOTEBOOKS / "INSTRUCTORS.md"
ALL_NOTEBOOKS = sorted(NOTEBOOKS.glob("*.ipynb"))
URL = re.compile(r"https?://[^\s)>\]\"'`]+")
SEARCH = re.compile(r"[?&]q=|search\?")  # a search engine's (or a site's own search) query, not a source
HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")


def _cited_texts() -> dict[str, str]:
    """Every text that cites or links: each notebook's markdown, the instructor's guide."""
    texts = {p.name: "\n".join(_markdown(p)) for p in ALL_NOTEBOOKS}
    texts[GUIDE.name] = GUIDE.read_text()
    return texts


def _search_links(text: str) -> list[str]:
    return [u for u in URL.findall(text) if SEARCH.search(u)]


def test_no_cited_link_is_a_search_query():
    """A cited source links to its own address or to nothing (title, author, venue): never to a search for
    its words."""
    for key, ref in course.REFERENCES.items():
        assert ref.url is None or not SEARCH.search(ref.url), (key, ref.url)
    for name, text in _cited_texts().items():
        assert not _search_links(text), (name, _search_links(text))


def test_the_search_query_check_can_fail():
    for query in (
        "[A post](https://www.google.com/search?q=%22How+Gradient+accumulation+is+implemented%22)",
        "[Q](https://stackoverflow.com/search?q=gradient+accumulation+GradScaler)",
        "see https://duckduckgo.com/?q=gradient+accumulation",
        "[A](https://www.bing.com/search?form=QBLH&q=GANs+and+other+Nightmares)",
    ):
        assert _search_links(query), query
    assert not _search_links(course.cite("huggingface") + " https://unsloth.ai/blog/gradient")


def test_a_source_without_an_address_is_cited_by_title_author_and_venue():
    for key, ref in course.REFERENCES.items():
        if ref.url is None:
            assert ref.by and ref.link() == f"*{ref.title}* ({ref.by})" and "](" not in ref.link(), key
        else:
            assert ref.url.startswith("https://") and ref.link() == f"[{ref.title}]({ref.url})", key
    assert "none: " in str(course.references())


def _strings(path: Path) -> list[str]:
    """Every string constant of a module: the texts a lesson shows (tables, hints, captions, alt text)."""
    import ast

    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _bad_links(text: str) -> list[str]:
    """Relative link targets that leave notebooks/ or lead nowhere: in a notebooks-only copy, an installed
    package or JupyterLab, only notebooks/ is there. Anchors into a notebook must name one of its headings."""
    bad = []
    for target in [t for _, t in LINK.findall(text)] + HREF.findall(text):
        target = target.strip().split(" ", 1)[0]  # [t](path "title")
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # an address (https:, mailto:) or an anchor in the same document
        path, _, anchor = target.partition("#")
        resolved = (NOTEBOOKS / path).resolve()
        if resolved != NOTEBOOKS and NOTEBOOKS not in resolved.parents:
            bad.append(f"{target} (outside notebooks/)")
        elif not resolved.exists():
            bad.append(f"{target} (no such file in notebooks/)")
        elif anchor and resolved.suffix == ".ipynb" and not _anchor_ok(resolved, anchor):
            bad.append(f"{target} (no such heading)")
    return bad


def test_links_stay_inside_notebooks_and_resolve():
    """Notebooks' markdown, the instructor's guide and the lessons' texts link only to files in notebooks/
    that exist (other lessons, solutions/, the guide); a path elsewhere in the repository is named, not
    linked."""
    for name, text in _cited_texts().items():
        assert not _bad_links(text), (name, _bad_links(text))
    for module in sorted(LESSONS_DIR.glob("*.py")):
        text = "\n".join(_strings(module))
        assert not _bad_links(text), (module.name, _bad_links(text))
    linked = {
        t for text in _cited_texts().values() for _, t in LINK.findall(text) if not t.startswith("http")
    }
    assert {"09_real_bugs.ipynb", "INSTRUCTORS.md", "solutions/"} <= linked  # the check saw real links


def test_the_link_check_can_fail():
    assert _bad_links("[trace](../docs/transformers-label-count.md)") == [
        "../docs/transformers-label-count.md (outside notebooks/)"
    ]
    assert _bad_links("[trace](docs/transformers-label-count.md)") == [
        "docs/transformers-label-count.md (no such file in notebooks/)"
    ]
    assert _bad_links('<a href="../tests/test_verify_trl.py">tests</a>') == [
        "../tests/test_verify_trl.py (outside notebooks/)"
    ]
    assert _bad_links("[10](10_your_own_project.ipynb#1.-No-such-section)") == [
        "10_your_own_project.ipynb#1.-No-such-section (no such heading)"
    ]
    assert _bad_links("[ten](99_no_lesson.ipynb)") == ["99_no_lesson.ipynb (no such file in notebooks/)"]
    fine = (
        "[9](09_real_bugs.ipynb) [10](10_your_own_project.ipynb#1.-The-loop-to-copy) [s](solutions/) [h](#a)"
    )
    assert _bad_links(fine + " [HF](https://huggingface.co/blog/gradient_accumulation)") == []


REPO_PATH = re.compile(r"`((?:docs|tests|surveys|benchmarks|tools)/[^`]*)`")


def _unnamed_repository_paths(text: str) -> list[str]:
    """Paths of the repository outside notebooks/ (docs/, tests/, ...) mentioned without saying they are
    the repository's: a learner with the package or a copy of notebooks/ would look for them in vain."""
    unnamed = []
    for m in REPO_PATH.finditer(text):
        start = max(text.rfind(". ", 0, m.start()), text.rfind("\n\n", 0, m.start()), 0)
        if "repository" not in text[start : m.start()]:
            unnamed.append(m.group(1))
    return unnamed


@pytest.mark.parametrize("name", [*(lesson.file for lesson in course.COURSE), GUIDE.name])
def test_a_path_outside_notebooks_is_named_as_the_repositorys(name):
    text = GUIDE.read_text() if name == GUIDE.name else "\n\n".join(_markdown(NOTEBOOKS / name))
    assert not _unnamed_repository_paths(text), (name, _unnamed_repository_paths(text))


def test_the_repository_path_check_can_fail():
    assert _unnamed_repository_paths("The cause is traced in `docs/transformers-label-count.md`.") == [
        "docs/transformers-label-count.md"
    ]
    assert _unnamed_repository_paths("Exact on Llama (`tests/test_verify_trl.py`).") == [
        "tests/test_verify_trl.py"
    ]
    assert not _unnamed_repository_paths("The accumlib repository traces it in `docs/trl-peft-bugs.md`.")
