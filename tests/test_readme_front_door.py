"""The README is the front door: short, every command in it runs as written, and what it tabulates (the
lessons, the report's parameters) is read off the code. Every link of the README and of the docs/ pages
it leads to opens a file that exists, at a heading that exists.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import _docs
from _any_machine import assert_same_printout, perturbed_init

from accumlib_course.lessons import course
from accumlib_course.report import params

ROOT = _docs.ROOT
README = _docs.README.read_text()
MAX_LINES = 250  # issue 31: a front door of about 200 lines; the rest lives in docs/


def _section(heading: str) -> str:
    return README.split(heading, 1)[1].split("\n## ", 1)[0]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_readme_is_a_front_door_of_at_most_250_lines_with_three_doors():
    lines = README.splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    for door in ("## Quick start", "## Check a run", "## Teach the workshop", "## Render the report"):
        assert f"\n{door}\n" in README, door
    quick = _blocks(_section("## Quick start"), "bash")[0]
    assert [ln.split("#")[0].strip() for ln in quick.splitlines()] == ["make lab", "make test"]


def test_the_verify_example_prints_what_the_readme_shows():
    code = _blocks(_section("## Check a run"), "python")[0]
    shown = _blocks(_section("## Check a run"), "text")[0]
    out = io.StringIO()
    with perturbed_init() as moved, contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert moved.tensors > 0
    assert_same_printout(out.getvalue(), shown)
    assert "[tail-dropped] 14 of 110 items" in shown  # what the prose under the example says


def _commands(section: str) -> list[tuple[str, int]]:
    """Each ``accumlib ...`` line of the section's bash blocks with the exit status its comment states."""
    out = []
    for block in _blocks(section, "bash"):
        for line in block.splitlines():
            if line.startswith("accumlib "):
                command, _, comment = line.partition("#")
                out.append((command.strip(), int(re.match(r"\s*exit (\d)", comment).group(1))))
    return out


def test_every_accumlib_command_of_the_readme_runs_as_written_with_its_exit_status():
    commands = _commands(README)
    assert len(commands) >= 2
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for command, status in commands:
        run = subprocess.run(
            shlex.split(command), cwd=ROOT, capture_output=True, text=True, env=env, timeout=300
        )
        assert run.returncode == status, f"{command}: exit {run.returncode}\n{run.stdout[-2000:]}{run.stderr}"


def test_the_line_the_readme_tells_to_delete_is_the_loss_scaling():
    script = (ROOT / "accumlib_course/examples/scripts/train_gpt_shape.py").read_text().splitlines()
    n = int(re.search(r"Delete the script's line (\d+) \(`([^`]+)`\)", README).group(1))
    said = re.search(r"Delete the script's line \d+ \(`([^`]+)`\)", README).group(1)
    assert script[n - 1].strip().startswith(said), script[n - 1]


def test_the_lesson_table_is_the_course_map():
    rows = re.findall(
        r"^\| `(\d\d_\w+\.ipynb)` \| (.+?) \| (\d+) \|$", _section("## Teach the workshop"), re.M
    )
    assert rows == [(lesson.file, lesson.title, str(lesson.minutes)) for lesson in course.COURSE]


def test_the_report_parameters_table_is_the_reports_defaults_and_the_makefiles_target():
    rows = re.findall(
        r"^\| `([A-Z]+)` \| `(\w+)` \| `([^`]*)` \| .+ \|$", _section("## Render the report"), re.M
    )
    shown = {name: default for _, name, default in rows}
    expected = {
        k: " ".join(map(str, v)) if isinstance(v, tuple) else str(v)
        for k, v in params.DEFAULTS.items()
        if k != "results_path"  # where the JSON goes: make report sets it under REPORT_DIR
    }
    assert shown == expected
    makefile = (ROOT / "Makefile").read_text()
    for variable, name, default in rows:
        assert re.search(rf"^{variable}\s*\?= {re.escape(default)}$", makefile, re.M), variable
        assert f'-p {name} "$({variable})"' in makefile, (variable, name)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not checked offline
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            bad.append(f"{target}: no such heading in {path.name}")
    return bad


def test_every_link_of_the_readme_and_the_docs_opens_what_it_names():
    found = {p.relative_to(ROOT).as_posix(): broken_links(p) for p in _docs.pages()}
    assert len(found) >= 9  # the README and its eight docs/ pages
    assert {k: v for k, v in found.items() if v} == {}
    # the README's own links lead into docs/, and the pages link back and across
    assert README.count("](docs/") >= 8 and "](../README.md)" in (_docs.DOCS / "run.md").read_text()


def test_the_link_check_sees_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "b.md").write_text("# B\n\n## Here\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here) [gone](c.md) [moved](b.md#there) [web](https://example.org/x)\n")
    assert broken_links(page) == ["c.md: no such file", "b.md#there: no such heading in b.md"]


def test_the_same_check_from_a_shell_exits_as_the_readme_says(tmp_path):
    """ "The same check from a shell, with the loop in `loop.py`": the example's loop, run by the command
    the README gives, ends as the prose says."""
    section = _section("## Check a run")
    code = _blocks(section, "python")[0]
    (tmp_path / "loop.py").write_text(code.split("\nreport = ", 1)[0])  # the loop, not the verify call
    said = re.search(r"with the loop in `loop.py`, is\n`(accumlib verify [^`]+)` \(exit (\d)\)", section)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(
        shlex.split(said.group(1)), cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == int(said.group(2)), run.stdout + run.stderr
    assert "[tail-dropped] 14 of 110 items" in run.stdout
