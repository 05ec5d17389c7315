"""The core wheel holds what a practitioner's doors reach, and nothing only the course or the tools use.

``pip install accumlib`` gives the core: ``accumlib verify``, ``selfcheck`` and ``run`` (the console script,
``python -m accumlib``), ``import accumlib`` (verify, watch, the oracle, the reference loops, the built-in
tasks and their data), the framework doors (``accumlib.hf.verify_trainer``, ``accumlib.lightning.verify_fit``)
and the documented public submodules (``accumlib``'s docstring names them, ``accumlib._SUBMODULES`` serves
them). This test builds the real wheel from a copy of ``accumlib/`` alone (as tests/test_core_install.py
installs it), lists its modules, and fails on any that no door reaches through the import graph of the
wheel's own sources (imports inside functions count: a lazy import is a real path from a door). Then it
imports every module of the unpacked wheel in a fresh interpreter where ``accumlib_course`` cannot be found,
and checks that each came from the wheel and that nothing asked for the course.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the doors besides the console script (read from the wheel) and the public submodules: the package itself,
# `python -m accumlib`, and the framework adapters a practitioner imports by name
DOORS = ("accumlib", "accumlib.__main__", "accumlib.hf", "accumlib.lightning")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The core wheel, built offline from a copy of accumlib/ with pyproject.toml, unpacked; its folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT / "accumlib", src / "accumlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (whl,) = (tmp / "dist").glob("accumlib-*.whl")
    unpacked = tmp / "unpacked"
    with zipfile.ZipFile(whl) as z:
        z.extractall(unpacked)
    return unpacked


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` (the module ``name``) imports anywhere in its body, relative imports resolved;
    ``from pkg import x`` counts as ``pkg`` and ``pkg.x`` (x may be a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            out.add(stem)
            out.update(f"{stem}.{a.name}" for a in node.names)
        elif (  # pkgutil.iter_modules(__path__): a registry that imports its package's files (accumlib.loops)
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "iter_modules"
        ):
            out.add(name + ".*")
    return out


def reached(mods: dict[str, Path], doors: set[str]) -> set[str]:
    """The modules of ``mods`` the doors reach, with the packages above each (importing a.b runs a)."""
    seen: set[str] = set()
    todo = list(doors)
    while todo:
        m = todo.pop()
        if m in seen or m not in mods:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for i in imports(mods[m], m):
            if i.endswith(".*"):  # a package that imports its own modules by name at run time
                todo += [n for n in mods if n.startswith(i[:-1]) and n.count(".") == i.count(".")]
            else:
                todo.append(i)
    return seen


def public_submodules(wheel: Path) -> set[str]:
    tree = ast.parse((wheel / "accumlib" / "__init__.py").read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_SUBMODULES"]
    return {f"accumlib.{s.value}" for s in node.value.args[0].elts}


def console_scripts(wheel: Path) -> set[str]:
    (info,) = wheel.glob("accumlib-*.dist-info")
    lines = (info / "entry_points.txt").read_text().splitlines()
    return {line.split("=")[1].strip().split(":")[0] for line in lines if "=" in line}


def test_every_module_of_the_core_wheel_is_reached_from_a_door(wheel):
    mods = modules(wheel)
    assert "accumlib._verify.api" in mods and "accumlib.loops.naive" in mods  # the listing sees the wheel
    assert not [m for m in mods if not m.startswith("accumlib")], sorted(mods)  # the core alone
    doors = set(DOORS) | console_scripts(wheel) | public_submodules(wheel)
    assert "accumlib.cli" in doors and "accumlib.observe" in doors
    unreached = sorted(set(mods) - reached(mods, doors))
    assert unreached == [], (
        f"the core wheel holds modules no door reaches (move what only the course or the tools use to "
        f"accumlib_course/ or tools/): {unreached}"
    )
    # what the wheel holds besides modules: its typing marker and the built-in tasks' data
    data = sorted(
        str(p.relative_to(wheel))
        for p in (wheel / "accumlib").rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    )
    assert data == ["accumlib/datafiles/README.md", "accumlib/datafiles/digits.csv.gz", "accumlib/py.typed"]


def test_the_reach_is_real_a_module_only_the_course_imports_is_found(tmp_path):
    """The negative: a module no door imports (here the survey's old place) is listed; one a door imports
    lazily, inside a function, is not."""
    pkg = tmp_path / "accumlib"
    (pkg / "survey").mkdir(parents=True)
    # a module __getattr__ that serves any name (as accumlib's serves its public submodules) reaches nothing
    (pkg / "__init__.py").write_text(
        "import importlib\n\ndef f():\n    from . import cli\n\n"
        "def __getattr__(name):\n    return importlib.import_module(f'{__name__}.{name}')\n"
    )
    (pkg / "cli.py").write_text("import os\n")
    (pkg / "survey" / "__init__.py").write_text("from ..cli import os\n")
    mods = modules(tmp_path)
    assert sorted(set(mods) - reached(mods, {"accumlib"})) == ["accumlib.survey"]


CHECK = """
import importlib, importlib.abc, json, sys
sys.path.insert(0, {wheel!r})

class NoCourse(importlib.abc.MetaPathFinder):  # the course is not installed with the core
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "accumlib_course":
            raise ModuleNotFoundError(f"the core asked for {{name}}")
        return None

sys.meta_path.insert(0, NoCourse())
for name in {names!r}:
    importlib.import_module(name)
print(json.dumps({{m: getattr(sys.modules[m], "__file__", None) for m in sys.modules if m.split(".")[0] in
                  ("accumlib", "accumlib_course")}}))
"""


def test_the_core_imports_from_the_wheel_alone_and_never_the_course(wheel, tmp_path):
    names = sorted(m for m in modules(wheel) if not m.endswith("__main__"))  # a __main__ runs its command
    run = subprocess.run(
        [sys.executable, "-c", CHECK.format(wheel=str(wheel), names=names)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository: only the wheel provides accumlib
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.splitlines()[-1])
    assert not [m for m in loaded if m.startswith("accumlib_course")], sorted(loaded)
    assert set(names) <= set(loaded)
    elsewhere = {m: f for m, f in loaded.items() if f and not f.startswith(str(wheel))}
    assert elsewhere == {}, f"modules not imported from the wheel: {elsewhere}"
