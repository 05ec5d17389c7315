"""Mutants of accumlib/checks.py: the one module of argument checks every other module calls.

A rule written here once used to be written in each caller (hf, lightning, verify each refused
``max_steps=True`` and a model with nothing to train on its own); those callers' mutants of the rule
moved here with it.
"""

from mutate import Mutant

# the checks' own tests and examples (seconds); each caller's tests also see these rules
TESTS = ["tests/test_checks.py", "accumlib/checks.py"]
PYTEST_ARGS = ["--doctest-modules"]

MUTANTS = [
    Mutant(
        "True taken as the integer 1 (max_steps=True judges one step)",
        "drop-clause",
        "isinstance(value, bool) or not isinstance(value, numbers.Integral)",
        "isinstance(value, bool)",
        killers=("tests/test_checks.py::test_an_integer_refuses_bools_floats_strings_and_none",),
    ),
    Mutant(
        "a model with nothing to train accepted",
        "replace",
        "not params",
        "False",
        killers=("tests/test_checks.py::test_a_model_must_be_a_module_with_a_trainable_real_parameter",),
    ),
]
