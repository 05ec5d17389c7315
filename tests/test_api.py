"""The package's face: a small public surface, submodules on demand, rooms a newcomer can find.

These are structural promises of issue 13, checked on the code as it stands: the names
``import accumlib`` offers, what importing it costs, that each public function has type hints
and a runnable example, and that the library never calls its own command line. (Module length is a
review signal, not a rule: CONTRIBUTING.md.)
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import accumlib
from accumlib.loops import ALL

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = {
    "LOOPS",
    *ALL,  # every registered loop, read from the registry: a new loop file adds its name
    "true_gradient",
    "grads_of",
    "compare",
    "Comparison",
    "verify",
    "watch",
    "Report",
    "Finding",
    "CODES",
    "VerifyError",
    "Task",
    "get_task",
    "TASKS",
    "resolve_device",
}


def test_the_public_surface_is_small_and_every_name_resolves():
    assert set(accumlib.__all__) == PUBLIC
    assert len(accumlib.__all__) <= 25
    for name in accumlib.__all__:
        assert getattr(accumlib, name) is not None, name


def test_verify_is_the_function_and_nothing_else_answers_to_the_name():
    assert inspect.isfunction(accumlib.verify)
    assert importlib.util.find_spec("accumlib.verify") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("accumlib.verify")


def test_import_accumlib_loads_no_framework_gallery_or_lessons():
    code = (
        "import sys, accumlib; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('accumlib', 'accumlib_course', 'transformers', 'lightning', 'accelerate', 'ipywidgets', "
        "'matplotlib'))))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    heavy = {
        "accumlib_course",
        "accumlib.distributed",
        "accumlib.hf",
        "accumlib.lightning",
        "accumlib_course.survey",
        "transformers",
        "lightning",
        "accelerate",
        "ipywidgets",
        "matplotlib",
    }
    assert not loaded & heavy, sorted(loaded & heavy)
    assert "accumlib.loops" in loaded  # the negative: the listing above really sees accumlib's modules


def test_submodules_come_on_first_use_and_other_names_are_refused_with_a_lead():
    assert accumlib.data.digits  # served by the module's __getattr__
    assert "data" in dir(accumlib) and "gallery" not in dir(accumlib)  # the course lives beside the core
    with pytest.raises(AttributeError, match=r"'gallery'.*accumlib.__all__"):
        accumlib.gallery  # noqa: B018 - accumlib_course.gallery
    with pytest.raises(AttributeError, match=r"'digits'.*accumlib.__all__.*data"):
        accumlib.digits  # noqa: B018 - it moved to accumlib.data


def _public_functions():
    for name in sorted(accumlib.__all__):
        obj = getattr(accumlib, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj
    # the submodules a user of the library calls into (the lessons, the report, the survey and the
    # launcher are reached through notebooks and command lines)
    for mod in ("data", "models", "tasks", "oracle", "compare", "harness", "reference", "hf", "lightning"):
        module = importlib.import_module(f"accumlib.{mod}")
        assert hasattr(module, "__all__"), f"accumlib.{mod} must say what is public with __all__"
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{mod}.{name}", obj


@pytest.mark.parametrize("name,obj", list(_public_functions()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_public_function_has_type_hints_and_a_runnable_example(name, obj):
    assert ">>>" in (inspect.getdoc(obj) or ""), f"{name}: no runnable example in its docstring"
    if inspect.isfunction(obj):
        hints = typing.get_type_hints(obj)
        params = [
            p
            for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        missing = [p.name for p in params if p.name not in hints] + ([] if "return" in hints else ["return"])
        assert not missing, f"{name}: no type hint for {missing}"


def test_device_defaults_to_the_models_own_everywhere():
    defaults = {}
    for name in accumlib.LOOPS:
        defaults[name] = inspect.signature(accumlib.LOOPS[name]).parameters["device"].default
    from accumlib.distributed import ddp_accumulate
    from accumlib.harness import trace_loop
    from accumlib.reference import check_reference_loops

    for fn in (ddp_accumulate, trace_loop, check_reference_loops, accumlib.true_gradient):
        defaults[fn.__name__] = inspect.signature(fn).parameters["device"].default
    assert set(defaults.values()) == {None}, defaults


def _imported_modules(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_library_never_calls_its_own_command_line():
    callers = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "accumlib").rglob("*.py")
        if p.name not in ("cli.py", "__main__.py") or p.parent.name != "accumlib"
        if "accumlib.cli" in _imported_modules(p)
    ]
    assert callers == []
    # the negative: the scan does see the package's own entry point import its command line
    assert "accumlib.cli" in _imported_modules(ROOT / "accumlib" / "__main__.py")


def test_contributing_names_only_files_that_exist():
    """CONTRIBUTING.md is the map of where to make a change: every file it names must be there."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = set(
        re.findall(
            r"`((?:accumlib_course|accumlib|benchmarks|notebooks|tests|tools|docs)/[\w/.-]+\.(?:py|ipynb|md|txt))`",
            text,
        )
    )
    assert len(named) >= 15  # the negative: the pattern does find the map's files
    missing = sorted(p for p in named if not (ROOT / p).exists() and "NN_" not in p)  # NN_name: a pattern
    assert not missing, missing
    for module in ("_contract.py", "harness.py", "reference.py", "_render.py", "_timing.py"):
        assert module in text  # the rooms issue 13 made are on the map
