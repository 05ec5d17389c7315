"""Mutants of accumlib/checks.py: the one module of argument checks every other module calls.

A rule written here once used to be written in each caller (hf, lightning, verify each refused
``max_steps=True`` and a model with nothing to train on its own); those callers' mutants of the rule
moved here with it.
"""

from mutate import Mutant

# the checks' own tests and examples (seconds); each caller's tests also see these rules
TESTS = ["tests/test_checks.py", "accumlib/checks.py"]
PYTEST_ARGS = ["--doctest-modules"]

K = "accumlib/checks.py"
MUTANTS = [
    Mutant(
        "True taken as the integer 1 (max_steps=True judges one step)",
        K,
        "    if isinstance(value, bool) or not isinstance(value, numbers.Integral):\n",
        "    if not isinstance(value, numbers.Integral):\n",
    ),
    Mutant("a model with nothing to train accepted", K, "    if not params:\n", "    if False:\n"),
]
