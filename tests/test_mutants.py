"""The mutant catalogues of ``tools/mutants/`` still apply to the code they mutate.

A refactor that moves, splits or re-wraps a module leaves its mutants' ``old`` text behind, and
``tools/mutate.py`` then stops at the first stale one, long after the refactor. These checks run no
mutant's tests (seconds in all): every mutant finds its ``old`` text once (or at ``at``) in a file that
exists, changes it, and still compiles; every test path a group or a mutant names exists; names are
unique, since the record and its page (``tools/mutation.json``, ``tools/mutation.md``) key by them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutate():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutate", mod)  # the catalogues import Mutant from it by this name
    spec.loader.exec_module(sys.modules["mutate"])
    return sys.modules["mutate"]


mutate = _mutate()
GROUPS = mutate.groups()


def _exists(test: str) -> bool:
    return (ROOT / test.split("::")[0]).exists()


def test_every_module_group_has_a_catalogue():
    assert {"distributed", "harness", "hf", "lightning", "report", "survey", "verify"} <= set(GROUPS)


@pytest.mark.parametrize("group", GROUPS)
def test_every_mutant_changes_its_file_once_and_still_compiles(group):
    broken = []
    for m in mutate.load(group).MUTANTS:
        path = ROOT / m.file
        if not path.is_file():
            broken.append(f"{group}: {m.name!r}: its file {m.file} does not exist")
            continue
        text = path.read_text()
        try:
            mutated = m.apply(text)  # raises unless old occurs exactly once, or at= picks an occurrence
            compile(mutated, m.file, "exec")
        except (ValueError, SyntaxError) as err:
            broken.append(f"{group}: {m.name!r}: {err}")
            continue
        if mutated == text:
            broken.append(f"{group}: {m.name!r}: old and new are the same text (nothing mutated)")
    assert not broken, "stale mutants (update file/old/new in tools/mutants/):\n" + "\n".join(broken)


@pytest.mark.parametrize("group", GROUPS)
def test_every_test_path_a_group_names_exists(group):
    mod = mutate.load(group)
    missing = [f"{group}: TESTS: {t}" for t in mod.TESTS if not _exists(t)]
    missing += [f"{group}: {m.name!r}: tests=: {t}" for m in mod.MUTANTS for t in m.tests if not _exists(t)]
    assert mod.TESTS, f"{group}: TESTS is empty (a mutant would run nothing and survive)"
    assert not missing, "test paths that do not exist:\n" + "\n".join(missing)


def test_mutant_names_are_unique():
    seen: dict[str, str] = {}
    twice = []
    for group in GROUPS:
        for m in mutate.load(group).MUTANTS:
            if m.name in seen:
                twice.append(f"{m.name!r} in {seen[m.name]} and {group}")
            seen[m.name] = group
    assert not twice, "mutant names used twice:\n" + "\n".join(twice)


def test_the_catalogue_listing_exits_0():
    p = subprocess.run(
        [sys.executable, "tools/mutate.py", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert "broken:" not in p.stderr
