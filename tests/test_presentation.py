"""Presentation mode: lesson figures readable on a projector, with alt text built from their numbers,
lesson 3's figure without overlapping labels; every owned notebook's figures carry alt text with numbers."""

from __future__ import annotations

import base64
import itertools
import json
import re
from pathlib import Path

import pytest

from accumlib_course import _style
from accumlib_course.lessons import ragged_windows_and_tokens as ragged_windows

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))
ALT = re.compile(r'<img [^>]*alt="([^"]*)"')


def _text_boxes(fig):
    from matplotlib.text import Text

    _style.png(fig)
    renderer = fig.canvas.get_renderer()
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]


def _overlaps(fig):
    boxes = _text_boxes(fig)
    return [
        (a, b)
        for (a, ba), (b, bb) in itertools.combinations(boxes, 2)
        if ba.overlaps(bb)
        and ba.width * ba.height > 0
        and bb.width * bb.height > 0
        and min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 1
        and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 1
    ]


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
    states = (
        nb["metadata"]
        .get("widgets", {})
        .get("application/vnd.jupyter.widget-state+json", {})
        .get("state", {})
    )
    outputs += [o for s in states.values() for o in s.get("state", {}).get("outputs", [])]
    return [
        o
        for o in outputs
        if "image/png" in o.get("data", {}) or "<img" in "".join(o.get("data", {}).get("text/html", ""))
    ]


# every lesson
OWNED = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))


@pytest.mark.parametrize("name", OWNED)
def test_every_figure_in_the_notebook_has_alt_text_with_numbers(name):
    figures = _figure_outputs(NOTEBOOKS / name)
    assert figures, f"{name} shows no figure"
    for output in figures:
        html = "".join(output["data"].get("text/html", ""))
        alts = ALT.findall(html)
        assert alts, f"{name}: a figure without alt text"
        assert all(re.search(r"\d", alt) and len(alt) > 40 for alt in alts), alts
        # shown unscaled on a 1024-px projector
        for src in re.findall(r'src="data:image/png;base64,([^"]+)"', html):
            width = int.from_bytes(base64.b64decode(src)[16:20], "big")  # the PNG header's IHDR width
            assert width <= 1024, (name, width)


# --- the lessons' text: references not seeds, no test-runner talk, numbered headings, folded checks ---------

from accumlib_course.lessons import course  # noqa: E402

MAP_AND_OWNED = ["00_start_here.ipynb", *OWNED]
SEED_TALK = re.compile(r"(?i)seed[ -](documents?|posts?|blog|00\d)|\bseeds'|\bthe seed's\b|in the seeds\b")
EXTERNAL = re.compile(r"\]\((https?://[^)\s]+)\)")


def _cells(name):
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def _src(cell):
    return "".join(cell["source"])


@pytest.mark.parametrize("name", MAP_AND_OWNED)
def test_learner_text_cites_sources_not_seeds_and_never_mentions_the_test_runner(name):
    for cell in _cells(name):
        text = _src(cell)
        shown = (
            text
            if cell["cell_type"] == "markdown"
            else "".join(
                o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
                for o in cell.get("outputs", [])
            )
        )
        assert not SEED_TALK.search(shown), (name, SEED_TALK.search(shown).group(0), shown[:120])
        if cell["cell_type"] == "markdown":
            assert "nbval" not in text and "assertion" not in text, (name, text[:120])
        if cell["cell_type"] == "code":
            assert not re.search(r"seed-00\d", text), (name, text[:120])


def test_the_seed_check_can_fail():
    assert SEED_TALK.search("the seed post says") and SEED_TALK.search("GALLERY['seed-004-answer']")
    assert not SEED_TALK.search("seed = 0; torch.manual_seed(seed)")


@pytest.mark.parametrize("name", MAP_AND_OWNED)
def test_every_external_link_is_a_cited_reference(name):
    urls = {ref.url for ref in course.REFERENCES.values()}
    links = [u for c in _cells(name) if c["cell_type"] == "markdown" for u in EXTERNAL.findall(_src(c))]
    assert set(links) <= urls, set(links) - urls


def test_the_map_lists_every_reference_and_the_lessons_cite_the_issue_sources():
    text = "\n".join(_src(c) for c in _cells("00_start_here.ipynb"))
    assert all(ref.link() in text for ref in course.REFERENCES.values())
    cited = "\n".join(_src(c) for name in OWNED for c in _cells(name) if c["cell_type"] == "markdown")
    for key in ("stackoverflow", "mindspore", "huggingface", "unsloth", "pytorch-amp", "gan-article"):
        assert course.cite(key) in cited, key
    with pytest.raises(ValueError, match=r"key must be one of .* \(got 'seed-000'\)"):
        course.cite("seed-000")


@pytest.mark.parametrize("name", MAP_AND_OWNED)
def test_second_level_headings_are_numbered_in_order(name):
    headings = [
        line
        for c in _cells(name)
        if c["cell_type"] == "markdown"
        for line in _src(c).splitlines()
        if line.startswith("## ")
    ]
    assert headings, name
    numbers = [int(m.group(1)) if (m := re.match(r"## (\d+)\. \S", h)) else None for h in headings]
    assert numbers == list(range(1, len(headings) + 1)), headings


@pytest.mark.parametrize("name", OWNED)
def test_cells_that_only_check_claims_are_folded_and_tagged(name):
    for cell in _cells(name):
        if cell["cell_type"] != "code":
            continue
        lines = [
            line for line in _src(cell).splitlines() if line.strip() and not line.lstrip().startswith("#")
        ]
        checks = [
            line
            for line in lines
            if line.lstrip().startswith(("assert ", "for ", "print(", "from ", "import "))
            or line.startswith((" ", "\t"))
        ]
        only_checks = (
            any(line.startswith("assert ") for line in lines)
            and len(checks) == len(lines)
            and not any(re.match(r"\w+ = ", line) and "assert" not in line for line in lines)
        )
        if only_checks:
            assert "assertions" in cell["metadata"].get("tags", []), _src(cell)[:80]
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, _src(cell)[:80]


def test_lesson_1_defines_the_glossary_before_any_use():
    first = _src(_cells("01_why_accumulate.ipynb")[0])
    glossary = first[first.index("**Words this course uses**") : first.index("**What you will learn**")]
    for word in ("micro-batch", "item", "window", "oracle"):
        assert f"- **{word}**:" in glossary, word
    before = first[: first.index("**Words this course uses**")]
    assert not re.search(r"(?i)micro-batch|window|oracle", before)


def test_naive_at_lr_over_k_is_the_divided_loop_at_lr_even_with_a_short_last_window():
    """Lesson 1, question 2: under SGD, the naive loop at lr / k and the loss / k loop at lr take identical
    steps on every window, the short last one included (both divide by k there); neither is the exact loop."""
    import torch

    import accumlib

    task = accumlib.get_task("mlp-digits")
    data = accumlib.data.digits(110)  # 14 micro-batches of 8 (the last of 6): windows of 4, 4, 4 and 2

    def train(loop, lr):
        model = task.make_model(0)
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        loop(model, torch.optim.SGD(model.parameters(), lr=lr), loader, task.item_losses, accum_steps=4)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    naive, divided, exact = (
        train(accumlib.naive, 0.1 / 4),
        train(accumlib.normalized, 0.1),
        train(accumlib.ragged, 0.1),
    )
    # the same floats: (lr / k) * sum == lr * sum / k, exactly for k a power of 2
    assert torch.equal(naive, divided)
    assert (divided - exact).abs().max() > 1e-3  # both are wrong on the short window


# --- the instructor's guide ------------------------------------------------------------------------------

GUIDE = NOTEBOOKS / "INSTRUCTORS.md"


def _questions(name):
    cell = next(
        _src(c) for c in _cells(name) if re.match(r"## (\d+\. )?Questions to think about", _src(c).lstrip())
    )
    return [line for line in cell.splitlines() if re.match(r"\d+\.\s", line)]


def _guide_section(number):
    text = GUIDE.read_text()
    start = text.index(f"### Lesson {number} · ")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else None].split("\n## ")[0]


@pytest.mark.parametrize("lesson", course.COURSE, ids=lambda lesson: lesson.file)
def test_the_guide_answers_every_question_and_states_the_planned_time(lesson):
    section = _guide_section(lesson.number)
    assert section.startswith(f"### Lesson {lesson.number} · {lesson.title}")
    answers = section[section.index("**Answers.**") :]
    numbered = [line for line in answers.splitlines() if re.match(r"\d+\.\s", line)]
    assert len(numbered) == len(_questions(lesson.file)), (lesson.file, numbered)
    row = next(line for line in GUIDE.read_text().splitlines() if line.startswith(f"| {lesson.number} | "))
    assert f"| {lesson.minutes} min |" in row and lesson.file in row


def test_the_guide_states_each_routes_slack_and_every_reference():
    text = GUIDE.read_text()
    for name in course.ROUTES:
        line = next(line for line in text.splitlines() if line.startswith(f"- **{name}**"))
        assert (
            f"**{course.slack(name)} min of slack**" in line
            and f"in {course.ROUTE_MINUTES[name]} min" in line
        )
    assert all(ref.link() in text for ref in course.REFERENCES.values())


def test_the_guides_arithmetic_for_lesson_3_question_1():
    """10 000 samples, micro-batch 32, k = 8: 313 micro-batches, the last window one micro-batch of 16."""
    n, b, k = 10_000, 32, 8
    sizes = [min(b, n - i) for i in range(0, n, b)]
    windows = [sizes[i : i + k] for i in range(0, len(sizes), k)]
    assert (len(sizes), len(windows), windows[-1]) == (313, 40, [16])
    assert "313 = 39 × 8 + 1" in _guide_section(3) and "one\n   micro-batch of 16" in _guide_section(3)
