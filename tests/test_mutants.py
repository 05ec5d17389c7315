"""The mutant catalogues of ``tools/mutants/`` still apply to the code they mutate.

A mutant is an operator on the one node of the library whose code is its pattern (see
``tools/mutate.py``), found wherever that code lies: a refactor that keeps behaviour (a rename
elsewhere, a module moved, a line re-wrapped) keeps every mutant, and a change of the code a mutant
names shows here, not hours into a mutation run. These checks run no mutant's tests (seconds in all):
every mutant's pattern matches exactly one node, its operator fits that node, and the mutated module
differs and still compiles; every test a group or a mutant names (its ``killers`` too) exists; every
mutant not argued equivalent names its killers; names are unique, since the record and its page
(``tools/mutation.json``, ``tools/mutation.md``) key by them. Nothing here quotes the library's source.
"""

from __future__ import annotations

import ast
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


@pytest.fixture(scope="module")
def library():
    return mutate.Library()


def test_every_module_group_has_a_catalogue():
    assert {"distributed", "harness", "hf", "lightning", "report", "survey", "verify"} <= set(GROUPS)


@pytest.mark.parametrize("group", GROUPS)
def test_every_mutant_changes_one_node_and_its_module_still_compiles(group, library):
    broken = []
    for m in mutate.load(group).MUTANTS:
        try:
            rel, mutated = mutate.apply(m, library)  # Broken unless its pattern matches exactly one node
            compile(mutated, rel, "exec")
        except (mutate.Broken, SyntaxError) as err:
            broken.append(f"{group}: {m.name!r}: {err}")
            continue
        if ast.dump(ast.parse(mutated)) == ast.dump(library.trees[rel]):
            broken.append(f"{group}: {m.name!r}: the mutated module is the module (nothing mutated)")
    assert not broken, "stale mutants (update pattern/node/within in tools/mutants/):\n" + "\n".join(broken)


@pytest.mark.parametrize("group", GROUPS)
def test_every_test_a_group_names_exists(group):
    mod = mutate.load(group)
    missing = [f"{group}: TESTS: {t}: {why}" for t in mod.TESTS if (why := mutate.missing_test(t))]
    for m in mod.MUTANTS:
        missing += [
            f"{group}: {m.name!r}: {t}: {why}" for t in m.tests + m.killers if (why := mutate.missing_test(t))
        ]
    assert mod.TESTS, f"{group}: TESTS is empty (a mutant would run nothing and survive)"
    assert not missing, "tests that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("group", GROUPS)
def test_every_mutant_not_equivalent_names_its_killers(group):
    bare = [m.name for m in mutate.load(group).MUTANTS if not m.killers and not m.equivalent]
    assert not bare, f"{group}: mutants naming no test that must kill them:\n" + "\n".join(bare)


def test_mutant_names_are_unique():
    seen: dict[str, str] = {}
    twice = []
    for group in GROUPS:
        for m in mutate.load(group).MUTANTS:
            if m.name in seen:
                twice.append(f"{m.name!r} in {seen[m.name]} and {group}")
            seen[m.name] = group
    assert not twice, "mutant names used twice:\n" + "\n".join(twice)


def test_every_operator_is_one_the_tool_knows():
    unknown = [
        f"{m.name!r}: {m.op!r}" for g in GROUPS for m in mutate.load(g).MUTANTS if m.op not in mutate.OPS
    ]
    assert not unknown, f"operators must be among {', '.join(mutate.OPS)}:\n" + "\n".join(unknown)


def test_a_pattern_is_found_by_its_code_not_its_formatting(tmp_path):
    (tmp_path / "accumlib" / "sub").mkdir(parents=True)
    (tmp_path / "accumlib" / "sub" / "m.py").write_text(
        "def f(loss, k):\n    return (loss /\n            k)  # the mean\n\n\ndef g(x):\n    return x < 1\n"
    )
    lib = mutate.Library(tmp_path)
    m = mutate.Mutant("a dropped factor", "drop-factor", "loss / k", "k", killers=("tests/test_x.py",))
    rel, text = mutate.apply(m, lib)
    assert rel == "accumlib/sub/m.py"
    assert text == "def f(loss, k):\n    return (loss)  # the mean\n\n\ndef g(x):\n    return x < 1\n"
    flip = mutate.Mutant("a flipped comparison", "compare", "x < 1", "<=", within="g")
    assert mutate.apply(flip, lib)[1].endswith("    return x <= 1\n")
    with pytest.raises(mutate.Broken, match="matches 0 nodes"):
        mutate.apply(mutate.Mutant("gone", "negate", "x > 1"), lib)


def test_the_catalogue_listing_exits_0():
    p = subprocess.run(
        [sys.executable, "tools/mutate.py", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert "broken:" not in p.stderr
