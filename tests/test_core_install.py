"""``pip install accumlib`` is the small core: torch is its one required dependency.

A practitioner's CI job that only wants to check a run (``accumlib verify`` on a loop, ``accumlib run`` on
a script) must not pull in the course's matplotlib, its notebooks' Jupyter, or scikit-learn. This test
builds a fresh virtual environment, installs the package from a copy of this checkout with no extra
(offline, from uv's cache, which ``make install`` filled, at constraints.txt's pins), and runs the core's
commands there (``accumlib selfcheck`` too), each on a correct run and on a wrong one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "accumlib_course" / "examples" / "scripts" / "train_gpt_shape.py"  # the README's
# what the course and the notebooks need, and the core must not
NOT_CORE = ("matplotlib", "sklearn", "numpy", "tqdm", "jupyterlab", "notebook", "ipywidgets", "IPython")

LOOP = """
import torch.nn.functional as F


def correct(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y, reduction="sum").div(32).backward()  # 4 micro-batches of 8 items
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()


def never_divided(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def _find_links() -> list[str]:
    """The local wheel of torch that pip is configured with (make install passes it to uv the same way)."""
    where = (
        os.environ.get("PIP_FIND_LINKS")
        or subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return ["--find-links", where] if where else []


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> Path:
    """A fresh venv with ``pip install .`` and nothing else; returns its python."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.fail(f"uv is not in the test venv ({uv}): make install puts it there")
    tmp = tmp_path_factory.mktemp("core")
    src = tmp / "src"  # a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    shutil.copytree(ROOT / "accumlib", src / "accumlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp / "venv"
    env = {**os.environ, "VIRTUAL_ENV": ""}
    subprocess.run([uv, "venv", "-q", venv], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "-q", "--offline", "--python", python, "-c", ROOT / "constraints.txt"]
    out = subprocess.run(
        [*install, *_find_links(), src], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, f"the core install failed (offline, from uv's cache):\n{out.stderr}"
    return python


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # torch's bytecode, compiled once for the temporary venv (each command would otherwise compile it: ~5 s)
    env["PYTHONDONTWRITEBYTECODE"], env["PYTHONPYCACHEPREFIX"] = "", str(python.parents[1] / "pycache")
    return subprocess.run([python, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_core_installs_torch_and_not_the_course(core):
    code = f"import importlib.util as u; print([n for n in {NOT_CORE!r} if u.find_spec(n)])"
    out = _run(core, "-c", code, cwd=core.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the core install pulled in {out.stdout.strip()}"
    have = _run(core, "-c", "import torch, accumlib; print(accumlib.__file__)", cwd=core.parent)
    assert have.returncode == 0, have.stderr
    assert str(core.parents[1]) in have.stdout  # the installed copy, not this checkout


def test_accumlib_verify_judges_a_loop_with_the_core_alone(core, tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    args = ("-m", "accumlib", "verify", "--task", "mlp-digits", "--accum-steps", "4", "--batch-size", "8")
    ok = _run(core, *args, "--max-steps", "3", "loop.py:correct", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run(core, *args, "--max-steps", "3", "loop.py:never_divided", cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "unscaled-sum" in bad.stdout and "loop.py:" in bad.stdout  # the user's file:line


def test_the_self_check_runs_with_the_core_alone(core, tmp_path):
    out = _run(core, "-m", "accumlib", "selfcheck", "--task", "mlp-digits", "--loop", "naive", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdicts hold" in out.stdout


def test_accumlib_run_judges_a_script_with_the_core_alone(core, tmp_path):
    shutil.copy(SCRIPT, tmp_path / "train.py")
    ok = _run(core, "-m", "accumlib", "run", "--", "train.py", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = SCRIPT.read_text().splitlines(keepends=True)
    assert "loss / accum" in lines[37]
    (tmp_path / "unscaled.py").write_text("".join(lines[:37] + lines[38:]))
    bad = _run(core, "-m", "accumlib", "run", "--", "unscaled.py", cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "unscaled-sum" in bad.stdout
