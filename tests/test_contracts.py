"""Each loop carries its own contract, and the reference table reads it from the one registry.

verify decides: a contract's promise holds only if ``accumlib.verify`` says those codes of one epoch of
the loop, judged against the true large-batch gradient. A false promise must turn the table red.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import accumlib
from accumlib import loops
from accumlib.loops import ALL, CONTRACTS, LOOPS, Contract
from accumlib.reference import check_reference_loops

LOOP_FILES = sorted(p.stem for p in Path(loops.__file__).parent.glob("[a-z]*.py"))


def test_every_loop_file_carries_a_contract_and_the_registry_holds_them_all():
    assert LOOP_FILES == sorted(CONTRACTS)
    for name in LOOP_FILES:
        module = importlib.import_module(f"accumlib.loops.{name}")
        assert CONTRACTS[name] is module.CONTRACT  # read from the loop's own file, not restated elsewhere
    tabulated = sorted((c.order, name) for name, c in CONTRACTS.items() if c.order is not None)
    assert list(LOOPS) == [name for _, name in tabulated]  # ordered by contract
    assert "grad_divided" in CONTRACTS and "grad_divided" not in LOOPS  # a variant: out of the table
    assert list(ALL) == list(CONTRACTS) and set(LOOPS) <= set(ALL)


def test_every_loop_name_is_its_function_not_its_module():
    """``from accumlib.loops import <name>`` and ``accumlib.<name>`` give the function the registry holds:
    both packages import each loop by name (plain imports a type checker sees), so a loop file the registry
    discovers and those imports miss fails here, and so does an exported name the registry does not hold."""
    for name, fn in ALL.items():
        assert callable(fn) and fn.__name__ == name and fn.__module__ == f"accumlib.loops.{name}"
        assert getattr(loops, name) is fn and getattr(accumlib, name) is fn, name
        assert name in loops.__all__ and name in accumlib.__all__, name
    exported = {n for n in accumlib.__all__ if n in loops.__all__ and n != "LOOPS"}
    assert exported == set(ALL) == {n for n in loops.__all__ if getattr(loops, n) in ALL.values()}


def test_the_table_reads_each_promise_from_the_contract():
    table = check_reference_loops(tasks=["mlp-digits", "lm-tokens"], loops=["naive", "normalized", "ragged"])
    for row in table.rows:
        assert row.expected == CONTRACTS[row.loop].expected(accumlib.get_task(row.task).tags)
    assert table.ok, str(table)


def test_a_variant_out_of_the_table_keeps_its_promise_when_named():
    table = check_reference_loops(loops=["grad_divided"])
    assert {r.task: r.verdict for r in table.rows} == {
        "cnn-batchnorm": ("batchnorm",),
        "cnn-groupnorm": (),
        "lm-tokens": ("mean-of-means",),
        "mlp-digits": ("mean-of-means", "tail-misscaled"),
    }
    assert table.ok, str(table)


def test_a_false_promise_turns_the_table_red(monkeypatch):
    """The negative case: ragged promising 'unscaled-sum' on a ragged tail is caught by verify."""
    lie = dataclasses.replace(
        CONTRACTS["ragged"], full_windows=("unscaled-sum",), ragged_tail=("unscaled-sum",)
    )
    monkeypatch.setitem(CONTRACTS, "ragged", lie)
    table = check_reference_loops(tasks=["mlp-digits"], loops=["ragged"])
    assert not table.ok and "FAILED" in str(table)
    assert table.rows[0].verdict == () and table.rows[0].expected == ("unscaled-sum",)


def test_a_promise_of_fewer_codes_than_verify_says_is_broken(monkeypatch):
    """A verdict is the whole set of codes: normalized promising only the tail's code on mlp-digits (whose
    last micro-batch holds 6 items, not 8) misses mean-of-means, and the row fails."""
    short = dataclasses.replace(CONTRACTS["normalized"], ragged_tail=("tail-misscaled",))
    monkeypatch.setitem(CONTRACTS, "normalized", short)
    row = check_reference_loops(tasks=["mlp-digits"], loops=["normalized"]).rows[0]
    assert row.verdict == ("mean-of-means", "tail-misscaled") and not row.holds


TAIL, COUNTS, BN = ("tail-misscaled",), ("mean-of-means",), ("batchnorm",)


@pytest.mark.parametrize(
    "tags,verdict",
    [
        ((), ()),
        (("ragged-tail",), TAIL),
        (("token-counts",), COUNTS),
        (("batchnorm",), BN),
        (("ragged-tail", "batchnorm"), BN),  # BatchNorm spoils every step, so it decides
    ],
)
def test_a_task_with_several_tags_takes_the_strongest_kind(tags, verdict):
    c = Contract(full_windows=(), ragged_tail=TAIL, token_counts=COUNTS, batchnorm=BN, order=None)
    assert c.expected(tags) == verdict


@pytest.mark.parametrize(
    "tags, kind",
    [
        (("ragged-tail", "token-counts"), "token-counts"),  # token counts spoil every window, a tail one
        (("token-counts", "ragged-tail"), "token-counts"),  # the order the task lists them in does not matter
        (("token-counts", "batchnorm"), "batchnorm"),
        (("ragged-tail", "token-counts", "batchnorm"), "batchnorm"),
        (("ragged-tail",), "ragged-tail"),
    ],
)
def test_several_tags_are_taken_by_priority_each_kind_its_own_verdict(tags, kind):
    """Issue 27: with ragged_tail and token_counts promised alike, taking them in another order survived;
    here every kind promises a verdict of its own."""
    c = Contract(full_windows=(), ragged_tail=TAIL, token_counts=COUNTS, batchnorm=BN, order=None)
    assert c.expected(tags) == getattr(c, kind.replace("-", "_"))


def test_a_contract_refuses_an_unknown_verdict_or_task_field():
    with pytest.raises(ValueError, match=r"ragged_tail must hold codes of accumlib.CODES \(got \['fine'\]\)"):
        Contract(full_windows=(), ragged_tail=("fine",), token_counts=(), batchnorm=BN, order=None)
    # the old vocabulary's string, or one code not in a tuple: refused by name
    with pytest.raises(TypeError, match=r"full_windows must be a tuple of verify's codes.*\(got 'exact'\)"):
        Contract(full_windows="exact", ragged_tail=(), token_counts=(), batchnorm=BN, order=None)
    with pytest.raises(TypeError, match=r"batchnorm must be a tuple .*\(got 'batchnorm'\)"):
        Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm="batchnorm", order=None)
    with pytest.raises(ValueError, match=r"takes must name task fields among .*\['counter'\]"):
        Contract(
            full_windows=(), ragged_tail=(), token_counts=(), batchnorm=BN, order=None, takes=("counter",)
        )


def test_a_contract_keeps_its_codes_sorted_as_a_trace_gives_them():
    c = Contract(
        full_windows=("unscaled-sum", "batchnorm"), ragged_tail=(), token_counts=(), batchnorm=(), order=None
    )
    assert c.full_windows == ("batchnorm", "unscaled-sum")


def test_adding_a_loop_is_one_file(tmp_path, monkeypatch):
    """A new file in loops/ with a CONTRACT is registered; one without is refused by name."""
    (tmp_path / "halved.py").write_text(
        "from accumlib.loops.naive import naive as _naive\n"
        "from accumlib.loops._contract import Contract\n"
        "def halved(*args, **kwargs):\n    return _naive(*args, **kwargs)\n"
        "U = ('unscaled-sum',)\n"
        "CONTRACT = Contract(full_windows=U, ragged_tail=U, token_counts=U, batchnorm=U, order=9)\n"
    )
    monkeypatch.setattr(loops, "__path__", [*loops.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "accumlib.loops.halved", raising=False)
    found = loops._discover()
    assert list(found)[-1] == "halved" and found["halved"][1].order == 9
    (tmp_path / "broken.py").write_text("def broken(*args, **kwargs):\n    return []\n")
    with pytest.raises(TypeError, match=r"loops/broken.py must end with CONTRACT = Contract"):
        loops._discover()
    for name in ("halved", "broken"):  # the import bound each name on the package: leave none behind
        sys.modules.pop(f"accumlib.loops.{name}", None)
        vars(loops).pop(name, None)


def test_a_function_of_ones_own_named_like_a_loop_gets_no_contract():
    """The harness hands a loop its contract's task fields only when it is the registered loop itself."""
    from accumlib.loops import contract_of

    def ragged(model, optimizer, loader, item_losses, *, accum_steps, device=None):  # noqa: ARG001 - a user's own
        return []

    assert contract_of(ragged) is None
    assert contract_of(accumlib.ragged) is CONTRACTS["ragged"]


SCRATCH_LOOP = """
from accumlib.loops._contract import Contract
from accumlib.loops.naive import naive as _naive


def scratch_count(model, optimizer, loader, item_losses, *, accum_steps, device=None, progress=False):
    return _naive(model, optimizer, loader, item_losses, accum_steps=accum_steps, device=device)


U = ("unscaled-sum",)
CONTRACT = Contract(full_windows=U, ragged_tail=U, token_counts=U, batchnorm=("batchnorm", *U), order=9)
"""


def test_a_new_loop_file_is_exported_as_its_function(tmp_path):
    """A copy of the package with one more loop file, imported fresh: the registry finds it, and until both
    packages import it by name (the plain imports a type checker sees) its name is its module, which
    ``test_every_loop_name_is_its_function_not_its_module`` refuses; with the two imports, its name is the
    function everywhere (also right after ``import accumlib.loops.scratch_count``, which binds a submodule's
    name to the module when nothing rebinds it)."""
    package = Path(accumlib.__file__).parent
    shutil.copytree(package, tmp_path / "accumlib", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "accumlib" / "loops" / "scratch_count.py").write_text(SCRATCH_LOOP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = (
        "import inspect, accumlib.loops as L; "
        "print('scratch_count' in L.ALL, inspect.isfunction(getattr(L, 'scratch_count')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert found.stdout.split() == ["True", "False"], found.stdout + found.stderr  # registered, not exported
    loops_init, init = tmp_path / "accumlib" / "loops" / "__init__.py", tmp_path / "accumlib" / "__init__.py"
    text = loops_init.read_text().replace(
        "from .ragged import ragged\n",
        "from .ragged import ragged\nfrom .scratch_count import scratch_count\n",
    )
    loops_init.write_text(text.replace("__all__ = [\n", '__all__ = [\n    "scratch_count",\n'))
    text = re.sub(
        r"^(from \.loops import LOOPS, .*)$", r"\1, scratch_count", init.read_text(), count=1, flags=re.M
    )
    init.write_text(text.replace('    "grad_divided",\n', '    "grad_divided",\n    "scratch_count",\n'))
    code = f"COPY = {str(tmp_path)!r}\n" + textwrap.dedent(
        """
        import inspect
        import accumlib.loops.scratch_count
        from accumlib.loops import ALL, CONTRACTS, LOOPS, scratch_count
        import accumlib
        assert accumlib.__file__.startswith(COPY), accumlib.__file__  # the copy, not the repository
        assert inspect.isfunction(scratch_count), scratch_count
        assert scratch_count is ALL["scratch_count"] is accumlib.scratch_count
        assert list(LOOPS)[-1] == "scratch_count" and CONTRACTS["scratch_count"].order == 9
        assert "scratch_count" in accumlib.loops.__all__ and "scratch_count" in accumlib.__all__
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    # the negative: the repository's own package never saw the scratch loop
    assert "scratch_count" not in ALL and not hasattr(loops, "scratch_count")
