"""``make typecheck``: every name of ``accumlib.__all__``, imported as a user imports it, is one mypy sees.

It writes a file that imports each public name from ``accumlib`` and reveals its type, runs mypy on it
(``mypy.api``, pyproject.toml's [tool.mypy]) and fails on any name mypy types as ``Any``: a name bound at
run time (as ``globals().update`` once bound the reference loops) is one mypy cannot see, and ``accumlib``'s
module ``__getattr__`` (its submodules, served on first use) answers it with ``Any`` instead of an error. A
reference loop must be revealed as a function (``def (...)``), not as its module. The names are read from
``__all__`` and the loops from ``accumlib.loops.ALL``: nothing to keep in step.

    python tools/public_names.py [--cache-dir DIR]     exit 0: every name seen; 1: the names that are not
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import accumlib
from accumlib.loops import ALL


def source(names: list[str]) -> str:
    reveals = "\n".join(f"reveal_type({name})" for name in names)
    return f"from accumlib import {', '.join(names)}\n\n{reveals}\n"


def unseen(revealed: dict[str, str]) -> dict[str, str]:
    """The names whose revealed type shows mypy does not see them as they are."""
    bad = {n: t for n, t in revealed.items() if t == "Any"}
    bad |= {n: t for n, t in revealed.items() if n in ALL and not t.startswith("def ")}
    return bad


def main(argv: list[str] | None = None) -> int:
    from mypy import api

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="mypy's cache (default: its own, .mypy_cache)")
    cache = parser.parse_args(argv).cache_dir
    names = sorted(accumlib.__all__)
    with tempfile.TemporaryDirectory() as tmp:
        check = Path(tmp) / "public_names_check.py"
        check.write_text(source(names))
        out, err, status = api.run([str(check), *(["--cache-dir", cache] if cache else [])])
    revealed = dict(zip(names, re.findall(r'Revealed type is "(.*)"', out)))
    if status not in (0, 1) or len(revealed) != len(names):
        print(out + err, file=sys.stderr)
        return 2
    errors = [line for line in out.splitlines() if ": error:" in line]
    bad = unseen(revealed)
    for name, typ in sorted(bad.items()):
        print(
            f"accumlib.{name}: mypy sees {typ!r} (import it by name in accumlib/__init__.py)", file=sys.stderr
        )
    for line in errors:
        print(line, file=sys.stderr)
    if bad or errors:
        return 1
    print(
        f"typecheck: mypy sees all {len(names)} names of accumlib.__all__ "
        f"(the loops {', '.join(sorted(ALL))}: functions)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
