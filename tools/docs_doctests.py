"""A griffe extension for the API page (tools/docs.py): a docstring's doctest examples (a paragraph that
starts with ``>>>``) become ``pycon`` code blocks, as the docstrings mean them, instead of prose in which
``x[0][0]`` would read as a markdown link."""

from __future__ import annotations

import re
from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    paragraphs = re.split(r"(\n\s*\n)", text)
    return "".join(
        f"```pycon\n{p.strip(chr(10))}\n```" if p.lstrip().startswith(">>>") else p for p in paragraphs
    )


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
