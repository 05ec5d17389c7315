"""CONTRIBUTING.md's map, proven: a new loop and a new finding code, each added to a scratch copy of the
repository by touching only the files its row of the "Where to make a change" table names, pass the
suite's checks, and fail them while a named file is still missing its part.

The scratch copy is every file git tracks or would track; its tests run in a subprocess with the copy
first on the path (ahead of the editable install), so they read the copy's registry, codes table and
README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _docs
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK_TIMEOUT_S = 420  # a few test files on a loaded 2-core machine; they take about a minute alone

pytestmark = pytest.mark.slow


def _row(what: str) -> str:
    """The table row of CONTRIBUTING.md that starts with ``| <what> |``."""
    rows = [
        line for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines() if line.startswith(f"| {what} |")
    ]
    assert len(rows) == 1, f"CONTRIBUTING.md must have one row for {what!r} (found {len(rows)})"
    return rows[0]


def _named_files(row: str, name: str) -> set[str]:
    """The repository files a row names: every backticked path (``<name>`` filled in)."""
    paths = set()
    for token in re.findall(r"`([^`\s]+)`", row):
        token = token.replace("<name>", name)
        if re.fullmatch(r"[\w./-]+\.(py|md|ipynb|toml|txt)", token) and (ROOT / token).parent.is_dir():
            paths.add(token)
    return paths


class Scratch:
    """A copy of the tracked files in which every write is checked against the files a row names."""

    def __init__(self, tmp: Path, named: set[str]):
        self.root, self.named, self.touched = tmp / "repo", named, set()
        files = (
            subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .split("\0")
        )
        for rel in filter(None, files):
            if (ROOT / rel).is_file():
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, self.root / rel)

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def write(self, rel: str, text: str) -> None:
        assert rel in self.named, f"{rel} is not among the files CONTRIBUTING.md names: {sorted(self.named)}"
        self.touched.add(rel)
        (self.root / rel).write_text(text)

    def replace(self, rel: str, old: str, new: str) -> None:
        text = self.read(rel)
        assert text.count(old) == 1, f"{old!r} must occur once in {rel}"
        self.write(rel, text.replace(old, new))

    def tool(self, script: str, writes: str) -> None:
        """Run one of tools/ in the scratch copy, as the map says, and count the file it writes as touched."""
        assert writes in self.named, f"{writes} is not among the files CONTRIBUTING.md names"
        before = self.read(writes)
        env = dict(os.environ, PYTHONPATH=str(self.root))
        run = subprocess.run([sys.executable, script], cwd=self.root, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert self.read(writes) != before, f"{script} left {writes} as it was"
        self.touched.add(writes)

    def pytest(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(self.root), ACCUMLIB_SCRATCH="1")
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-x",
                "-o",
                "addopts=--doctest-modules",
                *args,
            ],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )


def _add_readme_row(scratch: Scratch, after: str, row: str) -> None:
    """A row in a table of the documentation (the README or a docs/ page), right after the row that starts
    with ``after``."""
    page = _docs.holding(after, scratch.root)
    anchor = next(line for line in scratch.read(page).splitlines() if line.startswith(after))
    scratch.replace(page, anchor, f"{anchor}\n{row}")


def _by_the_book(tmp: Path, what: str, name: str, add, add_readme, checks: tuple[str, ...]) -> Scratch:
    """Add ``name`` to a scratch copy touching only the files the row for ``what`` names: first all but its
    README row, which the suite must then refuse, naming it (the negative); then the row, and the suite
    passes."""
    named = _named_files(_row(what), name)
    scratch = Scratch(tmp, named)
    add(scratch)
    missing = scratch.pytest("tests/test_readme.py")
    assert missing.returncode == 1 and name in missing.stdout, missing.stdout[-3000:]
    add_readme(scratch)
    done = scratch.pytest(*checks)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert scratch.touched <= named, (scratch.touched, named)
    return scratch


# --- a reference loop ------------------------------------------------------------------------------------

LOOP = "counted_window"  # not global_count: test_contracts plants that one in a copy of its own
# What a contributor runs after adding a loop: the checks that read the registry, and the loop's own test.
LOOP_CHECKS = (
    "tests/test_api.py",
    "tests/test_contracts.py",
    "tests/test_validation.py",
    "tests/test_readme.py",
    "tests/test_loops.py",
    f"accumlib/loops/{LOOP}.py",
)
LOOP_TEST = f'''

def test_{LOOP}_matches_the_true_gradient_on_every_window():
    """The scratch loop of tests/test_contributing.py: every step, the last partial window too, is exact."""
    from accumlib.harness import trace_loop
    from accumlib.loops import {LOOP}

    assert trace_loop({LOOP}, get_task("lm-tokens")).verdict == ()  # verify passes it, nothing to say
    assert trace_loop({LOOP}, get_task("mlp-digits")).verdict == ()
'''


def _add_loop(scratch: Scratch) -> None:
    """A loop added by the book: its file (here ragged's identity under a new name, kept out of the
    reference table), its row in the README's table of loops, and its test."""
    source = re.sub(r"\bragged\b(?![-_])", LOOP, (ROOT / "accumlib/loops/ragged.py").read_text())
    source = re.sub(r"order=\d+", "order=None", source)
    scratch.write(f"accumlib/loops/{LOOP}.py", source)
    # its name, imported and exported where a type checker reads public names: accumlib.loops, accumlib
    scratch.replace(
        "accumlib/loops/__init__.py",
        "from .ragged import ragged\n",
        f"from .ragged import ragged\nfrom .{LOOP} import {LOOP}\n",
    )
    scratch.replace("accumlib/loops/__init__.py", '    "ragged",\n]', f'    "ragged",\n    "{LOOP}",\n]')
    scratch.replace("accumlib/__init__.py", "normalized, ragged\n", f"normalized, ragged, {LOOP}\n")
    scratch.replace("accumlib/__init__.py", '    "grad_divided",\n', f'    "grad_divided",\n    "{LOOP}",\n')
    tests = scratch.read("tests/test_loops.py")
    if "get_task" not in tests.split("\ndef ", 1)[0]:
        tests += "\nfrom accumlib import get_task\n"
    scratch.write("tests/test_loops.py", tests + LOOP_TEST)


def _add_loop_to_readme(scratch: Scratch) -> None:
    _add_readme_row(
        scratch, "| `ragged` |", f"| `{LOOP}` | as `ragged` (a scratch loop) | always (no BatchNorm) |"
    )


def test_a_new_loop_touches_only_the_files_the_map_names_and_passes(tmp_path):
    scratch = _by_the_book(tmp_path, "a reference loop", LOOP, _add_loop, _add_loop_to_readme, LOOP_CHECKS)
    # issue 19 measured 13 files touched for a loop where the map named 2: now the loop's file, its README
    # row and its test, and its name in the two packages' imports (issue 46: names a type checker sees)
    assert len(scratch.touched) == 5, scratch.touched
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import accumlib.loops as L; from accumlib.loops import {LOOP}; "
            f"print(callable({LOOP}), {LOOP} is L.ALL['{LOOP}'], '{LOOP}' in L.__all__)",
        ],
        cwd=scratch.root,
        env=dict(os.environ, PYTHONPATH=str(scratch.root)),
        capture_output=True,
        text=True,
    )
    assert probe.stdout.split() == ["True", "True", "True"], probe.stdout + probe.stderr


# --- a finding code ---------------------------------------------------------------------------------------

CODE = "zero-lr"
CODE_CHECKS = (
    "tests/test_api.py",
    "tests/test_readme.py",
    "tests/test_gallery.py",
    "tests/test_verify_pipeline_rules.py",
    "tests/test_verify.py",
)
CODE_ENTRY = f"""    "{CODE}": Code(
        "bug",
        "the optimizer's learning rate was 0 at this step: the update changed no weight",
        "set the learning rate you meant; a warmup that starts at 0 spends its first step for nothing",
        meaning="the learning rate was 0: the step moved nothing",
    ),
"""
CODE_RULE = f"""    if n.lr == 0:  # the scratch code of tests/test_contributing.py
        out.codes.append("{CODE}")
"""


def _gallery_loop(name: str, setting: str) -> str:
    """A loop correct in every window whose optimizer ``setting`` (a line over each param group) is the
    one thing its code names."""
    return f"""

def {name}(model, optimizer, loader):
    for group in optimizer.param_groups:
        {setting}
    for window in windows(loader, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def _code_test(name: str, code: str) -> str:
    """The code's test in tests/test_verify.py: its gallery loop gets it, a correct loop does not."""
    return f"""


def test_{name}_is_said_and_a_loop_without_it_is_not():
    from accumlib_course.gallery import GALLERY

    assert GALLERY["bug-{code}"].run().codes == {{"{code}"}}
    assert "{code}" not in GALLERY["correct-inner-for"].run().codes
"""


def _register_code(
    scratch: Scratch, code: str, entry: str, rule: str, loop: str, setting: str, note: str
) -> None:
    """The steps every finding code takes by its row: its entry in the codes table, its rule in diagnose(),
    a gallery loop that triggers it (registered), and its test beside a correct loop."""
    codes = scratch.read("accumlib/_verify/codes.py")
    head, table = codes.split("CODES: dict[str, Code] = {\n", 1)
    scratch.write("accumlib/_verify/codes.py", head + "CODES: dict[str, Code] = {\n" + entry + table)
    anchor = "    if n.items == 0:\n"
    assert scratch.read("accumlib/_verify/diagnose.py").count(anchor) == 1, (
        "diagnose() changed: update the anchor"
    )
    scratch.replace("accumlib/_verify/diagnose.py", anchor, rule + anchor)
    bugs = scratch.read("accumlib_course/gallery/bugs.py")
    scratch.write("accumlib_course/gallery/bugs.py", bugs + _gallery_loop(loop, setting))
    gallery = scratch.read("accumlib_course/gallery/__init__.py")
    gallery = gallery.replace("from .bugs import (\n", f"from .bugs import (\n    {loop},\n", 1)
    registry = "GALLERY: dict[str, GalleryLoop] = _Gallery(\n    {\n"
    assert gallery.count(registry) == 1, "the gallery's registry changed: update the scratch entry"
    line = f'        "bug-{code}": GalleryLoop({loop}, _E({{"{code}"}}), "{note}"),\n'
    scratch.write("accumlib_course/gallery/__init__.py", gallery.replace(registry, registry + line))
    test = _code_test(code.replace("-", "_"), code)
    scratch.write("tests/test_verify.py", scratch.read("tests/test_verify.py") + test)


def _add_code(scratch: Scratch) -> None:
    """A finding code added by the book: its entry in the codes table, its rule, a gallery loop that
    triggers it (registered), its README row, and its test beside a correct loop."""
    # a warmup's first value, kept: every window right, every step a no-op
    _register_code(
        scratch, CODE, CODE_ENTRY, CODE_RULE, "bug_zero_lr", 'group["lr"] = 0.0', "the rate set to 0 by hand"
    )


def _add_code_to_readme(scratch: Scratch) -> None:
    """The table of codes is written from the codes table: the map's tool adds the row."""
    scratch.tool("tools/codes_table.py", writes="docs/verify.md")
    assert f"| `{CODE}` | bug | the learning rate was 0: the step moved nothing |" in scratch.read(
        "docs/verify.md"
    )


def test_a_new_finding_code_touches_only_the_files_the_map_names_and_passes(tmp_path):
    scratch = _by_the_book(tmp_path, "a finding code", CODE, _add_code, _add_code_to_readme, CODE_CHECKS)
    # issue 19 measured 9 files for a code where the map named 6: now codes, diagnose, the gallery loop and
    # its registration, the README row and the test (no StepNumbers field: the rule reads the recorded lr)
    assert len(scratch.touched) == 6, scratch.touched


# --- a finding code that needs a signal no engine records yet -----------------------------------------------

SIGNAL_CODE = "dampened"
SIGNAL_ENTRY = f"""    "{SIGNAL_CODE}": Code(
        "note",
        "SGD dampened its momentum at this step (dampening > 0)",
        "nothing to fix: said so the step's update is read with its dampening",
        meaning="SGD dampened its momentum",
    ),
"""
SIGNAL = "        numbers.dampening = float(opt.param_groups[0].get('dampening', 0.0))\n"


def _add_signal_code(scratch: Scratch, *, engines: tuple[str, ...]) -> None:
    """A note that reads a new signal: its StepNumbers field, set by the ``engines`` named (``record``,
    ``inplace``), then its codes entry, rule, gallery loop and test, as for any code."""
    scratch.replace(
        "accumlib/_verify/step_numbers.py",
        "    untracked: int = 0",
        "    dampening: float = 0.0  # the stepping optimizer's (the scratch signal)\n    untracked: int = 0",
    )
    if "record" in engines:
        anchor = "        numbers.scales = list(self.scales)\n"
        scratch.replace("accumlib/_verify/record.py", anchor, anchor + SIGNAL.replace("opt.", "optimizer."))
    if "inplace" in engines:
        anchor = "        numbers.optimizer = self.stepping[id(opt)]\n"
        scratch.replace("accumlib/_verify/inplace.py", anchor, anchor + SIGNAL)
    rule = f'    if n.dampening > 0:  # the scratch signal\n        out.codes.append("{SIGNAL_CODE}")\n'
    _register_code(
        scratch, SIGNAL_CODE, SIGNAL_ENTRY, rule, "bug_dampened", 'group["dampening"] = 0.5', "dampening"
    )
    scratch.tool("tools/codes_table.py", writes="docs/verify.md")


SIGNAL_CHECKS = ("tests/test_readme.py", "tests/test_gallery.py")


def test_a_finding_code_that_needs_a_new_signal_touches_both_engines_and_nothing_else(tmp_path):
    """Issue 47 measured 11 files for a code with a new signal where the map named 6 (8 with its optional
    clause). By the row, a signal is set where each engine closes a step; with one engine's line missing,
    the parity test says so (watch reads no dampening where verify does)."""
    named = _named_files(_row("a finding code"), SIGNAL_CODE)
    half = Scratch(tmp_path / "half", named)
    _add_signal_code(half, engines=("record",))
    parity = half.pytest("tests/test_gallery.py", "-k", "one_verdict and dampened")
    assert parity.returncode == 1 and "bug-dampened" in parity.stdout, parity.stdout[-3000:]
    whole = Scratch(tmp_path / "whole", named)
    _add_signal_code(whole, engines=("record", "inplace"))
    done = whole.pytest(*SIGNAL_CHECKS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    verify_test = whole.pytest("tests/test_verify.py", "-k", "test_dampened_is_said")
    assert verify_test.returncode == 0, verify_test.stdout[-3000:]
    # codes, diagnose, step_numbers, the two engines, the gallery loop and its registration, the docs row and
    # the test: every one a file the row names
    assert whole.touched <= named and len(whole.touched) == 9, sorted(whole.touched)


# --- a notebook re-run after a change ---------------------------------------------------------------------


def _make_dry(*args: str) -> subprocess.CompletedProcess:
    # -n: print the recipe, run nothing; the stamp is taken as made so no install starts
    return subprocess.run(
        ["make", "-n", "-o", ".venv/.installed-stamp", "notebooks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _executed(run: subprocess.CompletedProcess) -> list[str]:
    """The notebooks the nbconvert command of the recipe executes."""
    return re.findall(r"notebooks/\S+\.ipynb", run.stdout.split("nbconvert", 1)[1])


def test_make_notebooks_reruns_the_notebooks_a_prefix_names():
    one = _make_dry("NB=07")
    assert one.returncode == 0, one.stderr
    assert _executed(one) == ["notebooks/07_verify_your_loop.ipynb"]
    assert "--execute --inplace" in one.stdout
    two = _executed(_make_dry("NB=02 07"))
    assert [Path(p).name[:2] for p in two] == ["02", "07"]
    every = _executed(_make_dry())
    assert sorted(every) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_make_notebooks_refuses_a_prefix_that_names_no_notebook():
    none = subprocess.run(
        ["make", "-o", ".venv/.installed-stamp", "notebooks", "NB=99"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert none.returncode != 0 and "no notebook in notebooks/ starts with NB=99" in none.stderr
