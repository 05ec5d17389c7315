"""The library never reaches up into the lessons: ``accumlib/lessons/`` may import the library, but no
module outside it imports ``accumlib.lessons`` (the report included). What both need (the plotting
style, the tables, the argument checks, the digits) lives in the library.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent.parent / "accumlib"
LESSONS = "accumlib.lessons"


def module_name(path: Path, root: Path = LIBRARY) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = LIBRARY) -> set[str]:
    """Every module ``path`` imports, relative imports resolved (``from .. import lessons`` counts
    as ``accumlib.lessons``; ``from ..lessons import x`` as ``accumlib.lessons`` and ``...lessons.x``)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def reaches_lessons(path: Path, root: Path = LIBRARY) -> list[str]:
    return sorted(m for m in imported(path, root) if m == LESSONS or m.startswith(LESSONS + "."))


def test_no_module_outside_the_lessons_imports_them():
    outside = [
        p for p in sorted(LIBRARY.rglob("*.py")) if "__pycache__" not in p.parts and "lessons" not in p.parts
    ]
    assert len(outside) > 50 and any(p.parent.name == "report" for p in outside)
    found = {str(p.relative_to(LIBRARY.parent)): reaches_lessons(p) for p in outside}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_report_imports_nothing_from_the_lessons():
    for p in sorted((LIBRARY / "report").glob("*.py")):
        assert reaches_lessons(p) == [], p


def test_the_scan_sees_every_way_of_importing_a_lesson(tmp_path):
    # a scan that finds nothing proves nothing: each form below must be caught
    pkg = tmp_path / "accumlib" / "report"
    pkg.mkdir(parents=True)
    forms = [
        "import accumlib.lessons.why",
        "from accumlib.lessons import _common",
        "from accumlib import lessons",
        "from ..lessons._common import Table",
        "from .. import lessons",
        "from ..lessons import why as w",
    ]
    for i, line in enumerate(forms):
        f = pkg / f"m{i}.py"
        f.write_text(line + "\n")
        assert reaches_lessons(f, tmp_path / "accumlib"), line
    init = pkg / "__init__.py"
    init.write_text("from ..lessons import course\n")  # a package's own __init__ resolves from itself
    assert reaches_lessons(init, tmp_path / "accumlib") == ["accumlib.lessons", "accumlib.lessons.course"]
    # and what is not a lesson is not flagged
    clean = pkg / "clean.py"
    clean.write_text("from .. import _style\nfrom .._text import Table\nimport accumlib.lessonsx\n")
    assert reaches_lessons(clean, tmp_path / "accumlib") == []


def test_no_module_of_the_library_takes_a_standard_library_modules_name():
    """A module named like the standard library's (``_verify/numbers.py`` once was, beside ``api.py``'s
    ``import numbers``) reads as that module in every import list and traceback."""
    import sys

    found = [
        p
        for p in LIBRARY.rglob("*")
        if (p.suffix == ".py" or p.is_dir()) and p.stem in sys.stdlib_module_names
    ]
    assert not found, found
    # the test sees one: a module named like the standard library's would be caught
    assert "numbers" in sys.stdlib_module_names and "oracle" not in sys.stdlib_module_names
