"""The one module of argument checks (``accumlib/checks.py``): its message shape, what each check
accepts and refuses, and that nothing else in the library defines a check of its own.

Every message reads ``<name> must be <rule>[; <why>] (got <value>)``: the argument, the rule, where a
bound comes from, and the value as given (with its type where ``2.0`` or ``True`` would read as valid).
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch

from accumlib.checks import (
    check_callable,
    check_choice,
    check_device,
    check_float,
    check_int,
    check_ints,
    check_model,
    resolve_device,
)

LIBRARY = Path(__file__).resolve().parent.parent / "accumlib"
CHECKS = LIBRARY / "checks.py"
# the checks checks.py holds, and the names of copies it replaced (which must stay gone)
CHECK_NAMES = (
    "check_int",
    "check_float",
    "check_ints",
    "check_choice",
    "check_model",
    "check_callable",
    "resolve_device",
    "check_device",
)
RETIRED_NAMES = ("check_accum_steps", "check_world_size")
# <name> must be <rule>[; <why>] (got <value>)
SHAPE = re.compile(r"^(?P<name>\S+) must be (?P<rule>[^;]+?)(?:; (?P<why>.+))? \(got (?P<got>.+)\)$")


def message(check, *args, **kwargs) -> str:
    with pytest.raises((ValueError, TypeError)) as err:
        check(*args, **kwargs)
    return str(err.value)


# ---- the one message shape ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: check_int("k", 0, low=1),
        lambda: check_int("k", 2.0, low=1),
        lambda: check_int("k", 9, low=1, high=8, why="the machine holds 8"),
        lambda: check_float("lr", math.nan, low=0, low_open=True),
        lambda: check_float("lr", "0.1"),
        lambda: check_ints("ks", []),
        lambda: check_ints("ks", [1, 0], low=1),
        lambda: check_choice("norm", "layer", ("batch", "group")),
        lambda: check_callable("fn", 3, "fn(x)"),
        lambda: resolve_device("tpu"),
    ],
    ids=[
        "int low",
        "int type",
        "int high why",
        "float nan",
        "float type",
        "ints empty",
        "ints item",
        "choice",
        "callable",
        "device",
    ],
)
def test_every_refusal_names_the_argument_the_rule_and_the_value(call):
    with pytest.raises((ValueError, TypeError)) as err:
        call()
    assert SHAPE.match(str(err.value)), str(err.value)


def test_a_reason_follows_the_rule_after_a_semicolon():
    said = message(check_int, "world_size", 9, low=1, high=8, why="the ranks this machine holds")
    assert said == "world_size must be an integer between 1 and 8; the ranks this machine holds (got 9)"
    assert SHAPE.match(said)["why"] == "the ranks this machine holds"
    # no reason given: no semicolon
    assert message(check_int, "world_size", 9, low=1, high=8) == (
        "world_size must be an integer between 1 and 8 (got 9)"
    )


# ---- check_int ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 2.0, "3", None, torch.tensor(3)])
def test_an_integer_refuses_bools_floats_strings_and_none(value):
    said = message(check_int, "k", value, low=0)
    assert said == f"k must be an integer >= 0 (got {value!r} of type {type(value).__name__})"


def test_integer_bounds_are_inclusive():
    assert check_int("k", 1, low=1, high=3) == 1 and check_int("k", 3, low=1, high=3) == 3
    assert message(check_int, "k", 0, low=1, high=3) == "k must be an integer between 1 and 3 (got 0)"
    assert message(check_int, "k", 4, low=1, high=3) == "k must be an integer between 1 and 3 (got 4)"
    assert message(check_int, "k", 4, high=3) == "k must be an integer <= 3 (got 4)"


def test_an_integer_comes_back_as_a_plain_int():
    import numpy as np

    out = check_int("k", np.int64(4), low=1)
    assert out == 4 and type(out) is int
    assert check_int("k", -5) == -5  # no bounds: any integer


def test_an_optional_integer_accepts_none_and_says_so_when_refusing():
    assert check_int("max_steps", None, low=1, optional=True) is None
    assert check_int("max_steps", 2, low=1, optional=True) == 2
    assert message(check_int, "max_steps", 0, low=1, optional=True) == (
        "max_steps must be None or an integer >= 1 (got 0)"
    )
    assert "None" not in message(check_int, "max_steps", 0, low=1)


# ---- check_float --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, True, "0.1", None])
def test_a_number_refuses_nan_bools_strings_and_none(value):
    assert message(check_float, "lr", value) == f"lr must be a number (got {value!r})"


def test_a_number_accepts_ints_and_floats_and_returns_a_float():
    assert check_float("lr", 1) == 1.0 and type(check_float("lr", 1)) is float
    assert check_float("lr", math.inf, low=0) == math.inf  # only NaN is refused, not infinity


def test_a_lower_bound_is_inclusive_unless_open():
    assert check_float("clip", 0.0, low=0) == 0.0
    assert message(check_float, "clip", 0.0, low=0, low_open=True) == "clip must be a number > 0 (got 0.0)"
    assert check_float("clip", 1e-300, low=0, low_open=True) == 1e-300
    assert message(check_float, "clip", -0.5, low=0) == "clip must be a number >= 0 (got -0.5)"


def test_an_upper_bound_is_inclusive():
    assert check_float("p", 1.0, low=0, high=1) == 1.0
    assert message(check_float, "p", 1.5, low=0, high=1) == "p must be a number between 0 and 1 (got 1.5)"
    assert message(check_float, "p", 0, low=0, high=1, low_open=True) == (
        "p must be a number > 0 and <= 1 (got 0)"
    )


def test_an_optional_number_accepts_none():
    assert check_float("max_norm", None, low=0, low_open=True, optional=True) is None
    assert message(check_float, "max_norm", 0, low=0, low_open=True, optional=True) == (
        "max_norm must be None or a number > 0 (got 0)"
    )


# ---- check_ints ---------------------------------------------------------------------------------


def test_integers_come_back_sorted_without_duplicates():
    assert check_ints("ks", [8, 1, 4, 1, 8], low=1) == (1, 4, 8)
    assert check_ints("ks", (3,)) == (3,)


@pytest.mark.parametrize("values", [[], "124", 4, None, {1, 2}])
def test_integers_must_be_a_non_empty_sequence(values):
    assert (
        message(check_ints, "ks", values) == f"ks must be a non-empty sequence of integers (got {values!r})"
    )


def test_each_integer_is_checked_by_its_position():
    assert message(check_ints, "ks", [1, 0, 2], low=1) == "ks[1] must be an integer >= 1 (got 0)"
    assert (
        message(check_ints, "ks", [1, True], low=1) == "ks[1] must be an integer >= 1 (got True of type bool)"
    )
    assert (
        message(check_ints, "ks", [2, 9], high=8, why="8 fit")
        == "ks[1] must be an integer <= 8; 8 fit (got 9)"
    )


# ---- check_choice -------------------------------------------------------------------------------


def test_a_choice_is_one_of_the_listed_values():
    assert check_choice("norm", "group", ("batch", "group")) == "group"
    assert check_choice("norm", None, ("batch", None)) is None
    assert message(check_choice, "norm", "Group", ("batch", "group")) == (
        "norm must be one of 'batch', 'group' (got 'Group')"
    )
    assert message(check_choice, "norm", "x", ("a",), "the report's sections") == (
        "norm must be one of 'a'; the report's sections (got 'x')"
    )


# ---- check_callable -----------------------------------------------------------------------------


def test_a_callable_is_refused_with_a_type_error_naming_the_call():
    assert check_callable("fn", len) is len
    with pytest.raises(TypeError) as err:
        check_callable("item_losses", "losses", "item_losses(model, batch)")
    assert (
        str(err.value)
        == "item_losses must be callable as item_losses(model, batch) (got 'losses' of type str)"
    )
    assert check_callable("collate_fn", None, optional=True) is None
    with pytest.raises(TypeError, match=r"^collate_fn must be None or callable \(got 1 of type int\)$"):
        check_callable("collate_fn", 1, optional=True)
    with pytest.raises(TypeError, match=r"^fn must be callable \(got None of type NoneType\)$"):
        check_callable("fn", None)


# ---- check_model, devices -----------------------------------------------------------------------


def test_a_model_must_be_a_module_with_a_trainable_real_parameter():
    model = torch.nn.Linear(2, 1)
    assert check_model(model) is model
    with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module \(got dict\)$"):
        check_model({})
    with pytest.raises(ValueError, match=r"^net must have at least one parameter with requires_grad=True"):
        check_model(torch.nn.Linear(2, 1).requires_grad_(False), "net")
    with torch.device("meta"):
        meta = torch.nn.Linear(2, 1)
    with pytest.raises(
        ValueError, match=r"^model must hold real parameters, not parameters on the meta device"
    ):
        check_model(meta)


def test_a_device_is_resolved_or_refused_by_name():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == resolve_device("auto")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (
        message(resolve_device, "tpu") == "device must be 'cpu', 'cuda', 'auto' or a torch.device (got 'tpu')"
    )
    if not torch.cuda.is_available():
        assert message(resolve_device, "cuda") == (
            "device must be 'cpu', 'cuda' or 'auto'; 'cuda' needs a GPU and none is present (got 'cuda')"
        )


def test_no_device_means_the_models_own():
    model = torch.nn.Linear(2, 1)
    assert check_device(None, model) == torch.device("cpu")
    assert check_device("cpu", model) == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be"):
        check_device("tpu", model)


# ---- one definition of each check ---------------------------------------------------------------


def _modules() -> list[Path]:
    files = [*LIBRARY.rglob("*.py"), *(LIBRARY.parent / "accumlib_course").rglob("*.py")]  # the course too
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _defined(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_each_argument_check_is_defined_once_in_the_checks_module():
    elsewhere = [
        f"{p.relative_to(LIBRARY.parent)} defines {name}"
        for p in _modules()
        if p != CHECKS
        for name in _defined(p)
        if name in CHECK_NAMES + RETIRED_NAMES
    ]
    assert elsewhere == [], "call accumlib.checks instead of a copy: " + "; ".join(elsewhere)
    here = _defined(CHECKS)
    assert {name: here.count(name) for name in CHECK_NAMES} == dict.fromkeys(CHECK_NAMES, 1)
    assert not set(RETIRED_NAMES) & set(here)


def test_the_definition_scan_sees_a_copy(tmp_path):
    # the scan above must not pass by seeing nothing: a module with a copy is caught
    copy = tmp_path / "copy.py"
    copy.write_text(
        "class C:\n    def check_int(self, v):\n        return v\n\n\ndef check_world_size(n):\n    pass\n"
    )
    assert sorted(_defined(copy)) == ["check_int", "check_world_size"]
    assert len(_modules()) > 50 and CHECKS in _modules()
