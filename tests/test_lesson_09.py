"""Lesson 9 (real bugs in real libraries): the exercise's wrong answers and correct variants, compute,
the figure, the widget, the packaged survey tables, and the notebook run from outside the repository.

Every grade is ``accumlib.hf.verify_trainer`` on the Trainer the answer builds: each optimizer step of
the Trainer's own loop against the true large-batch gradient (the oracle) of the window's mean token loss.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

pytest.importorskip("transformers", reason="lesson 9 runs the transformers Trainer")

import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course import (
    _style,
    survey,  # noqa: E402
)
from accumlib_course.lessons import real_bugs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "09_real_bugs.ipynb"
SOLUTION = REPO / "notebooks" / "solutions" / "09-count-after-the-shift.py"
S = [8, 8, 6]  # sequences per window: micro-batches of 2 in windows of 4, 4, 3


# --- the exercise: answers a learner writes ---------------------------------------------------------


def _mean_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)


def _summed_over_count(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    summed = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    return summed / num_items_in_batch


def _mean_over_k(outputs, labels, num_items_in_batch=None):
    return _mean_loss(outputs, labels) / 4  # the plain-PyTorch reflex: divide each micro-batch's mean by k


def answer(loss=None, loss_type=None, config_loss_type=None, **overrides):
    """A train_fn as a learner writes it: the starting TrainingArguments, a compute_loss_func, a loss_type
    set.
    """

    def train_fn(model, train_dataset, data_collator, output_dir):
        if loss_type is not None:
            model.loss_type = loss_type
        if config_loss_type is not None:
            model.config.loss_type = config_loss_type
        args = (
            dict(
                output_dir=output_dir,
                per_device_train_batch_size=2,
                gradient_accumulation_steps=4,
                num_train_epochs=1,
                max_grad_norm=0.0,
                seed=0,
                use_cpu=True,
                report_to=[],
                save_strategy="no",
                disable_tqdm=True,
            )
            | overrides
        )
        return transformers.Trainer(
            model=model,
            args=transformers.TrainingArguments(**args),
            train_dataset=train_dataset,
            data_collator=data_collator,
            **({"compute_loss_func": loss} if loss else {}),
        )

    return train_fn


def _first_stage(code: str) -> str:
    hint = real_bugs.EXERCISE.hints[code]
    return hint[0] if isinstance(hint, tuple) else hint


WRONG = {
    # the starting cell: a mean per micro-batch, which the Trainer (compute_loss_func set) never divides by k
    "starting mean loss": (answer(_mean_loss), "unscaled-sum"),
    # the division fixed, but num_items_in_batch counts GPT-2's labels before the shift: c = N/(N+S)
    "sum over num_items_in_batch": (answer(_summed_over_count), "misscaled"),
    # loss_type set on the config after the model was built: the Trainer reads the model's attribute
    "config.loss_type after building": (
        answer(_summed_over_count, config_loss_type="ForCausalLM"),
        "misscaled",
    ),
    # the mapping's class name instead of its key: an unknown loss_type, so the count stays unshifted
    "loss_type misspelt ForCausalLMLoss": (
        answer(_summed_over_count, loss_type="ForCausalLMLoss"),
        "misscaled",
    ),
    # the custom loss dropped, loss_type left None: the Trainer's own loss, the same unshifted count
    "no compute_loss_func, no loss_type": (answer(), "misscaled"),
    # the count fixed but the loss still a mean: divided by k as in
    # a plain loop (windows of unequal token counts)
    "mean over k with loss_type": (answer(_mean_over_k, loss_type="ForCausalLM"), "mean-of-means"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_a_wrong_configuration_fails_with_its_finding_and_hint(name):
    train_fn, code = WRONG[name]
    grade = real_bugs.EXERCISE.check(train_fn)
    assert not grade.ok and not grade.error, grade
    assert code in grade.codes, (name, grade.codes)
    assert grade.hint.startswith(f"(1) {_first_stage(code)}"), (name, grade.hint)
    assert len(grade.stages) == 3 and "<details>" in grade._repr_html_() and "fix:" not in str(grade)
    if code == "misscaled":  # c = N/(N+S) at every step: the count of labels before the shift
        for row, s in zip(grade.report.steps, S, strict=True):
            assert abs(row.factor - row.items / (row.items + s)) <= FLOAT32_RTOL, row
    if code == "unscaled-sum":  # m micro-batch means added up: c close to m = 4, 4, 3 (token counts differ)
        assert [round(r.factor) for r in grade.report.steps] == [4, 4, 3]


CORRECT = {
    "sum over num_items_in_batch, loss_type set": answer(_summed_over_count, loss_type="ForCausalLM"),
    "the Trainer's own loss, loss_type set": answer(loss_type="ForCausalLM"),
    "loss_type set, clipping on": answer(_summed_over_count, loss_type="ForCausalLM", max_grad_norm=1.0),
}


@pytest.mark.parametrize("name", list(CORRECT))
def test_a_correct_configuration_passes(name):
    grade = real_bugs.EXERCISE.check(CORRECT[name])
    assert grade.ok, grade
    assert all(r.rel_error <= FLOAT32_RTOL for r in grade.report.steps if r.clip == 1.0)


def test_the_solution_file_passes():
    namespace: dict = {}
    exec(compile(SOLUTION.read_text(), str(SOLUTION), "exec"), namespace)
    assert real_bugs.EXERCISE.check(namespace["train_fn"]).ok


@pytest.mark.parametrize(
    "train_fn, says",
    [
        (
            lambda model, data, collate, out: None,
            "must return the transformers.Trainer it builds (got NoneType)",
        ),
        (
            lambda model, data, collate, out: answer()(real_bugs_model("llama"), data, collate, out),
            "around the GPT-2 it is given",
        ),
        (
            answer(_summed_over_count, loss_type="ForCausalLM", gradient_accumulation_steps=1),
            "keep gradient_accumulation_steps=4 and per_device_train_batch_size=2",
        ),
    ],
)
def test_an_answer_that_dodges_the_exercise_is_refused_by_name(train_fn, says):
    grade = real_bugs.EXERCISE.check(train_fn)
    assert not grade.ok and says in grade.error, grade
    assert grade.hint == real_bugs.EXERCISE.hints["error"]


def real_bugs_model(model_type):
    return survey.tiny_model(model_type)


# --- compute, the figure ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs() -> real_bugs.LibraryRuns:
    return real_bugs.compute()


def test_compute_gives_each_librarys_factor_per_step(runs):
    assert list(runs.reports) == list(real_bugs.RUNS)
    acc, light = runs.factors("accelerate"), runs.factors("lightning")
    # the same loop, the same last window
    assert acc == pytest.approx(light, abs=FLOAT32_RTOL) and len(acc) == 4
    # only the short tail is off
    assert acc[:3] == pytest.approx([1, 1, 1], abs=FLOAT32_RTOL) and acc[3] < 0.5
    gpt2 = runs.reports["trainer-gpt2"]
    assert gpt2.codes == {"misscaled"}
    for row, s in zip(gpt2.steps, S, strict=True):
        assert abs(row.factor - row.items / (row.items + s)) <= FLOAT32_RTOL
    assert runs.reports["trainer-gpt2-fixed"].ok and not runs.reports["trainer-gpt2"].ok
    assert runs.reports["accelerate-clm"].codes == {"mean-of-means", "tail-misscaled"}
    table = runs.table()
    assert [r[3] for r in table.rows] == ["NOT OK"] * 4 + ["ok"]


def test_compute_takes_the_notebooks_reports_and_refuses_others(runs):
    given = real_bugs.compute({"lightning": runs.reports["lightning"]})
    assert given.reports["lightning"] is runs.reports["lightning"]
    with pytest.raises(ValueError, match=r"reports must be keyed by run names .* \(got 'deepspeed'\)"):
        real_bugs.compute({"deepspeed": runs.reports["lightning"]})
    with pytest.raises(TypeError, match=r"reports\['lightning'\] must be an accumlib.Report \(got float\)"):
        real_bugs.compute({"lightning": 0.5})


def test_the_figure_draws_every_factor_and_says_it_in_words(runs):
    fig = real_bugs.plot(runs)
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    ax = fig.axes[0]
    drawn = [line.get_ydata() for line in ax.get_lines()][1:]  # the first is the true gradient at c = 1
    assert [list(y) for y in drawn] == [runs.factors(n) for n in real_bugs.RUNS]
    assert len({(ln.get_marker(), str(ln.get_linestyle())) for ln in ax.get_lines()[1:]}) == len(
        real_bugs.RUNS
    )
    text = real_bugs.alt(runs)
    for name in real_bugs.RUNS:
        assert (
            f"{real_bugs.RUNS[name].label}: c = {', '.join(f'{c:.3f}' for c in runs.factors(name))}" in text
        )
    assert "0.489" in text


# --- the widget -------------------------------------------------------------------------------------


def test_a_live_run_agrees_with_the_packaged_survey():
    for model_type, codes in (("bart", {"unscaled-sum", "logged-loss-scaled"}), ("llama", set())):
        run = real_bugs.trainer_run(model_type)
        assert run.report.codes == codes, (model_type, run.report.codes)
        row = next(r for r in survey.load(version="5.23.0").rows if r.model_type == model_type)
        assert set(row.codes) == codes
        if transformers.__version__ == "5.23.0":
            assert row.factors == pytest.approx(
                [r.factor for r in run.report.steps] if row.factors else [], abs=1e-5
            )
        assert ("NOT OK" in run.verdict) == bool(codes) and "<table>" in run._repr_html_()


def test_the_widget_runs_the_class_picked():
    w = real_bugs.widget()
    assert w.result is None
    w.model.value = "llama"
    run = w.run()
    assert run.model_class == "LlamaForCausalLM" and run.report.ok and not w.button.disabled
    w.model.value = "gpt2"
    assert w.run().report.codes == {"misscaled"}


def test_the_widget_refuses_a_class_it_does_not_offer():
    with pytest.raises(ValueError, match=r"value must be one of 'gpt2', .* \(got 'mamba'\)"):
        real_bugs.widget(value="mamba")
    with pytest.raises(ValueError, match=r"model_type must be one of .* \(got 'mamba'\)"):
        real_bugs.trainer_run("mamba")
    with pytest.raises(TypeError, match=r"report must be an accumlib.Report \(got str\)"):
        real_bugs.widget(report="gpt2")


# --- the notebook ------------------------------------------------------------------------------------


def _cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def test_the_notebook_reads_nothing_beside_notebooks():
    code = "\n".join("".join(c["source"]) for c in _cells() if c["cell_type"] == "code")
    assert "../surveys" not in code and '"surveys"' not in code, "lesson 9 reads the repository's surveys/"
    assert 'Path("..")' not in code and "os.pardir" not in code


def test_the_survey_cell_runs_from_a_copy_of_notebooks_outside_the_repository(tmp_path):
    """The survey-loading cell, run in a copy of notebooks/ with nothing of the repository beside it."""
    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    cell = next(
        "".join(c["source"])
        for c in _cells()
        if c["cell_type"] == "code" and "survey.load(" in "".join(c["source"])
    )
    script = (
        "import transformers\nfrom accumlib_course import survey\n"
        + cell
        + "\nprint('tasks', sorted(surveys))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path / "notebooks",
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=""),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tasks ['causal-lm', 'sequence-classification']" in out.stdout
    assert not (tmp_path / "surveys").exists()


def test_the_notebook_has_the_lessons_shape():
    cells = _cells()
    text = "\n".join("".join(c["source"]) for c in cells)
    assert "real_bugs.show(" in text and "real_bugs.widget(" in text
    assert any("exercise" in c.get("metadata", {}).get("tags", []) for c in cells)
    assert "".join(cells[-1]["source"]).startswith(
        "**Next:** [10 · Accumulation in your own project](10_your_own_project.ipynb)"
    )
    learner = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").lower()
    assert "seed" not in learner and "nbval" not in learner and "assertion" not in learner
    from accumlib_course.lessons import course

    assert course.cite("huggingface").lower() in learner and course.cite("unsloth").lower() in learner
    headings = [line for line in learner.splitlines() if line.startswith("## ")]
    assert [h.split(".")[0] for h in headings] == [f"## {i}" for i in range(1, len(headings) + 1)], headings


# --- what GPT-2's c does to a step, per optimizer ---------------------------------------------------


@pytest.fixture(scope="module")
def updates() -> real_bugs.UpdateRatios:
    return real_bugs.update_ratios(real_bugs.run("trainer-gpt2"))


def test_sgd_passes_c_through_to_every_update(updates):
    """SGD's update is -lr G, so each step of the run as configured is c times the fixed run's. Within
    float32 rounding (FLOAT32_RTOL): step 0 starts both runs from the same parameters and differs only by the
    loss's float32 logits (measured 6e-8); later steps start where the bug's smaller steps left the
    parameters, lr (1 - c) |g| apart at lr 5e-5 (measured <= 8e-7)."""
    sgd = updates.ratios["SGD"]
    assert len(sgd) == len(updates.c) == len(S)
    for step, (ratio, c) in enumerate(zip(sgd, updates.c, strict=True)):
        assert abs(ratio - c) <= FLOAT32_RTOL, (step, ratio, c)
    # the negative side: SGD does not hide the bug, every step is 9 to 13 % short
    assert all(abs(1 - ratio) > 5 * real_bugs.ADAMW_RTOL for ratio in sgd), sgd


def test_adamw_nearly_cancels_the_factor(updates):
    """AdamW divides by the running RMS of the gradient: ratio 1 within ADAMW_RTOL (its reason: eps and a c
    that moves between steps are all that is left, measured <= 9.1e-4), at every step 10x closer to 1 than
    SGD's."""
    adamw, sgd = updates.ratios["AdamW"], updates.ratios["SGD"]
    for step, ratio in enumerate(adamw):
        assert abs(ratio - 1) <= real_bugs.ADAMW_RTOL, (step, ratio)
        assert abs(ratio - 1) * 10 < abs(sgd[step] - 1), (step, ratio, sgd[step])
    assert adamw != (1.0,) * len(adamw)  # a trace is left: the ratios are measured, not assumed
    table = str(updates.table())
    assert f"{updates.c[1]:.4f}" in table and f"{adamw[1]:.4f}" in table and "AdamW" in table


def _adam_updates(scales, eps, grads):
    """Each step's update of one tensor under torch's AdamW, its gradient at step t scaled by scales[t]."""
    import torch

    p = torch.zeros(grads.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=1e-3, eps=eps, weight_decay=0.0)
    out = []
    for g, c in zip(grads, scales, strict=True):
        before = p.detach().clone()
        p.grad = c * g
        opt.step()
        out.append(p.detach() - before)
    return out


def test_the_rule_adamw_cancels_a_constant_scale_only_up_to_eps_and_a_changing_c():
    """The lesson's explanation, on one tensor: with eps = 0 a constant c cancels exactly (float64 rounding);
    eps leaves a trace where gradient entries are as small as eps; a c that changes between steps leaves one
    too."""
    import torch

    grads = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fixed = _adam_updates([1.0] * 3, 0.0, grads)

    def ratios(scales, eps, g=grads, base=fixed):
        return [float(a.norm() / b.norm()) for a, b in zip(_adam_updates(scales, eps, g), base, strict=True)]

    assert ratios([0.9] * 3, 0.0) == pytest.approx([1, 1, 1], abs=1e-12)  # constant c: cancelled
    tiny = grads * 1e-8  # entries of eps's size: eps is no longer negligible beside sqrt(v)
    tiny_fixed = _adam_updates([1.0] * 3, 1e-8, tiny)
    assert all(abs(r - 1) > 1e-2 for r in ratios([0.9] * 3, 1e-8, tiny, tiny_fixed))
    moving = ratios([82 / 90, 57 / 65, 55 / 61], 0.0)  # the lesson's c per step
    assert moving[0] == pytest.approx(1, abs=1e-12) and all(abs(r - 1) > 1e-4 for r in moving[1:]), moving


def test_update_ratios_refuses_what_is_not_a_report():
    with pytest.raises(TypeError, match=r"report must be an accumlib.Report \(got str\)"):
        real_bugs.update_ratios("trainer-gpt2")


def test_the_guide_quotes_the_measured_ratios(updates):
    guide = (REPO / "notebooks" / "INSTRUCTORS.md").read_text()
    answer = guide[guide.index("### Lesson 9 ") : guide.index("### Lesson 10 ")]
    answer = " ".join(answer.split())
    for name in ("SGD", "AdamW"):
        assert ", ".join(f"{r:.3f}" for r in updates.ratios[name]) in answer, name


def test_framework_runs_freeze_the_old_objects_and_give_them_back():
    """The lessons' Trainer runs skip the full collection Accelerate's free_memory makes per run
    (lessons/_common.py): inside, the objects alive before are frozen; after, on any exit, they are
    not, and garbage made inside is still collected; a caller's own freeze is left as it was."""
    import gc
    import weakref

    from accumlib_course.lessons._common import long_lived_objects_frozen

    class Node:
        pass

    assert gc.get_freeze_count() == 0
    with long_lived_objects_frozen():
        assert gc.get_freeze_count() > 0
        cycle = Node()
        cycle.me = cycle  # garbage made inside the block, reachable only from itself
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0

    with pytest.raises(KeyError), long_lived_objects_frozen():
        raise KeyError("a run that fails")
    assert gc.get_freeze_count() == 0

    def frozen(obj):
        # A frozen object sits in the permanent generation, which gc.get_objects() does not list. The
        # freeze count itself is no witness: it drops whenever a frozen object is freed, as objects other
        # threads or finalisers drop are (a CI run saw 861826 -> 861823 across the block).
        return not any(o is obj for o in gc.get_objects())

    callers = Node()
    gc.freeze()
    try:
        assert frozen(callers)
        with long_lived_objects_frozen():
            assert frozen(callers)
        assert frozen(callers)  # the caller's freeze stays
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert not frozen(callers)
