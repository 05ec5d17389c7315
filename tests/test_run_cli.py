"""``accumlib run -- SCRIPT.py``: a script run as its user runs it (a subprocess, the script's own
arguments, its own folder as the working directory), judged unmodified; every exit status.

The README's script is the one run here; its report is compared with the README's text, line for
line (the figures are exact: equal micro-batches divided by a power of 2 leave no rounding).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import _docs
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = _docs.text()  # the README and the docs/ pages it leads to
SECTION = README.split("## Judge a training script as it is: `accumlib run`", 1)[1].split("\n## ", 1)[0]
SCRIPT = re.findall(r"```python\n(.*?)```", SECTION, re.S)[0]
SHOWN = re.findall(r"```text\n(.*?)```", SECTION, re.S)
SCALE = "        loss = loss / accum  # scale the loss for accumulation\n"


def accumlib_run(folder: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "accumlib", "run", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def report_of(stdout: str) -> str:
    return stdout[stdout.index("step  ") :]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    assert SCRIPT.count(SCALE) == 1
    (tmp_path / "train_broken.py").write_text(SCRIPT.replace(SCALE, ""))
    return tmp_path


def test_the_readmes_script_is_ok_and_prints_what_the_readme_shows(folder):
    done = accumlib_run(folder, "--json", "r.json", "--", "train.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "iter 4: loss" in done.stdout  # the script ran to its end, its own output first
    assert report_of(done.stdout) == SHOWN[0]
    got = json.loads((folder / "r.json").read_text())
    assert got["ok"] and got["accum_steps"] == 4 and len(got["steps"]) == 5


def test_the_broken_script_is_named_with_its_line_as_the_readme_shows(folder):
    """The one-line diff: ``loss = loss / accum`` deleted (line 38): every step is 4x the true gradient."""
    done = accumlib_run(folder, "--", "train_broken.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert report_of(done.stdout) == SHOWN[1]
    assert "at: train_broken.py:38" in done.stdout


def test_max_steps_ends_the_script_cleanly_and_accum_steps_is_checked(folder):
    done = accumlib_run(folder, "--max-steps", "2", "--", "train.py")
    assert done.returncode == 0 and "[partial-run]" in done.stdout, done.stdout + done.stderr
    assert "iter 1: loss" not in done.stdout  # ended inside iteration 1, at its step
    done = accumlib_run(folder, "--accum-steps", "2", "--", "train.py")
    assert done.returncode == 1 and "late-step" in done.stdout


def test_a_script_that_raises_exits_3_with_its_traceback(folder):
    (folder / "boom.py").write_text(
        SCRIPT.replace("    optimizer.step()\n", "    optimizer.step()\n    1 / 0\n")
    )
    done = accumlib_run(folder, "--", "boom.py")
    assert done.returncode == 3
    assert "ZeroDivisionError" in done.stderr and re.search(r'boom\.py", line 42', done.stderr), done.stderr
    assert "runpy" not in done.stderr  # the script's frames, not accumlib's or runpy's


def test_a_script_that_never_steps_exits_4_and_says_so(folder):
    (folder / "nostep.py").write_text(SCRIPT.replace("    optimizer.step()\n", ""))
    done = accumlib_run(folder, "--", "nostep.py")
    assert done.returncode == 4 and "[no-step]" in done.stdout


def test_two_loss_terms_exit_2_naming_both(folder):
    """How the terms combine is the user's to say (--item-losses, tests/test_item_losses.py): usage."""
    aux = "        loss = loss + 0.01 * F.mse_loss(logits, torch.zeros_like(logits))\n"
    two = SCRIPT.replace("        loss = loss / accum  #", aux + "        loss = loss / accum  #")
    (folder / "two.py").write_text(two)
    done = accumlib_run(folder, "--", "two.py")
    assert done.returncode == 2 and "[several-losses]" in done.stdout
    assert "this run adds 2 loss terms per micro-batch" in done.stderr, done.stderr
    assert re.search(r"cross_entropy at two\.py:\d+", done.stdout)
    assert re.search(r"mse_loss at two\.py:\d+", done.stdout)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--", "missing.py"], "SCRIPT.py must be an existing Python file"),
        ([], "a script must follow `--`"),
        (["--max-steps", "0", "--", "train.py"], "max_steps"),
    ],
)
def test_usage_errors_exit_2_before_anything_runs(folder, args, says):
    done = accumlib_run(folder, *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "iter 0" not in done.stdout
