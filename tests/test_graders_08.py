"""Lesson 8's grader without a launch: its hints are staged and free of the red herring; its verdicts name
steps and the exercise as the cell calls it. The answers themselves (the starting loop reads ``per-rank-mean``
with this staged hint; right answers pass; mistakes get their hints) are graded on 2 real ranks, in one
launch, in ``tests/test_lesson_08.py``.
"""

from __future__ import annotations

from accumlib._verify.report import Finding, Report, StepRow
from accumlib_course.lessons import distributed


def test_per_rank_mean_and_misscaled_hints_come_in_three_stages_without_item_losses():
    for code in ("per-rank-mean", "misscaled"):
        stages = distributed.EXERCISE.hints[code]
        assert isinstance(stages, tuple) and len(stages) == 3, code
        assert not any("item_losses" in s for s in stages), code  # the red herring of issue 18


def test_a_per_rank_mean_verdict_names_its_steps_and_a_grade_that_exists():
    rows = [StepRow(t, 4, 40, 0.1, 1.1, 0.1, ("per-rank-mean",)) for t in range(2)]
    report = Report(
        rows,
        [Finding("per-rank-mean", "each rank divided by its own count", "ALL-REDUCE THE COUNT", (0, 1))],
        4,
        80,
        80,
    )
    grade = distributed.EXERCISE.grade(report)
    assert not grade.ok and grade.codes == ("per-rank-mean",) and grade.where == ("every step (steps 0-1)",)
    assert grade.stages == distributed.EXERCISE.hints["per-rank-mean"]
    assert "grade = distributed.EXERCISE.check(train_fn), then print(grade.hint)" in str(grade)
    assert "ALL-REDUCE THE COUNT" not in str(grade) + grade._repr_html_()  # verify's fix would be the answer


def test_every_hint_of_every_exercise_is_for_a_code_a_grader_can_give():
    """A hint under a misspelt code would never show; every key is verify's code, a grader's, or 'error'."""
    from accumlib import CODES
    from accumlib_course.lessons import batchnorm_vs_groupnorm as norms
    from accumlib_course.lessons import gans_two_optimizers as gan
    from accumlib_course.lessons import mixed_precision, verify_your_loop
    from accumlib_course.lessons import normalizing_the_loss as normalizing
    from accumlib_course.lessons import ragged_windows_and_tokens as ragged_windows
    from accumlib_course.lessons import why_accumulate as why
    from accumlib_course.lessons._grading import GRADER_CODES

    for lesson in (
        why,
        normalizing,
        ragged_windows,
        mixed_precision,
        norms,
        gan,
        verify_your_loop,
        distributed,
    ):
        for key in lesson.EXERCISE.hints:
            code = key.removesuffix("@last")
            assert code == "error" or code in CODES or code in GRADER_CODES, f"{lesson.__name__}: {key}"
    assert not set(GRADER_CODES) & set(CODES)  # a grader's code never shadows one of verify's
