"""Binder, reproduced: repo2docker's Python build on a fresh virtual environment (`make binder-check`).

mybinder.org builds this repository with repo2docker's Python build pack: a conda base environment
(JupyterLab, notebook, jupyterhub-singleuser, ...) frozen in repo2docker's lock file for the Python
version `binder/runtime.txt` names, then `pip install -r binder/requirements.txt` from the repository
root on top of it. Docker and conda are not needed to see what that gives: this script

1. reads the base environment's lock file from the installed jupyter-repo2docker
   (`buildpacks/conda/environment.py-<X.Y>-linux-64.lock`) and keeps its pip-installable pins
   (the Python packages, under their PyPI names);
2. makes a fresh venv with that Python, installs those pins with pip, then `binder/requirements.txt`
   exactly as repo2docker runs it, then `binder/postBuild` if there is one;
3. requires `pip check` to be clean;
4. starts JupyterLab from that venv and opens the course map (`notebooks/00_start_here.ipynb`) in
   headless Chromium (tests/_jupyter.py drives it, as in the browser tests), runs its cells and
   requires every one to run without an error.

It downloads from PyPI, so it is not part of `make test` (CI has no internet). Exit status 0: Binder
builds and opens the course map; 1: a step failed (the step and its output are printed).
`--keep DIR` builds the venv in DIR and leaves it there. The offline half (the pins of
`binder/` against the base environment's) is `tests/test_installs.py`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
COURSE_MAP = "notebooks/00_start_here.ipynb"

# conda-forge names whose PyPI distribution has another name.
CONDA_TO_PYPI = {
    "brotli-python": "brotli",
    "python-fastjsonschema": "fastjsonschema",
    "nbconvert-core": "nbconvert",
    "jupyterhub-base": "jupyterhub",
}
# Python builds in the lock that are not distributions pip installs into a venv (the interpreter,
# its ABI marker, and the venv's own installer tools, which the venv brings).
NOT_PIP = {"python", "python_abi", "setuptools", "wheel"}


def normalize(name: str) -> str:
    """PEP 503 name normalization: `Jinja2`, `jinja2` and `jinja_2` compare equal as written."""
    return re.sub(r"[-_.]+", "-", name).lower()


def binder_python() -> str:
    """The Python version `binder/runtime.txt` asks repo2docker for, as "X.Y"."""
    text = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", text)
    if not match:
        raise ValueError(f"binder/runtime.txt must read python-X.Y, got {text!r}")
    return match.group(1)


def base_lock(python: str) -> Path:
    """repo2docker's frozen base environment for `python` on linux-64 (installed repo2docker's)."""
    import repo2docker

    path = (
        Path(repo2docker.__file__).parent / "buildpacks" / "conda" / f"environment.py-{python}-linux-64.lock"
    )
    if not path.is_file():
        raise FileNotFoundError(f"repo2docker has no base environment for Python {python}: {path} is missing")
    return path


def base_pins(lock: Path) -> dict[str, str]:
    """The pip-installable pins of a conda explicit lock file: {normalized PyPI name: version}.

    A Python package's build string starts with "py" (`pyhd8ed1ab_0` noarch, `py311h..._0` compiled);
    C libraries, nodejs and meta-packages (`jupyterhub-singleuser`, `bleach-with-css`) have other builds
    and no wheel of their own (a meta-package's content is its dependencies, which are in the lock)."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if not line.startswith("http"):
            continue
        filename = line.split("#", 1)[0].rsplit("/", 1)[1]
        stem = filename.removesuffix(".conda").removesuffix(".tar.bz2")
        name, version, build = stem.rsplit("-", 2)
        if not build.startswith("py") or name in NOT_PIP:
            continue
        pins[normalize(CONDA_TO_PYPI.get(name, name))] = version
    return pins


def requirement_pins(path: Path) -> dict[str, str]:
    """Every `name==version` a pip requirements file states, following its `-c`/`-r` files (paths
    relative to the file, as pip reads them); a local version label (`+cpu`) is kept."""
    pins: dict[str, str] = {}
    included: dict[str, str] = {}  # a pin of the file itself is the more specific (torch==X+cpu over X)
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option = re.match(r"^(-c|-r|--constraint|--requirement)\s*(\S+)$", line)
        if option:
            included.update(requirement_pins((path.parent / option.group(2)).resolve()))
            continue
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if pin:
            pins[normalize(pin.group(1))] = pin.group(3)
    return included | pins


def postbuild_pins(path: Path) -> dict[str, str]:
    """The `name==version` pins a `binder/postBuild` installs with pip (it runs after requirements.txt)."""
    pins: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if re.search(r"\bpip\s+install\b", line.split("#", 1)[0]):
                for name, version in re.findall(
                    r"(?<![\w=-])([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;'\"]+)", line
                ):
                    pins[normalize(name)] = version
    return pins


def binder_pins() -> dict[str, str]:
    """What Binder pins on top of the base environment: binder/requirements.txt (with its constraints
    file), then binder/postBuild's pip installs, which repo2docker runs last."""
    return requirement_pins(BINDER / "requirements.txt") | postbuild_pins(BINDER / "postBuild")


def contradictions(base: dict[str, str], binder: dict[str, str]) -> list[str]:
    """Where Binder's pins (`binder`: binder_pins()) contradict repo2docker's base environment (`base`),
    both {normalized name: version}; an empty list when they agree.

    pip installs binder/ on top of the base environment, so a newer pin is an upgrade
    pip makes; contradictions are (1) a pin below the base's version (pip would downgrade a package the
    rest of the base environment was solved against) and (2) JupyterLab and the notebook front end in
    different series: notebook 7.N requires JupyterLab 4.N (7.4.7: `jupyterlab>=4.4.9,<4.5`; 7.6.5:
    `jupyterlab>=4.6.6,<4.7`), and a package Binder does not pin keeps the base's version."""
    from packaging.version import Version

    found = [
        f"{name}: Binder pins {binder[name]}, below the base environment's {base[name]} "
        "(pip would downgrade a package the base environment was solved with)"
        for name in sorted(base.keys() & binder.keys())
        if Version(binder[name]) < Version(base[name])
    ]
    lab, notebook = (binder.get(name, base.get(name)) for name in ("jupyterlab", "notebook"))
    if lab and notebook and Version(notebook).release[:2] != (7, Version(lab).minor):
        where = "Binder's pins" if "notebook" in binder else "the base environment"
        found.append(
            f"notebook {notebook} (from {where}) needs JupyterLab 4.{Version(notebook).minor}, "
            f"but Binder gets JupyterLab {lab}: pin notebook==7.{Version(lab).minor}.* for Binder"
        )
    return found


def _run(step: str, cmd: list[str], cwd: Path = ROOT) -> str:
    print(f"\n== {step}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    # One retry, not pip's five with back-off: where an index is unreachable (PyTorch's, on a machine
    # that reaches PyPI alone) five cost about 8 s per package, over 20 minutes in all.
    env = {"PIP_RETRIES": "1", **os.environ}
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # pip's config here adds local index folders; their "is ignored" warnings say nothing about Binder.
    shown = "".join(
        line for line in proc.stdout.splitlines(keepends=True) if "is ignored: it is neither" not in line
    )
    print(shown[-6000:], end="")
    print(f"-- {step}: exit {proc.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"binder-check FAILED at '{step}' (exit {proc.returncode})")
    return proc.stdout


def build(venv: Path, python: str) -> Path:
    """The Binder environment in `venv`: base pins, then binder/requirements.txt and binder/postBuild.
    Returns its python."""
    interpreter = shutil.which(f"python{python}")
    if interpreter is None:
        raise SystemExit(f"binder-check needs python{python} (binder/runtime.txt) on PATH")
    lock = base_lock(python)
    pins = base_pins(lock)
    _run("venv", [interpreter, "-m", "venv", str(venv)])
    base_txt = venv / "binder-base-requirements.txt"  # kept with the venv under --keep
    base_txt.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    print(f"base environment: {lock.name}: {len(pins)} pip-installable pins ({base_txt})")
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    # repo2docker's base environment comes with its own pip (a pin in the lock): use that one.
    _run("base pip", pip + ["install", "--quiet", f"pip=={pins.pop('pip')}"])
    _run("base environment", pip + ["install", "--quiet", "-r", str(base_txt)])
    # What repo2docker's Python build pack runs, from the repository root.
    _run("binder/requirements.txt", pip + ["install", "-r", "binder/requirements.txt"])
    if (
        BINDER / "postBuild"
    ).is_file():  # repo2docker runs it next, with the environment's bin/ first on PATH
        _run(
            "binder/postBuild",
            ["env", f"PATH={venv / 'bin'}:{os.environ['PATH']}", "bash", "binder/postBuild"],
        )
    return py


def resolved(py: Path, names: list[str]) -> dict[str, str]:
    out = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    have = {
        normalize(name): version for name, _, version in (line.partition("==") for line in out.splitlines())
    }
    return {name: have.get(normalize(name), "(absent)") for name in names}


def open_course_map(py: Path) -> list[str]:
    """JupyterLab from the Binder venv, the course map in Chromium, Run All: the code cells' prompts."""
    sys.path.insert(0, str(ROOT / "tests"))
    import _jupyter as jl

    reason = jl.chromium_missing_reason()
    if reason:
        raise SystemExit(f"binder-check cannot open the course map: {reason}")

    def command(state, port, token):  # the suite's JupyterLab command line, run by the Binder venv's python
        return [str(py), *jl._lab_command(ROOT, state, port, token)[1:]]

    with jl._serve(ROOT, "lab", command) as server, tempfile.TemporaryDirectory() as profile:
        with jl.chromium_page(Path(profile), timeout_ms=120_000) as page:
            jl.open_notebook(page, server, COURSE_MAP, timeout_ms=180_000)
            title = jl.notebook(page).locator("h1").first.inner_text()
            prompts = jl.run_all_cells(page, server, COURSE_MAP, timeout_ms=300_000)
            errors = [t for t in jl.outputs_of(page, jl.STDERR_MIME) if jl.ERROR_TEXT.search(t)]
            if errors:
                raise SystemExit(f"binder-check FAILED: the course map's cells raised:\n{errors[0][:2000]}")
            if page.external_requests:
                raise SystemExit(
                    f"binder-check FAILED: the page asked the network for {page.external_requests[:3]}"
                )
            print(f"course map opened: {title!r}; code cells ran: {prompts}")
            return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="build the venv in this (new) directory and keep it")
    args = parser.parse_args(argv)
    python = binder_python()
    work = Path(tempfile.mkdtemp(prefix="accumlib-binder-"))
    venv = args.keep.resolve() if args.keep else work / "venv"
    if venv.exists():
        raise SystemExit(f"--keep {venv}: already exists; give a new directory")
    started = time.monotonic()
    try:
        py = build(venv, python)
        _run("pip check", [str(py), "-m", "pip", "check"])
        versions = resolved(
            py,
            [
                "jupyterlab",
                "notebook",
                "jupyter_server",
                "jupyterhub",
                "ipykernel",
                "ipywidgets",
                "voila",
                "torch",
                "numpy",
                "accumlib",
            ],
        )
        print("resolved: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        open_course_map(py)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the venv itself, under --keep, is elsewhere
    print(f"binder-check passed: Python {python}, {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
