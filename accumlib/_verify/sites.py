"""Where in the user's code a call came from: the ``file:line`` a finding points at.

The record stage asks at the calls that make a finding: the optimizer step, each backward, each clip,
a scheduler step that changed the rate inside a window. The site is the innermost frame that is the
user's: not torch, not a framework installed as a package (Accelerate, Lightning, the Trainer: their
frames are where the user's call went, not where it was written), not verify itself.

Printed the same on any machine: a file inside accumlib as ``accumlib/...``, a file under the working
directory relative to it, a notebook cell (ipykernel compiles each into a temporary file named after
its process) as ``notebook cell``; anything else as its path. A backward that autograd runs on another
thread (CUDA) has no user frame above it: no site.

>>> site = user_site()
>>> site is None or ":" in site
True
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path
from types import CodeType

import torch

_PACKAGE = Path(__file__).resolve().parents[1]  # accumlib/
_OWN = (
    str(Path(torch.__file__).resolve().parent),
    str(_PACKAGE / "_verify"),
    str(_PACKAGE / "hf"),
    str(_PACKAGE / "lightning.py"),
    str(_PACKAGE / "lessons" / "_grading.py"),
    str(Path(sysconfig.get_paths()["stdlib"]).resolve()),
)
_CELL = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")


_LIBRARY = ""  # a frame of torch, a framework, the standard library or verify: look further out


def _shown(filename: str) -> str | None:
    """How a frame's file is named in a finding; ``_LIBRARY`` for a frame that is not the user's, None
    for the user's code without a file to point at (``<stdin>``, a README's example run by exec)."""
    return _named(filename, os.getcwd())  # the name depends on the working directory: part of the key


@lru_cache(maxsize=4096)
def _named(filename: str, cwd: str) -> str | None:
    if filename.startswith("<frozen"):
        return _LIBRARY
    if filename.startswith("<"):
        return None
    if _CELL.search(filename):
        return "notebook cell"
    path = Path(filename).resolve()
    if str(path).startswith(_OWN) or "site-packages" in path.parts or "dist-packages" in path.parts:
        return _LIBRARY
    if path.suffix != ".py":
        return None
    if path.is_relative_to(_PACKAGE):
        return str(Path("accumlib") / path.relative_to(_PACKAGE))
    if path.is_relative_to(cwd):
        return os.path.relpath(path, cwd)
    if path.is_relative_to(_PACKAGE.parent):
        # beside the package in its checkout (the course's examples from a notebook's folder): named from the
        # checkout's root, the same on every machine, where the absolute path would name this one
        return str(path.relative_to(_PACKAGE.parent))
    return str(path)


def code_site(code: CodeType) -> str:
    """``file:line`` of a function's first line, its file named as ``user_site`` names it."""
    shown = _shown(code.co_filename)
    return f"{shown or code.co_filename}:{code.co_firstlineno}"


def user_site() -> str | None:
    """``file:line`` of the innermost calling frame that is the user's code (None: it has no file)."""
    frame = sys._getframe(1)
    while frame is not None:
        shown = _shown(frame.f_code.co_filename)
        if shown != _LIBRARY:
            return None if shown is None else f"{shown}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


__all__ = ["code_site", "user_site"]
