"""Every exercise in the notebooks: its starting cell fails ``verify`` with a hint, its solution passes.

An exercise cell is a code cell tagged ``exercise``. It is self-contained (its own imports),
defines ``train_fn`` and ends with ``<Exercise>.check(train_fn)``. Its solution is
``notebooks/solutions/<exercise name>.py``, defining ``train_fn``. The lines a solution
adds to the starting loop (the answer) must appear in no notebook cell.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from accumlib_course.lessons._exercise import GENERIC_HINT, Exercise, Grade

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _exercise_cells() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for i, cell in enumerate(_cells(path)):
            if cell["cell_type"] == "code" and "exercise" in cell.get("metadata", {}).get("tags", []):
                found.append((path.name, i, "".join(cell["source"])))
    return found


EXERCISE_CELLS = _exercise_cells()


def _exercise_of(source: str) -> tuple[Exercise, ast.Call, dict]:
    """Exec the cell up to its last line; return the Exercise that line checks, the call, the namespace."""
    tree = ast.parse(source)
    last = tree.body[-1]
    assert (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and isinstance(last.value.func, ast.Attribute)
        and last.value.func.attr == "check"
    ), "an exercise cell must end with <Exercise>.check(train_fn)"
    namespace: dict = {}
    exec(compile(ast.Module(tree.body[:-1], []), "<exercise cell>", "exec"), namespace)
    exercise = eval(compile(ast.Expression(last.value.func.value), "<exercise>", "eval"), namespace)
    assert isinstance(exercise, Exercise), f"{ast.unparse(last.value.func.value)} is not an Exercise"
    return exercise, last.value, namespace


def _run_cell(source: str) -> tuple[Exercise, Grade]:
    exercise, call, namespace = _exercise_of(source)
    return exercise, eval(compile(ast.Expression(call), "<check>", "eval"), namespace)


def _code_lines(source: str) -> set[str]:
    lines = set()
    for line in source.splitlines():
        line = re.sub(r"#.*", "", line).strip()
        if line:
            lines.add(line)
    return lines


def test_there_are_exercises_in_at_least_four_lessons():
    lessons = {name for name, _, _ in EXERCISE_CELLS}
    assert len(lessons) >= 4, f"exercises in {sorted(lessons)}"


def test_exercise_names_are_unique_and_every_solution_has_its_exercise():
    names = [_exercise_of(source)[0].name for _, _, source in EXERCISE_CELLS]
    assert len(names) == len(set(names)), names
    files = {p.stem for p in SOLUTIONS.glob("*.py")}
    assert files == set(names), (
        f"solutions without an exercise: {sorted(files - set(names))}; exercises without one: "
        f"{sorted(set(names) - files)}"
    )


@pytest.mark.parametrize(
    "notebook,index,source", EXERCISE_CELLS, ids=[f"{n}[{i}]" for n, i, _ in EXERCISE_CELLS]
)
def test_starting_cell_fails_with_a_hint_and_the_solution_passes(notebook, index, source):
    exercise, grade = _run_cell(source)
    assert not grade.ok, f"{notebook} cell {index}: the starting loop already passes"
    assert grade.hint and grade.hint != GENERIC_HINT, (
        f"{notebook} cell {index}: no hint matched {grade.codes} {grade.error}"
    )
    assert "fix:" not in str(grade) and "fix:" not in grade._repr_html_()  # verify's fix would be the answer
    assert "<details>" in grade._repr_html_()  # the hint is folded
    # the plain-text verdict names only what exists: it says how to get grade
    if "print(grade.hint)" in str(grade):
        assert (
            f"grade = {exercise.call}.check(train_fn)" in str(grade)
            and f"{exercise.call}.check(train_fn)" in source
            if exercise.call
            else "put 'grade = ' in front of the check" in str(grade)
        )
    if notebook[:2] in {f"0{n}" for n in range(1, 9)}:  # lessons 1-8: a nudge, a stronger hint, the solution
        assert len(grade.stages) == 3, (
            f"{notebook} cell {index}: {len(grade.stages)} hint stage(s) for {grade.codes}"
        )

    solution = SOLUTIONS / f"{exercise.name}.py"
    assert solution.exists(), f"missing solution {solution.relative_to(REPO)}"
    namespace: dict = {}
    exec(compile(solution.read_text(), str(solution), "exec"), namespace)
    passed = exercise.check(namespace["train_fn"])
    assert passed.ok, f"{solution.name}: {passed}"

    # the answer is in solutions/ only: the lines the solution adds appear in no notebook cell
    answer = _code_lines(solution.read_text()) - _code_lines(source)
    assert answer, f"{solution.name} adds nothing to the starting cell"
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for i, cell in enumerate(_cells(path)):
            if cell["cell_type"] == "code":
                leaked = answer & _code_lines("".join(cell["source"]))
                # a common line (say 'optimizer.zero_grad()') may appear elsewhere; the whole answer may not
                assert leaked != answer, f"{path.name} cell {i} holds the answer of {exercise.name}"
