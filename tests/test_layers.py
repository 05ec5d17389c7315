"""Two layers, one direction: the core (``accumlib/``) never imports the course (``accumlib_course/``),
and the course (its modules and the notebooks' code cells) imports only the core's public modules
(``accumlib``, ``accumlib.checks``, never ``accumlib._verify`` or a ``_``-name). Within the course the
report imports nothing from the lessons.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "accumlib"
COURSE = ROOT / "accumlib_course"
LESSONS = "accumlib_course.lessons"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every module (and ``module.name``) that ``source``, the module ``name``, imports, relative imports
    resolved: ``from .. import lessons`` in ``accumlib_course.report.x`` counts as
    ``accumlib_course.lessons``; ``from ..lessons import x`` as that and ``accumlib_course.lessons.x``."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.add(stem)
            out.update(f"{stem}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return out


def of_file(path: Path, root: Path) -> set[str]:
    return imported(path.read_text(), module_name(path, root), path.name == "__init__.py")


def reaches_course(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] == "accumlib_course")


def private_core(modules: set[str]) -> list[str]:
    """Imports of the core that are not its public surface: a ``_`` module or name under ``accumlib``."""
    return sorted(
        m
        for m in modules
        if m.split(".")[0] == "accumlib" and any(p.startswith("_") for p in m.split(".")[1:])
    )


def sources(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts]


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    lines = [
        ln
        for c in cells
        if c["cell_type"] == "code"
        for ln in "".join(c["source"]).splitlines()
        if not ln.lstrip().startswith(("%", "!"))
    ]
    return "\n".join(lines)


def test_the_core_never_imports_the_course():
    files = sources(CORE)
    assert len(files) > 50 and any(p.parent.name == "_verify" for p in files)
    found = {str(p.relative_to(ROOT)): reaches_course(of_file(p, CORE)) for p in files}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_course_imports_only_the_cores_public_modules():
    files = sources(COURSE) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(files) > 40 and any(p.suffix == ".ipynb" for p in files)
    found = {}
    for p in files:
        if p.suffix == ".ipynb":
            modules = imported(notebook_code(p), "notebook")
        else:
            modules = of_file(p, COURSE)
        found[str(p.relative_to(ROOT))] = private_core(modules)
    assert {k: v for k, v in found.items() if v} == {}
    # the scan reads the course: its imports of the core are there to be judged
    assert "accumlib.checks.check_int" in of_file(COURSE / "lessons" / "why_accumulate.py", COURSE)


def test_the_report_imports_nothing_from_the_lessons():
    for p in sorted((COURSE / "report").glob("*.py")):
        assert [m for m in of_file(p, COURSE) if m.startswith(LESSONS)] == [], p


def test_the_scans_see_every_form_of_import(tmp_path):
    # a scan that finds nothing proves nothing: each form below must be caught
    core = tmp_path / "accumlib" / "hf"
    core.mkdir(parents=True)
    for i, line in enumerate(
        [
            "import accumlib_course.lessons.why",
            "from accumlib_course.lessons import _common",
            "from accumlib_course import gallery",
            "import accumlib_course",
        ]
    ):
        f = core / f"m{i}.py"
        f.write_text(line + "\n")
        assert reaches_course(of_file(f, tmp_path / "accumlib")), line
    course = tmp_path / "accumlib_course" / "report"
    course.mkdir(parents=True)
    for i, line in enumerate(
        [
            "import accumlib._verify.codes",
            "from accumlib._verify import CODES",
            "from accumlib import _verify",
            "from accumlib.checks import _private_helper",
            "from accumlib.data import _digits_arrays as d",
        ]
    ):
        f = course / f"m{i}.py"
        f.write_text(line + "\n")
        assert private_core(of_file(f, tmp_path / "accumlib_course")), line
    init = course / "__init__.py"
    init.write_text("from ..lessons import course\n")  # a package's own __init__ resolves from itself
    assert {m for m in of_file(init, tmp_path / "accumlib_course") if m.startswith(LESSONS)} == {
        "accumlib_course.lessons",
        "accumlib_course.lessons.course",
    }
    # and what is public, or the course's own, is not flagged
    clean = course / "clean.py"
    clean.write_text("from .. import _style\nfrom accumlib.text import Table\nfrom accumlib import CODES\n")
    assert private_core(of_file(clean, tmp_path / "accumlib_course")) == []


def test_no_module_takes_a_standard_library_modules_name():
    """A module named like the standard library's (``_verify/numbers.py`` once was, beside ``api.py``'s
    ``import numbers``) reads as that module in every import list and traceback."""
    found = [
        p
        for root in (CORE, COURSE)
        for p in root.rglob("*")
        if (p.suffix == ".py" or p.is_dir()) and p.stem in sys.stdlib_module_names
    ]
    assert not found, found
    # the test sees one: a module named like the standard library's would be caught
    assert "numbers" in sys.stdlib_module_names and "oracle" not in sys.stdlib_module_names


def import_cycles(files: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """The groups of modules (of ``files``: name -> (source, is a package)) that import each other round a
    circle, every import counted: module-level, inside a function, under ``TYPE_CHECKING`` (a circle
    hidden is a circle). A module's own parent packages are left out: Python imports them first, always."""
    names = set(files)
    edges = {
        m: {i for i in imported(src, m, pkg) if i in names and i != m and not m.startswith(i + ".")}
        for m, (src, pkg) in files.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_core_has_no_import_circle():
    """Data flows forward through verify's stages: no module imports one that imports it back (issue 47
    found 7 of _verify's modules in one circle: inplace, inplace_job, inplace_verify, patches, ranks,
    record, shadow)."""
    files = {module_name(p, CORE): (p.read_text(), p.name == "__init__.py") for p in CORE.rglob("*.py")}
    assert import_cycles(files) == []


def test_the_circle_check_finds_a_circle_hidden_under_type_checking():
    files = {
        "pkg": ("from . import d\n", True),
        "pkg.a": ("from .b import x\n", False),
        "pkg.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\n", False),
        "pkg.c": ("def f():\n    from .a import z\n", False),
        "pkg.d": ("from .a import x\n", False),
    }
    assert import_cycles(files) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert import_cycles({k: v for k, v in files.items() if k != "pkg.c"}) == []
