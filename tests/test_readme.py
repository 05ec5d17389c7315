"""The README's examples and figures (and those of the docs/ pages it leads to) come from the code as it
stands.

The verify example is run exactly as written and must print what the README shows; the
reference-loop table must match a fresh run row for row. Printed numbers are compared within
float32 rounding, never digit by digit (tests/_any_machine.py states the rule): the last digits
depend on the CPU's kernels, and CI runs on Intel and AMD hosts. So that no line of the README
rests on this machine's last digits, every example runs with its models' initial parameters
perturbed by a relative 1e-7 (about one float32 rounding, what another CPU's kernels do).
"""

import contextlib
import io
import re
from pathlib import Path

import _docs
from _any_machine import assert_same_printout, perturbed_init, same_number

from accumlib import TASKS
from accumlib.harness import verdict_text
from accumlib.loops import ALL, LOOPS
from accumlib.reference import check_reference_loops

README = _docs.text()  # the README and the docs/ pages it leads to


def _block_after(heading: str, lang: str, nth: int = 0) -> str:
    section = README.split(heading, 1)[1]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)[nth]


def test_verify_example_prints_what_the_readme_shows():
    code = _block_after("## Verify your own loop", "python")
    shown = _block_after("## Verify your own loop", "text")
    assert_same_printout(_run_block(code), shown)
    assert "[tail-dropped]" in shown  # the example is there to show this finding


def test_every_argument_example_prints_what_the_readme_shows():
    """optimizer as a factory, collate_fn for padded sequences, max_steps: run as written."""
    code = _block_after("### Every argument", "python")
    shown = _block_after("### Every argument", "text")
    assert_same_printout(_run_block(code), shown)
    for argument in (
        "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)",
        "collate_fn=pad_collate",
        "max_steps=2",
    ):
        assert argument in code


def test_reference_table_matches_a_fresh_run():
    shown = _block_after("## The idea in one table", "text")
    rows = {}
    for line in shown.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 10 and cells[0] in ALL:
            rows[cells[0], cells[1]] = cells
    with perturbed_init() as moved:
        table = check_reference_loops()
    assert moved.tensors > 0
    assert len(rows) == len(table.rows) == len(LOOPS) * len(TASKS)  # every tabulated loop on every task
    for r in table.rows:
        loop, task, k, err, cos, steps, items, against, verdict, expected = rows[r.loop, r.task][:10]
        assert (int(k), steps, items) == (
            r.accum_steps,
            f"{r.steps}/{r.expected_steps}",
            f"{r.items_used}/{r.items_available}",
        )
        # verify's codes, "ok" for none (accumlib.harness.verdict_text), and what it judged against
        assert (against, verdict, expected) == (
            r.judged_against,
            verdict_text(r.verdict),
            verdict_text(r.expected),
        )
        if r.loop == "amp":  # bf16 rounding depends on the CPU's kernels (1.77e-03 on CI, 1.79e-03 elsewhere)
            assert (
                abs(float(err) - r.max_rel_error) <= 0.1 * r.max_rel_error
                and abs(float(cos) - r.min_cosine) <= 1e-3
            )
            continue
        assert same_number(f"{r.max_rel_error:.2e}", err) and same_number(f"{r.min_cosine:.4f}", cos)
    assert f"{len(table.rows)}/{len(table.rows)} verdicts hold" in shown


def test_every_registered_loop_has_a_row_in_the_readmes_loop_table():
    """The hand-written table of "The idea in one table" is the registry told in prose: a loop file
    without its row there (or a row without its file) fails here, by name."""
    section = _section("## The idea in one table").split("```", 1)[0]
    rows = [m.group(1) for line in section.splitlines() if (m := re.match(r"\|\s*`([a-z_0-9]+)`\s*\|", line))]
    assert rows, "no loop table found under '## The idea in one table'"
    missing = [name for name in ALL if name not in rows]
    assert not missing, f"README.md's loop table has no row for {missing}"
    assert sorted(rows) == sorted(ALL), f"rows for loops that are not registered: {set(rows) - set(ALL)}"
    assert [r for r in rows if r in LOOPS] == list(LOOPS)  # in the registry's order


def test_every_finding_code_is_in_the_readme_with_its_kind():
    """The README's table of codes is the one table (accumlib.CODES) told in prose: none missing, kinds
    equal."""
    from accumlib import CODES

    section = README.split("## Verify your own loop", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for code in re.findall(r"`([a-z-]+)`", cells[0]):
                rows[code] = cells[1]
    assert rows == {code: c.kind for code, c in CODES.items()}


def test_the_table_of_codes_is_written_from_the_codes_table():
    """docs/verify.md's table is ``tools/codes_table.py``'s rows, row for row: a code added to CODES, or a
    meaning changed there, shows here only once the tool has run."""
    import sys

    from accumlib import CODES

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import codes_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "verify.md").read_text().split("\n")
    start, end = codes_table.table_span(page)
    assert page[start:end] == codes_table.rows()
    assert all(code.meaning.strip() for code in CODES.values()), "every code says what it means"
    stale = page[: start + 2] + page[start + 3 : end]  # a row gone: the check sees it
    assert stale != codes_table.rows()


def test_the_readme_states_no_gallery_size():
    """A gallery loop added by the map touches no README sentence: the size is not stated."""
    assert not re.search(r"GALLERY` holds \d+", " ".join(README.split()))


def _section(heading: str) -> str:
    return README.split(heading, 1)[1].split("\n## ", 1)[0]


def _run_block(code: str) -> str:
    """What a README block prints, run as written with its models' initialisation perturbed."""
    out = io.StringIO()
    with perturbed_init() as moved, contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert moved.tensors > 0, "the example built no model through torch's initialisers: nothing was perturbed"
    return out.getvalue()


import pytest  # noqa: E402


# verify_trainer on GPT-2, verify_fit on Lightning, Accelerate's CLM loop
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_framework_examples_print_what_the_readme_shows(nth, monkeypatch):
    """Each self-contained example of "Verify a framework's own loop" prints the block after it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    section = _section("## Verify a framework's own loop")
    code = re.findall(r"```python\n(.*?)```", section, re.S)[nth]
    shown = re.findall(r"```text\n(.*?)```", section, re.S)[nth - 1]
    assert_same_printout(_run_block(code), shown)


def test_survey_summaries_in_the_readme_are_the_committed_surveys():
    from accumlib_course import survey

    section = _section("## Verify a framework's own loop")
    surveys = Path(__file__).resolve().parents[1] / "surveys"
    files = sorted(surveys.glob("transformers-*.json"))
    assert len(files) == 2
    for f in files:
        assert survey.summary(survey.Survey.from_json(f.read_text())).strip() in section


def test_no_link_leads_to_a_placeholder():
    """A learner who clicks a link gets a page: no link with an unfilled owner (the Binder badge pointed at
    OWNER/accumlib, an error page), in the README, the notebooks' text or the instructor's guide."""
    import json

    root = Path(__file__).resolve().parents[1]
    texts = {
        "README.md": README,
        "notebooks/INSTRUCTORS.md": (root / "notebooks" / "INSTRUCTORS.md").read_text(),
    }
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for name, text in texts.items():
        targets = re.findall(r"\]\(([^)\s]+)\)", text)  # markdown link targets: what a click opens
        bad = [t for t in targets if re.search(r"OWNER|<owner>|<repository>", t, re.I)]
        assert not bad, f"{name} links to a page that does not exist yet: {bad}"
