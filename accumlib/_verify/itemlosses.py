"""``--item-losses MODULE:FUNCTION``: a script's own loss, named by the user, seen where the script calls it.

A script whose loss is not one standard loss call (a loss of its own, an auxiliary term, a regulariser
added to each micro-batch's loss) cannot be judged from ``losscalls.py`` alone: how its terms combine
into one item's loss is the script's choice, and accumlib never guesses it. The user names a function
of the script that returns each item's combined loss, one per item (a 1-D tensor, as
``accumlib.verify``'s ``item_losses`` returns), and the script goes on calling it as it does:

    def item_loss(logits, y):                          # train.py
        return F.cross_entropy(logits, y, reduction="none") + 0.1 * aux(logits)
    ...
    (item_loss(model(x), y).sum() / n_window).backward()

    accumlib run --item-losses train:item_loss -- train.py

The function is replaced by a wrapper where the script looks it up: an attribute of an importable
module (``from M import f`` made later sees the wrapper), or a top-level name of the script itself
(``MODULE`` is the script's name or ``__main__``), wrapped as the script's own code defines it. Each call
whose output needs a gradient is one loss call with reduction ``none`` over its ``numel()`` items; the
standard loss calls made inside it are its own terms, not counted again. How the script reduces the
vector (a mean, a sum divided by the window's count, a mask) is read from the gradient flowing into it
(``inplace.py``), as for any ``reduction="none"`` call.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

from .errors import ItemLossesError
from .losscalls import LossCall
from .sites import user_site


def parse(spec: str, script: str | None = None) -> tuple[str, str]:
    """``MODULE:FUNCTION`` split and checked before anything runs; FUNCTION may be ``Class.method``.

    >>> parse("losses:item_loss")
    ('losses', 'item_loss')
    >>> try:
    ...     parse("item_loss")
    ... except ValueError as err:
    ...     print(err)
    item_losses must be MODULE:FUNCTION, a function returning one loss per item (got 'item_loss')
    """
    module, _, name = spec.partition(":")
    if (
        not module
        or not name
        or not all(part.isidentifier() for part in [*module.split("."), *name.split(".")])
    ):
        raise ItemLossesError(
            f"item_losses must be MODULE:FUNCTION, a function returning one loss per item (got {spec!r})"
        )
    return module, name


def is_script(module: str, script: str | None) -> bool:
    """Whether ``module`` names the script run as ``__main__`` (its file's name, or ``__main__``)."""
    return script is not None and module in ("__main__", Path(script).stem)


def check_in_script(script: str, name: str) -> None:
    """The script defines ``name``'s first part at its top level (a def, a class, an assignment, an
    import), where a wrapper can take its place: said before the script runs."""
    tree = ast.parse(Path(script).read_text(encoding="utf-8"), filename=script)
    head, found, todo = name.split(".")[0], False, list(tree.body)
    while todo and not found:
        node = todo.pop()
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):  # still module level
            todo.extend(
                n for field in ("body", "orelse", "finalbody", "handlers") for n in getattr(node, field, [])
            )
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = node.name == head
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found = any((a.asname or a.name.split(".")[0]) == head for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = any(isinstance(t, ast.Name) and t.id == head for t in targets)
    if not found:
        raise ItemLossesError(
            f"item_losses must name a function the script defines at its top level, where its calls can be "
            f"seen (got {name!r}: {script} defines no top-level {head!r}; a function inside main() cannot "
            f"be wrapped, move it out or into a module)"
        )


def wrapper(fn: Callable[..., Any], label: str, seen: Callable[[LossCall], None], inside: list[int]) -> Any:
    """``fn`` as the script calls it, reporting each outermost call's per-item losses to ``seen``;
    ``inside[0]`` counts the calls open, during which standard loss calls are ``fn``'s own terms."""

    def item_losses(*args: Any, **kwargs: Any) -> Any:
        inside[0] += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            inside[0] -= 1
        if inside[0] or not isinstance(out, torch.Tensor) or out.grad_fn is None or not out.requires_grad:
            return out  # nested, or not a training loss (evaluation under no_grad)
        if out.dim() != 1:
            raise ItemLossesError(
                f"item_losses must return one loss per item, a 1-D tensor (got shape {tuple(out.shape)} "
                f"from {label}, called at {user_site() or '?'})"
            )
        items = torch.tensor(out.numel(), device=out.device)
        seen(LossCall(label, user_site() or "", "none", items, out.grad_fn, out.detach(), out.output_nr))
        return out

    item_losses.__wrapped__ = fn  # type: ignore[attr-defined]
    return item_losses


def _resolve(root: Any, path: list[str]) -> tuple[Any, str, Any]:
    """The object holding the last name of ``path`` under ``root``, that name, and its value."""
    holder = root
    for part in path[:-1]:
        holder = getattr(holder, part)
    return holder, path[-1], getattr(holder, path[-1])


@contextlib.contextmanager
def in_module(module: str, name: str, seen: Callable[[LossCall], None], inside: list[int]) -> Iterator[None]:
    """``module.name`` replaced by its wrapper while the context is open; checked first, loud."""
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise ItemLossesError(f"item_losses must name an importable module (got {module!r}: {err})") from None
    try:
        holder, last, fn = _resolve(mod, name.split("."))
    except AttributeError:
        raise ItemLossesError(
            f"item_losses must name a function of {module} (got {name!r}: no such attribute)"
        ) from None
    if not callable(fn):
        raise ItemLossesError(
            f"item_losses must name a function (got {module}:{name}, a {type(fn).__name__})"
        )
    setattr(holder, last, wrapper(fn, f"{module}:{name}", seen, inside))
    try:
        yield
    finally:
        setattr(holder, last, fn)


class _Wrapping(MutableMapping):  # type: ignore[type-arg]
    """The script's module-level names as its code stores them: ``name`` is wrapped as it is defined,
    and every name is written through to the module's own dict (its functions' globals)."""

    def __init__(self, names: dict[str, Any], path: list[str], wrap: Callable[[Any], Any]) -> None:
        self.names, self.path, self.wrap = names, path, wrap

    def __getitem__(self, key: str) -> Any:
        return self.names[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == self.path[0] and len(self.path) == 1:
            value = self.wrap(value)
        elif key == self.path[0]:  # Class.method: the class's attribute, once the class exists
            holder, last, fn = _resolve(value, self.path[1:])
            setattr(holder, last, self.wrap(fn))
        self.names[key] = value

    def __delitem__(self, key: str) -> None:
        del self.names[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def run_main(script: str, wrap: tuple[str, Callable[[Any], Any]] | None = None) -> None:
    """Run ``script`` as ``__main__`` (as ``runpy.run_path`` does: its own module in ``sys.modules``
    while it runs), with ``wrap = (name, wrap_fn)`` applied to a top-level name as the script stores it."""
    path = str(Path(script).resolve())
    code = compile(Path(path).read_bytes(), script, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=__builtins__, __cached__=None, __spec__=None)
    before = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        if wrap is None:
            exec(code, main.__dict__)
        else:
            exec(code, main.__dict__, _Wrapping(main.__dict__, wrap[0].split("."), wrap[1]))
    finally:
        if before is not None:
            sys.modules["__main__"] = before


__all__ = ["check_in_script", "in_module", "is_script", "parse", "run_main", "wrapper"]
