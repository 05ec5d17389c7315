"""The three ways into the suite install the same thing: pip (`make install`), Binder (binder/)
and conda (environment.yml).

The files are parsed, not trusted: every package pyproject.toml names has a pin in
constraints.txt inside its range; binder/requirements.txt and environment.yml's pip section
install the package with the same extras, the same CPU-only torch pin and the same
constraints file; those extras cover every import of the package and the notebooks; and
repo2docker (run offline, no Docker: `--no-build`) picks the Python build pack on binder/.
Binder and conda need the network, so they are checked statically here.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON = "3.11"  # the tested Python (README, CI); Binder's runtime.txt and conda pin it
EXTRAS = {"notebooks"}  # what a participant's environment needs: the package + notebooks


def _constraints() -> dict[str, Version]:
    pins = {}
    for n, line in enumerate((REPO / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"constraints.txt:{n}: not a pin: {line}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"constraints.txt:{n}: {req.name} pinned twice"
        pins[name] = Version(specs[0].version)
    return pins


PINS = _constraints()


def _pyproject_requirements() -> dict[str, list[Requirement]]:
    """'' for [project] dependencies, else the extra's name; a self-reference (``accumlib[course]``)
    stands for that extra's requirements."""
    project = PYPROJECT["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}

    def expand(reqs: list[str]) -> list[Requirement]:
        out = []
        for req in map(Requirement, reqs):
            if canonicalize_name(req.name) == "accumlib":
                out += [r for extra in sorted(req.extras) for r in expand(groups[extra])]
            else:
                out.append(req)
        return out

    return {group: expand(reqs) for group, reqs in groups.items()}


@dataclass
class PipInstall:
    """What one pip requirement list (binder/requirements.txt, environment.yml) installs."""

    where: str
    index_urls: list[str] = field(default_factory=list)
    constraints: list[Path] = field(default_factory=list)
    editable: list[tuple[Path, set[str]]] = field(default_factory=list)
    requirements: list[Requirement] = field(default_factory=list)


def _parse_pip_lines(lines: list[str], where: str, rel_to: Path, cwd: Path) -> PipInstall:
    """The subset of pip's requirement-file syntax these files use; anything else fails.
    `-c` paths are relative to the requirements file (pip's rule), `-e` paths to the directory
    pip runs in (repo2docker and conda both run it at the top of the repository)."""
    out = PipInstall(where)
    for raw in lines:
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        opt, _, arg = line.partition(" ")
        arg = arg.strip()
        if opt in ("--extra-index-url", "--index-url"):
            out.index_urls.append(arg)
        elif opt in ("-c", "--constraint"):
            out.constraints.append((rel_to / arg).resolve())
        elif opt in ("-e", "--editable"):
            m = re.fullmatch(r"(?P<path>[^\[]+)(\[(?P<extras>[^\]]*)\])?", arg)
            assert m, f"{where}: cannot read editable install {line!r}"
            extras = {canonicalize_name(e) for e in (m["extras"] or "").split(",") if e.strip()}
            out.editable.append(((cwd / m["path"]).resolve(), extras))
        elif line.startswith("-"):
            raise AssertionError(f"{where}: option this test does not understand: {line!r}")
        else:
            out.requirements.append(Requirement(line))
    return out


def _binder() -> PipInstall:
    path = REPO / "binder" / "requirements.txt"
    return _parse_pip_lines(path.read_text().splitlines(), "binder/requirements.txt", path.parent, REPO)


def _conda() -> tuple[dict, PipInstall]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml: expected one pip: section"
    return env, _parse_pip_lines(pip_sections[0], "environment.yml pip:", REPO, REPO)


ROUTES = {"binder": _binder, "conda": lambda: _conda()[1]}


# --- pyproject.toml <-> constraints.txt ------------------------------------------------------


def test_every_pyproject_requirement_is_pinned_inside_its_range():
    problems = []
    for group, reqs in _pyproject_requirements().items():
        for req in reqs:
            pin = PINS.get(canonicalize_name(req.name))
            if pin is None:
                problems.append(f"{req} ({group or 'dependencies'}): no pin in constraints.txt")
            elif not req.specifier.contains(pin, prereleases=True):
                problems.append(f"{req} ({group or 'dependencies'}): pinned {pin}, outside the range")
    assert not problems, "\n".join(problems)


def test_constraints_match_this_environment():
    """constraints.txt is what `make install` installed here, so the pins are the tested ones."""
    wrong = []
    for name, pin in PINS.items():
        try:
            have = Version(md.version(name))
        except md.PackageNotFoundError:
            continue  # pins of other platforms' or optional tools' packages
        if have.public != pin.public:
            wrong.append(f"{name}: pinned {pin}, installed {have}")
    assert not wrong, "\n".join(wrong)


def test_requires_python_admits_the_tested_python():
    assert Version(f"{PYTHON}.99") in SpecifierSet(PYPROJECT["project"]["requires-python"])


# --- binder/ and environment.yml install what pip does ---------------------------------------


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_route_installs_the_package_with_the_pins(route):
    inst = ROUTES[route]()
    assert inst.constraints == [REPO / "constraints.txt"], f"{inst.where}: constraints {inst.constraints}"
    assert inst.editable == [(REPO, EXTRAS)], f"{inst.where}: installs {inst.editable}, want -e .[notebooks]"
    # CPU-only torch: PyTorch's CPU index, and a +cpu pin so pip cannot fall back to PyPI's
    # multi-GB CUDA wheel.
    assert inst.index_urls == [CPU_INDEX], inst.index_urls
    torch = [r for r in inst.requirements if canonicalize_name(r.name) == "torch"]
    assert len(torch) == 1, f"{inst.where}: no explicit torch pin"
    (spec,) = torch[0].specifier
    assert spec.operator == "==" and Version(spec.version).local == "cpu", torch[0]
    for req in inst.requirements:  # explicit pins agree with constraints.txt and pyproject
        name = canonicalize_name(req.name)
        assert name in PINS, f"{inst.where}: {req} has no pin in constraints.txt"
        (spec,) = req.specifier
        assert Version(spec.version).public == PINS[name].public, f"{inst.where}: {req} vs {PINS[name]}"
        assert PINS[name] in SpecifierSet(f"=={Version(spec.version).public}")
        for group in _pyproject_requirements().values():
            for declared in group:
                if canonicalize_name(declared.name) == name:
                    assert declared.specifier.contains(Version(spec.version).public), (req, declared)


def test_binder_and_conda_install_the_same():
    b, c = _binder(), _conda()[1]
    assert (b.index_urls, b.constraints, b.editable) == (c.index_urls, c.constraints, c.editable)
    assert sorted(map(str, b.requirements)) == sorted(map(str, c.requirements))


def test_binder_and_conda_use_the_tested_python():
    runtime = (REPO / "binder" / "runtime.txt").read_text().strip()
    assert runtime == f"python-{PYTHON}", f"binder/runtime.txt says {runtime!r}"
    env, _ = _conda()
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and re.match(r"python\b", d)]
    assert pythons == [f"python={PYTHON}"], pythons
    assert "pip" in env["dependencies"]
    assert sys.version_info[:2] == tuple(map(int, PYTHON.split("."))), "tests run on another Python"


def test_a_change_in_binder_would_be_caught():
    """The parser is strict and the comparison is real: a changed line is seen."""
    text = (REPO / "binder" / "requirements.txt").read_text()
    changed = _parse_pip_lines(text.replace("[notebooks]", "[dev]").splitlines(), "x", REPO / "binder", REPO)
    assert changed.editable != _binder().editable
    with pytest.raises(AssertionError, match="does not understand"):
        _parse_pip_lines(["--pre-release-madness yes"], "x", REPO, REPO)


# --- the extras cover every import -----------------------------------------------------------


def _closure(requirements: list[Requirement]) -> set[str]:
    """Distributions these requirements install, through this environment's metadata."""
    env = default_environment()
    seen: set[str] = set()
    todo = [(r, set()) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            continue
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist_reqs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for sub in map(Requirement, dist_reqs):
            todo.append((sub, set(req.extras)))
    return {k.split("[")[0] for k in seen}


def _imports(source: str) -> set[str]:
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _notebook_code(path: Path) -> str:
    nb = json.loads(path.read_text())
    lines = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            lines += [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def test_participant_extras_cover_every_import():
    """Every module the package or a notebook imports (lazy imports included: the verifier
    notebook runs Accelerate's loop) comes with `pip install -e .[notebooks]`."""
    groups = _pyproject_requirements()
    installed = _closure(groups[""] + [r for e in EXTRAS for r in groups[e]])
    to_dist = md.packages_distributions()
    sources = {
        p: p.read_text() for root in ("accumlib", "accumlib_course") for p in (REPO / root).rglob("*.py")
    }
    sources |= {p: _notebook_code(p) for p in (REPO / "notebooks").glob("*.ipynb")}
    missing = {}
    for path, src in sources.items():
        for mod in _imports(src):
            if mod in sys.stdlib_module_names or mod in ("accumlib", "accumlib_course"):  # this distribution
                continue
            dists = {canonicalize_name(d) for d in to_dist.get(mod, [mod])}
            if not dists & installed:
                missing.setdefault(mod, []).append(str(path.relative_to(REPO)))
    assert not missing, f"imported but not installed by .[{','.join(EXTRAS)}]: {missing}"


# --- repo2docker picks the Python build pack on binder/ ---------------------------------------


def test_repo2docker_picks_the_python_buildpack(monkeypatch):
    pytest.importorskip("repo2docker", reason="jupyter-repo2docker is in the test extra")
    from repo2docker.app import Repo2Docker
    from repo2docker.buildpacks import PythonBuildPack

    monkeypatch.chdir(REPO)  # build packs detect files in the working directory, as in build()
    r2d = Repo2Docker()
    picked = next(bp for bp in (BP(base_image=r2d.base_image) for BP in r2d.buildpacks) if bp.detect())
    assert type(picked) is PythonBuildPack, f"repo2docker picked {type(picked).__name__}"
    assert picked.binder_dir == "binder"  # so environment.yml at the top is ignored by Binder
    assert picked.python_version == PYTHON


def test_repo2docker_no_build_renders_our_install():
    """`repo2docker --no-build .`: a dry run (it implies --no-run and --no-push), so no Docker and
    no network; it prints the Dockerfile it would build."""
    pytest.importorskip("repo2docker", reason="jupyter-repo2docker is in the test extra")
    run = subprocess.run(
        [sys.executable, "-m", "repo2docker", "--no-build", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"Building conda environment for python={PYTHON}" in run.stderr, run.stderr[-2000:]
    dockerfile = run.stdout
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in dockerfile
    # -c/-e are local references, so pip runs after the whole repository is copied in
    assert dockerfile.index("COPY --chown=0:0 src/ ${REPO_DIR}/") < dockerfile.index(
        'pip install --no-cache-dir -r "binder/requirements.txt"'
    )
    assert "binder/start" in dockerfile, "binder/start (thread count) is not the entrypoint"


def test_binder_start_sets_one_thread_per_allowed_core():
    """binder/start (run before Jupyter on Binder) exports OMP_NUM_THREADS unless it is set."""
    import os

    start = REPO / "binder" / "start"
    assert os.access(start, os.X_OK), "binder/start must be executable (git mode 100755)"
    probe = [sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    unset = subprocess.run([str(start), *probe], env=env, capture_output=True, text=True, timeout=30)
    assert unset.returncode == 0, unset.stderr
    assert 1 <= int(unset.stdout) <= os.cpu_count(), unset.stdout
    kept = subprocess.run(
        [str(start), *probe], env={**env, "OMP_NUM_THREADS": "3"}, capture_output=True, text=True, timeout=30
    )
    assert kept.stdout.strip() == "3", kept.stdout
