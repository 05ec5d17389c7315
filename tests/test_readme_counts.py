"""Every count the README states in prose is computed here from the code, so a sentence cannot drift.

``CLAIMS`` is the table: a README phrase with its count, and how to count the same thing in the code (names
in ``accumlib.__all__``, lessons, exit statuses, routes and their slack, the verify arguments an example
uses). A README sentence that counts one of these things without a claim fails
``test_every_count_of_the_code_in_the_readme_is_claimed``; changing any claimed number fails
``test_a_drifted_count_is_caught`` (each claim is checked that way, on a copy of the text).

Counts read elsewhere are not repeated here: the Goals table (rows of ``benchmarks/results/latest.md``,
written by ``make bench``), the survey summaries (tests/test_readme.py), the example outputs (run by
tests/test_readme.py) and the hint's three stages (tests/test_exercises.py).
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import _docs
import pytest

import accumlib

REPO = Path(__file__).resolve().parents[1]
README = _docs.text()  # the README and the docs/ pages it leads to

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"]


def _number(text: str) -> int:
    text = text.lower()
    return WORDS.index(text) if text in WORDS else int(text)


def _lessons() -> int:
    return len([p for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00")])


def _exit_statuses() -> list[int]:
    from accumlib._verify.report import EXIT_STATUS

    return sorted(EXIT_STATUS.values())


def _optional_arguments_used(text: str) -> int:
    """How many of verify's optional arguments the "Every argument" example passes."""
    code = re.findall(r"```python\n(.*?)```", text.split("### Every argument", 1)[1], re.S)[0]
    call = next(
        n
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "verify"
    )
    optional = {
        p.name for p in inspect.signature(accumlib.verify).parameters.values() if p.default is not p.empty
    }
    return len({k.arg for k in call.keywords} & optional)


def _routes() -> dict[str, tuple[int, ...]]:
    from accumlib_course.lessons import course

    return course.ROUTES


def _route(name: str) -> tuple[int, ...]:
    return _routes()[name]


def _slack(name: str) -> int:
    from accumlib_course.lessons import course

    return course.slack(name)


NINETY, HALF_DAY = "90-minute workshop", "half day (4 hours with breaks)"

# phrase (one group: the stated count) -> the count from the code. A space in a phrase matches any run of
# whitespace, so a sentence may be re-wrapped.
CLAIMS: dict[str, Callable[[str], int]] = {
    r"`import accumlib` offers (\d+) names": lambda _: len(accumlib.__all__),
    r"the course map\), lessons 1–(\d+)": lambda _: _lessons(),
    r"`report\.status` tells (\w+) outcomes apart": lambda _: len(_exit_statuses()),
    # the status table under it: one row per exit status
    r"apart, as the command line's exit status does:\n\n(?:.*\n){2}((?:\|.*\n)+)": lambda _: len(
        _exit_statuses()
    ),
    r"(\d) verify could not judge": lambda _: max(_exit_statuses()),
    r"(\w+) of the optional ones together": _optional_arguments_used,
    r"prerequisites, and (\w+) routes": lambda _: len(_routes()),
    r"workshop: lessons 1, 2, 3, (\d+), with": lambda _: _route(NINETY)[-1],
    r"lessons 1, 2, 3, 10, with (\d+) minutes of slack": lambda _: _slack(NINETY),
    r"a half day:\s+1, 2, 3, 4, 7, 8, 9, (\d+)": lambda _: _route(HALF_DAY)[-1],
    r"a half day:\s+[\d, ]+, with (\d+) minutes of slack": lambda _: _slack(HALF_DAY),
    r"(\w+) complete loops, one file each in `accumlib_course/examples/plain/`": lambda _: len(
        [p for p in (REPO / "accumlib_course/examples/plain").glob("*.py") if p.name != "__init__.py"]
    ),
}

# Counting phrases that count nothing in the code, each with its reason.
NOT_COUNTS = {
    "one short file": "the style rule: one file per loop variant",
    "one per file": "the layout: one reference loop per file",
    "one file": "a lesson module per notebook, one file to read",
    "3 the loop": "exit status 3 (claimed with the other statuses)",
    "three stages": "a hint's stages: tests/test_exercises.py asserts len(grade.stages) == 3",
    "One reference loop": "lesson 10's take-away: one loop, not a count of the code",
}

# "<count> <thing of the code>" and "<thing> <count>": what a README sentence counts.
COUNT = r"(?:\d+|" + "|".join(WORDS[1:]) + r")"
THING = (
    r"(?:names|lessons|notebooks|outcomes|statuses|codes|findings|loops|tasks|routes|stages|modules|files|"
    r"rows|arguments|optional ones|controls|exit statuses|sections|loop|file)"
)
COUNTING = re.compile(rf"\b{COUNT}\s+(?:[a-z-]+\s+)?{THING}\b|\blessons 1[–-]\d+", re.I)


def _find(phrase: str, text: str) -> re.Match | None:
    return re.search(phrase.replace(" ", r"\s+"), text)


def drifted(text: str) -> list[str]:
    """Each claim whose stated count differs from the code's (or whose phrase is gone)."""
    out = []
    for phrase, count in CLAIMS.items():
        m = _find(phrase, text)
        if not m:
            out.append(f"README.md no longer says {phrase!r}: update CLAIMS with the sentence")
            continue
        stated = m.group(1)
        if stated.startswith("|"):  # a table: its rows are the count
            value = len([line for line in stated.splitlines() if line.startswith("| ")])
        else:
            value = _number(stated)
        if value != count(text):
            out.append(f"README.md says {m.group(0)!r}: the code counts {count(text)}")
    return out


def _scanned(text: str) -> str:
    """The README less what other tests read: run examples and their outputs, the Performance section
    (make bench's rows), the survey summaries."""
    text = re.sub(r"```(?:python|text|bash|console)\n.*?```", "", text, flags=re.S)
    text = re.sub(r"## Performance\n.*?(?=\n## )", "", text, flags=re.S)
    return re.sub(r"### Which Transformers models accumulate exactly.*?(?=\n### )", "", text, flags=re.S)


def test_the_readmes_counts_are_the_codes():
    assert drifted(README) == []


@pytest.mark.parametrize("phrase", list(CLAIMS))
def test_a_drifted_count_is_caught(phrase):
    m = _find(phrase, README)
    assert m, phrase
    stated = m.group(1)
    if stated.startswith("|"):
        changed = README[: m.start(1)] + stated.split("\n", 1)[1] + README[m.end(1) :]  # a row dropped
    else:
        n = _number(stated)
        new = (
            str(n + 1)
            if stated.isdigit()
            else WORDS[n + 1].capitalize()
            if stated[0].isupper()
            else WORDS[n + 1]
        )
        changed = README[: m.start(1)] + new + README[m.end(1) :]
    assert drifted(changed), f"{m.group(0)!r} changed and no claim failed"


def test_every_count_of_the_code_in_the_readme_is_claimed():
    scanned = _scanned(README)
    claimed = [m.span() for phrase in CLAIMS for m in re.finditer(phrase.replace(" ", r"\s+"), scanned)]
    unclaimed = [
        m.group(0)
        for m in COUNTING.finditer(scanned)
        if not any(a <= m.start() < b for a, b in claimed) and " ".join(m.group(0).split()) not in NOT_COUNTS
    ]
    assert unclaimed == [], (
        f"README.md counts these without a claim in tests/test_readme_counts.py: {unclaimed}"
    )


def test_an_unclaimed_count_is_caught():
    sentence = "\n\nThe verifier knows 42 codes.\n"
    scanned = _scanned(README + sentence)
    assert any(m.group(0) == "42 codes" for m in COUNTING.finditer(scanned))


def test_the_goal_rows_are_make_benchs():
    """The README's Goals table is make bench's (benchmarks/results/latest.md), row for row."""

    def rows(text: str) -> list[str]:
        goals = text.split("### Goals", 1)[1].split("\n###", 1)[0]
        return [
            line for line in goals.splitlines() if line.startswith("| ") and not line.startswith("| goal")
        ]

    section = README.split("## Performance", 1)[1].split("\n## ", 1)[0]
    bench = rows((REPO / "benchmarks" / "results" / "latest.md").read_text())
    missing = [row[:60] for row in rows(section) if row not in bench]
    assert rows(section) and not missing, f"README goal rows that make bench did not write: {missing}"


def test_the_signature_shown_is_verifys():
    section = README.split("## Verify your own loop", 1)[1]
    shown = re.search(r"`accumlib\.verify\(([^`]*?)\) -> Report`", section, re.S).group(1)
    names = [a.strip().split("=")[0] for a in " ".join(shown.split()).split(",") if a.strip() not in ("*",)]
    assert names == list(inspect.signature(accumlib.verify).parameters), names
