"""Widget response, step 1: discover the widgets from the notebooks' own code cells (see widgets.py).

A code cell whose saved outputs show a widget, or that calls a lesson function named like a widget
builder (``*widget*``, ``*explorer*``, ``*box*``), names the builder it calls. Literal arguments are
kept, ``device`` becomes ``"cpu"``, notebook variables are left out.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BUILDER_NAME = re.compile(r"widget|explorer|box", re.IGNORECASE)


# --- 1. discovery, from the notebooks' code cells ---------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """One widget a notebook builds: ``module.builder(*args, **kwargs)`` in code cell ``cell``."""

    notebook: str
    cell: int
    module: str
    builder: str
    args: tuple = ()  # literal positional arguments, "<device>" or "<notebook variable>"
    kwargs: tuple = ()  # (name, literal or marker) pairs, as written in the cell
    main: bool = False  # the notebook's first widget

    @property
    def name(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.builder}"


from _widget_driver import _DEVICE, _VARIABLE  # noqa: E402 (the markers the driver reads)


def _argument(node: ast.AST, name: str | None = None) -> Any:
    """A literal stays; a device argument becomes the CPU marker; anything else is a notebook variable."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if name == "device" or (isinstance(node, ast.Name) and node.id in ("device", "dev")):
        return _DEVICE
    return _VARIABLE


def _code(source: str) -> ast.Module | None:
    """A cell's Python, with IPython magics and shell lines blanked; None where it does not parse."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names a cell's imports bind to the course: ``why`` -> ``accumlib_course.lessons.why_accumulate``."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accumlib"):
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("accumlib") and a.asname:
                    names[a.asname] = a.name
    return names


def _target(call: ast.Call, aliases: dict[str, str]) -> tuple[str, str] | None:
    """(module, function) of ``alias.fn(...)`` or of ``fn(...)`` imported from an accumlib module."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
        return aliases[f.value.id], f.attr
    if isinstance(f, ast.Name) and f.id in aliases and "." in aliases[f.id]:
        module, fn = aliases[f.id].rsplit(".", 1)
        return module, fn
    return None


def _shown_calls(tree: ast.Module) -> list[ast.Call]:
    """The calls whose value a cell shows: its last expression, ``display(...)``'s arguments, and the calls
    that bound them.

    ``box = vl.paste_box()`` then ``box`` shows paste_box's value; ``r = compute()`` then
    ``widget(initial=r)`` shows widget's value only (r is an argument, not what is shown).
    """
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return []
    last = tree.body[-1].value
    shown = [last]
    if isinstance(last, ast.Call) and isinstance(last.func, ast.Name) and last.func.id == "display":
        shown = list(last.args)
    calls = [n for n in shown if isinstance(n, ast.Call)] + ([last] if last not in shown else [])
    names = {n.id for n in shown if isinstance(n, ast.Name)}
    for stmt in tree.body[:-1]:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            if any(isinstance(t, ast.Name) and t.id in names for t in stmt.targets):
                calls.append(stmt.value)
    return calls


def _shows_widget(cell: dict) -> bool:
    """The cell's saved outputs hold a widget a learner operates (a progress bar's text is not a widget's
    repr)."""
    return any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        and re.match(r"\w+\(", "".join(o["data"].get("text/plain", "")))
        for o in cell.get("outputs", [])
    )


def discover(paths: list[Path]) -> tuple[list[Found], list[str]]:
    """Every widget the notebooks build, in notebook order; and the cells that show one discovery cannot name.

    A builder is a call into accumlib that a cell shows and whose saved output is a widget, or
    any accumlib call named like a builder (so a notebook saved without outputs still counts).
    Imports anywhere above a cell are in scope, as in a kernel.
    """
    found: list[Found] = []
    unnamed: list[str] = []
    for nb in paths:
        cells = json.loads(Path(nb).read_text())["cells"]
        aliases: dict[str, str] = {}
        first = True
        seen: set[tuple] = set()
        for i, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            tree = _code("".join(cell["source"]))
            if tree is None:
                continue
            aliases |= _aliases(tree)
            shown = set(map(id, _shown_calls(tree))) if _shows_widget(cell) else set()
            named = 0
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
                target = _target(call, aliases)
                if target is None or not (id(call) in shown or _BUILDER_NAME.search(target[1])):
                    continue
                args = tuple(_argument(a) for a in call.args)
                kwargs = tuple((k.arg, _argument(k.value, k.arg)) for k in call.keywords if k.arg)
                key = (target, args, kwargs)
                named += 1
                if key in seen:
                    continue
                seen.add(key)
                found.append(Found(Path(nb).name, i, *target, args, kwargs, main=first))
                first = False
            if _shows_widget(cell) and not named:
                unnamed.append(f"{Path(nb).name} cell {i}")
    return found, unnamed
