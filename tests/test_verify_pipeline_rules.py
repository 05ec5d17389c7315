"""The verify pipeline reads forward only, checked on the source itself (ast):

- a finding's text comes only from the codes table: nothing in the library builds ``Finding(...)`` by hand
  (``Finding.of`` words it from ``CODES``), nor passes a fix written inline;
- every code the library names (``Finding.of``, ``CODES[...]``, a verdict's ``codes``) and every wording
  (``form=``) is in ``CODES``;
- no module imports another module's private name (``from .x import _name``); a private module of a
  package (``from .. import _checks``) is a module, not a name, and is fine;
- a ``Report`` cannot be edited in place: an adapter adds a finding through ``Report.with_finding``.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from accumlib import CODES, Finding, Report

LIBRARY = Path(__file__).resolve().parents[1] / "accumlib"
COURSE = LIBRARY.parent / "accumlib_course"  # the course beside the core keeps the same rules
FILES = sorted(LIBRARY.rglob("*.py")) + sorted(COURSE.rglob("*.py"))
VERIFY = [
    p
    for p in FILES
    if LIBRARY in p.parents and ("_verify" in p.parts or "hf" in p.parts or p.name == "lightning.py")
]


def _name(p: Path) -> str:
    return str(p.relative_to(LIBRARY.parent))


def _calls(path: Path, name: str) -> list[ast.Call]:
    """Calls of ``name`` or of ``<anything>.name``."""
    return [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, (ast.JoinedStr, ast.BinOp)) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_no_module_writes_a_findings_text_itself(path):
    hand_made = [
        f"{_name(path)}:{c.lineno}"
        for c in _calls(path, "Finding")
        if isinstance(c.func, ast.Name)  # Finding(...), not Finding.of(...)
    ]
    inline_fix = [
        f"{_name(path)}:{c.lineno}"
        for c in _calls(path, "of")
        if isinstance(c.func.value, ast.Name) and c.func.value.id == "Finding"  # type: ignore[attr-defined]
        for kw in c.keywords
        if kw.arg == "fix" and _literal(kw.value)
    ]
    assert not hand_made, f"Finding(...) built by hand (use Finding.of, worded by CODES): {hand_made}"
    assert not inline_fix, f"a fix written inline (it belongs in CODES or diagnose.CAUSES): {inline_fix}"


def _codes_named(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, form) of every code the module names as a literal: ``Finding.of("c", form="f")``,
    ``CODES["c"]``, ``x.codes.append("c")``, ``x.codes += ["c"]``, ``x.codes == ["c"]``, ``"c" in
    x.codes``."""
    found: list[tuple[int, str, str | None]] = []
    tree = ast.parse(path.read_text())

    def strings(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [s for e in node.elts for s in strings(e)]
        if isinstance(node, ast.BinOp):
            return strings(node.left) + strings(node.right)
        return []

    def is_codes(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "codes"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "of" and isinstance(f.value, ast.Name) and f.value.id == "Finding" and node.args:
                form = next((kw.value for kw in node.keywords if kw.arg == "form"), None)
                forms = (strings(form) or [None]) if form is not None else [None]
                for code in strings(node.args[0]):
                    found += [(node.lineno, code, x) for x in forms]
            if f.attr == "append" and is_codes(f.value) and node.args:
                found += [(node.lineno, c, None) for c in strings(node.args[0])]
        elif (
            isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "CODES"
        ):
            found += [(node.lineno, c, None) for c in strings(node.slice)]
        elif isinstance(node, ast.AugAssign) and is_codes(node.target):
            found += [(node.lineno, c, None) for c in strings(node.value)]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = node.left, node.comparators[0]
            if isinstance(node.ops[0], (ast.In, ast.NotIn)) and is_codes(right):
                found += [(node.lineno, c, None) for c in strings(left)]
            elif isinstance(node.ops[0], (ast.Eq, ast.NotEq)) and is_codes(left):
                found += [(node.lineno, c, None) for c in strings(right)]
    return found


@pytest.mark.parametrize("path", VERIFY, ids=_name)
def test_every_code_and_wording_named_in_verify_is_in_the_codes_table(path):
    unknown = [
        f"{_name(path)}:{line} {code!r}" + (f" form={form!r}" if form else "")
        for line, code, form in _codes_named(path)
        if code not in CODES or (form is not None and form not in CODES[code].said)
    ]
    assert not unknown, f"codes or wordings missing from CODES: {unknown}"


def test_the_code_scan_sees_every_way_a_code_is_named():
    """The scan above must not pass by seeing nothing: each pattern it reads is found in verify's modules."""
    named = {(p.name, code) for p in VERIFY for _, code, _ in _codes_named(p)}
    assert ("diagnose.py", "unscaled-sum") in named  # out.codes.append
    assert ("diagnose.py", "tail-misscaled") in named  # out.codes += [...]
    assert ("diagnose_run.py", "misscaled") in named  # v.codes == ["misscaled"], CODES["misscaled"]
    assert ("diagnose_run.py", "tail-dropped") in named  # Finding.of
    assert ("trainer.py", "dropout") in named  # an adapter's note


def test_every_wording_of_a_code_fills_from_named_fields():
    """Each ``said`` template formats with the fields its callers pass (none left as ``{...}``)."""
    fields = dict(
        n=3, total=10, k=4, at="1, 2", logged=1.0, true=0.25, counts=[2, 3], draws=5, ranks=2,
        syncs=4, m=4, worst=0.01, layers=1, ps=[0.1], names="attn_pdrop=0.1", max_norm=0.5, mib=1.0,
        why="drop_last=True", passes=1, per="2", held=10,
    )  # fmt: skip
    for code, entry in CODES.items():
        for form, template in entry.said.items():
            text = template.format(message=entry.message.format(**fields), **fields)
            assert "{" not in text, (code, form, text)
            assert Finding.of(code, form=form, **fields).message == text


def _private_imports(path: Path, top: Path = LIBRARY.parent) -> list[str]:
    """``from x import _name`` where ``_name`` is no module of package x (``top``: where absolute imports
    start)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parent.joinpath(*[".."] * (node.level - 1)).resolve()
        else:
            base = top
        base = base.joinpath(*(node.module.split(".") if node.module else []))
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and not ((base / f"{alias.name}.py").exists() or (base / alias.name).is_dir()):
                out.append(
                    f"{path.relative_to(top)}:{node.lineno} from {'.' * node.level}{node.module or ''} "
                    f"import {alias.name}"
                )
    return out


def _area(p: Path) -> str:
    """The top-level module or package of accumlib or accumlib_course that ``p`` belongs to."""
    return "/".join(p.relative_to(LIBRARY.parent).parts[:2])


# one case per top-level module or package of accumlib and of the course, so a failure names whose it is
AREAS = sorted({_area(p) for p in FILES})


@pytest.mark.parametrize("area", AREAS)
def test_no_module_imports_another_modules_private_name(area):
    found = [x for p in FILES if _area(p) == area for x in _private_imports(p)]
    assert not found, f"private names imported across modules (make them public, or pass them in): {found}"


def test_the_private_import_scan_tells_a_name_from_a_module(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "_helpers.py").write_text("_x = 1\n")
    (pkg / "a.py").write_text(
        "from . import _helpers\nfrom ._helpers import _x\nfrom pkg._helpers import _x\n"
    )
    found = [x.split(" ", 1)[1] for x in _private_imports(pkg / "a.py", tmp_path)]
    assert found == ["from ._helpers import _x", "from pkg._helpers import _x"]


def test_a_report_is_immutable_and_an_adapter_adds_a_finding_through_one_function():
    note = Finding.of("dropout", form="layers", layers=1, ps=[0.1])
    report = Report([], [note], 4, 0, 0)
    assert isinstance(report.findings, tuple) and isinstance(report.steps, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.findings = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        report.findings.append(note)  # type: ignore[attr-defined]
    more = report.with_finding(Finding.of("dropout", form="randomness-too", names="attn_pdrop=0.1"))
    assert report.findings == (note,)  # the report it came from is unchanged
    (merged,) = more.findings  # one finding per code: the adapter's note said beside verify's
    assert (
        merged.message
        == note.message + "; random training-mode probabilities (attn_pdrop=0.1) were set to 0 too"
    )
    other = report.with_finding(Finding.of("partial-run", n=2))
    assert [f.code for f in other.findings] == ["dropout", "partial-run"]
