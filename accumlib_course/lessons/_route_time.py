"""The reading rule: what a lesson's sections take in a workshop, computed from the notebooks' own cells.

A section is a notebook's ``#`` or ``##`` heading and every cell up to the next one (``###`` subsections
belong to their section); the lesson's opening (title, what you learn, set-up) is section 0. Its time is
its core path (cells tagged ``optional`` and the folded ``assertions`` checks left out) read and run:

- the words of its markdown cells at ``WORDS_PER_MINUTE``;
- ``course.MINUTES_PER`` for each code cell (run, read its output), widget, exercise and question;
- a section a route only skims: ``SKIM_MINUTES``, whatever its length.

>>> minutes_of(Counts(words=240, code=2, widget=1))
4.5
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

# 120 words a minute: technical text read aloud in a workshop, learners following on their own screens,
# formulas and code names spelled out. Speech runs at about 150; a dry run of the course read its prose at
# 120 to 180, and the rule takes the slow end so a route that fits here fits a slow room too.
WORDS_PER_MINUTE = 120
# A skimmed section: the instructor scrolls through it, names its point and its figure in a sentence or
# two, and leaves the text for after the workshop.
SKIM_MINUTES = 1.0
# The rule a lesson's planned minutes must meet (see minimum_minutes): reading rates per cell of the
# core path, from a dry run of the course (a markdown cell holds 60 to 140 words, read at about 200
# words a minute; a code cell is run and its output read).
MINUTES_PER = {"markdown": 0.5, "code": 0.25, "widget": 2.0, "exercise": 6.0, "question": 1.0}
WIDGET_CALL = re.compile(r"\b(widget|explorer|paste_box)\(")
# The allowances per cell of course.MINUTES_PER, less its flat markdown rate (words are counted instead).
ALLOWANCES = {"code": 0.25, "widget": 2.0, "exercise": 6.0, "question": 1.0}
SECTION_HEADING = re.compile(r"^#{1,2} (.+?)[ \t]*$", re.M)
QUESTIONS = re.compile(r"## (\d+\. )?Questions to think about")
WORD = re.compile(
    r"\S*[^\W_]\S*"
)  # a run without spaces holding a letter or digit ('|---|', '·' are not words)
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # a link counts as its text


def notebooks_dir() -> Path:
    """The lessons' folder: the repository's notebooks/, or the working directory where the lessons are (a
    notebooks-only copy, where the course map runs)."""
    for folder in (Path(__file__).resolve().parents[2] / "notebooks", Path.cwd()):
        if (folder / "01_why_accumulate.ipynb").is_file():
            return folder
    raise FileNotFoundError(
        f"the lesson notebooks must be in {Path(__file__).resolve().parents[2] / 'notebooks'} or the working "
        f"directory (got neither in {Path.cwd()}): the routes' times are computed from them"
    )


@dataclass
class Counts:
    words: int = 0
    code: int = 0
    widget: int = 0
    exercise: int = 0
    question: int = 0
    runtime_s: float = 0.0  # recorded by the notebook's last execution; covered by the code allowance


def minutes_of(counts: Counts) -> float:
    """The rule: words at WORDS_PER_MINUTE, plus the allowance of each code cell, widget, exercise and
    question."""
    return counts.words / WORDS_PER_MINUTE + sum(v * getattr(counts, k) for k, v in ALLOWANCES.items())


@dataclass
class Section:
    """One section of a lesson: its number in the notebook (0: the opening), its heading as written, the
    anchor JupyterLab gives that heading, and its core path counted."""

    file: str
    index: int
    heading: str
    cell_id: str = ""
    counts: Counts = field(default_factory=Counts)

    @property
    def anchor(self) -> str:
        """JupyterLab's id for the heading: its text with each space made '-' (rendermime's
        ``createHeaderId``); markdown marks such as backticks are gone from the rendered text.

        >>> Section("10_your_own_project.ipynb", 1, "1. The loop to copy").anchor
        '1.-The-loop-to-copy'
        """
        text = re.sub(r"`|\*+|(?<!\w)_+|_+(?!\w)", "", LINK.sub(r"\1", self.heading))
        return text.replace(" ", "-")

    @property
    def link(self) -> str:
        """Where a route's link points: the notebook for its opening; for a section, the cell holding its
        heading (``#cell-id=``). JupyterLab 4.6 scrolls a notebook that a link opens to a ``#cell-id=`` at
        once; a heading anchor (``#1.-The-loop-to-copy``) is looked up before the new notebook's headings
        are rendered, and the notebook stays at its top."""
        return self.file if self.index == 0 else f"{self.file}#cell-id={self.cell_id}"

    @property
    def minutes(self) -> float:
        return minutes_of(self.counts)


def words(markdown: str) -> int:
    """Words of a markdown cell: links count as their text, table rules and symbols not at all.

    >>> words("## 1. The loop\\n\\n| a | b |\\n|---|---|\\nSee [lesson 2](00_start_here.ipynb) · now")
    9
    """
    return len(WORD.findall(LINK.sub(r"\1", markdown)))


def sections(path: Path) -> list[Section]:
    """A notebook cut at its ``#`` and ``##`` headings, each section's core path counted."""
    path = Path(path)
    found: list[Section] = []
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        # a markdown cell is cut at its headings: text above a heading belongs to the section before it
        parts = SECTION_HEADING.split(source) if cell["cell_type"] == "markdown" else [source]
        pieces = [(None, parts[0])] + list(zip(parts[1::2], parts[2::2]))
        for title, text in pieces:
            if title is None and not text.strip():
                continue
            if title is not None or not found:
                found.append(Section(path.name, len(found), title or "", cell.get("id", "")))
            _count(found[-1].counts, cell, text if title is None else f"## {title}{text}")
        execution = cell["metadata"].get("execution", {})
        if "iopub.execute_input" in execution and "shell.execute_reply" in execution:
            found[-1].counts.runtime_s += _seconds(execution)
    return found


def _count(counts: Counts, cell: dict, source: str) -> None:
    tags = set(cell["metadata"].get("tags", []))
    if {"optional", "assertions"} & tags:
        return  # optional sections are skipped on a route; folded checks are run, not read
    if cell["cell_type"] == "markdown":
        counts.words += words(source)
        if QUESTIONS.match(source.lstrip()):
            counts.question += sum(bool(re.match(r"\s*\d+\.\s+\S", line)) for line in source.splitlines())
    elif "exercise" in tags:
        counts.exercise += 1
    elif WIDGET_CALL.search(source):
        counts.widget += 1
    else:
        counts.code += 1


def _seconds(execution: dict) -> float:
    start, end = (
        datetime.fromisoformat(execution[k].replace("Z", "+00:00"))
        for k in ("iopub.execute_input", "shell.execute_reply")
    )
    return (end - start).total_seconds()


def cell_counts(path: Path) -> dict[str, float]:
    """A notebook's core path, counted: cells of each kind (cells tagged ``optional``, and the folded
    checks tagged ``assertions``, left out),
    questions asked, and ``runtime_s``, the seconds its last recorded execution took (every cell).

    >>> counts = cell_counts(Path(__file__).parents[2] / "notebooks" / "01_why_accumulate.ipynb")
    >>> counts["exercise"], counts["markdown"] > 5
    (1, True)
    """
    cells = json.loads(Path(path).read_text())["cells"]
    counts: dict[str, float] = {kind: 0 for kind in MINUTES_PER}
    counts["runtime_s"] = 0.0
    for cell in cells:
        source = "".join(cell["source"])
        execution = cell["metadata"].get("execution")
        if execution and "iopub.execute_input" in execution and "shell.execute_reply" in execution:
            counts["runtime_s"] += _seconds(execution)
        if {"optional", "assertions"} & set(cell["metadata"].get("tags", [])):
            continue  # optional sections are skipped on a route; folded checks are run, not read
        if cell["cell_type"] == "markdown":
            counts["markdown"] += 1
            if re.match(r"## (\d+\. )?Questions to think about", source.lstrip()):
                counts["question"] += sum(
                    bool(re.match(r"\s*\d+\.\s+\S", line)) for line in source.splitlines()
                )
        elif "exercise" in cell["metadata"].get("tags", []):
            counts["exercise"] += 1
        elif WIDGET_CALL.search(source):
            counts["widget"] += 1
        else:
            counts["code"] += 1
    return counts


def minimum_minutes(path: Path) -> int:
    """The least a lesson's planned time may be: MINUTES_PER of each cell of its core path,
    plus its recorded runtime, rounded up to the minute."""
    counts = cell_counts(path)
    return math.ceil(sum(MINUTES_PER[kind] * counts[kind] for kind in MINUTES_PER) + counts["runtime_s"] / 60)
