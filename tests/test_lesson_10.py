"""Lesson 10 (accumulation in your own project): its curves against the large batch, its schedule numbers,
its measured checkpointing, its framework table, bad arguments, and its exercise's wrong and right answers."""

from __future__ import annotations

import math

import pytest
import torch

import accumlib
from accumlib.tolerances import FLOAT32_RTOL, OFF_BY_K_TOL
from accumlib_course.lessons import _your_own_project_frameworks as frameworks_part
from accumlib_course.lessons import _your_own_project_memory as memory_part
from accumlib_course.lessons import your_own_project as yp


@pytest.fixture(scope="module")
def curves():
    torch.set_num_threads(1)
    return yp.compute(device="cpu")


# --- the curves: what a user sees ---------------------------------------------------------------------


def test_the_one_over_n_loop_overlaps_the_large_batch_at_every_cut(curves):
    for b, k in yp.SETTINGS:
        assert b * k == yp.WINDOW
        assert curves.gap(curves.find("ragged", b, k)) <= FLOAT32_RTOL
        assert len(curves.find("ragged", b, k).losses) == len(curves.reference.losses) == 2 * curves.epochs


def test_the_buggy_loops_drift_from_the_large_batch(curves):
    for b, k in yp.SETTINGS:
        # unequal token counts per micro-batch
        assert curves.gap(curves.find("normalized", b, k)) > 10 * FLOAT32_RTOL
        assert curves.gap(curves.find("naive", b, k)) > 0.1  # k times the step
    # the first step starts from the same model: every loop logs the same first loss
    assert all(
        abs(c.losses[0] - curves.reference.losses[0]) <= FLOAT32_RTOL * curves.reference.losses[0]
        for c in curves.curves
    )


def test_the_first_step_gradient_is_the_oracle_for_the_correct_loop_and_k_times_it_for_naive():
    """One window of 32 sequences: the gradient each loop hands optimizer.step(), against true_gradient."""
    task = accumlib.get_task(yp.TASK)
    data = accumlib.data.TokenSequences(yp.WINDOW, min_len=yp.LENGTHS[0], max_len=yp.LENGTHS[1], seed=0)
    seen = {}
    for name, loop in yp.LOOPS.items():
        model = task.make_model(0)
        grads = []
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        opt.register_step_pre_hook(
            # bound now: the hook runs within this iteration, on this model
            lambda o, a, kw, grads=grads, model=model: grads.append(
                {n: p.grad.clone() for n, p in model.named_parameters()}
            )
        )
        loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=task.collate_fn)
        loop(
            model,
            opt,
            loader,
            task.item_losses,
            accum_steps=4,
            **({"count_items": task.count_items} if name == "ragged" else {}),
        )
        seen[name] = grads[0]
    model = task.make_model(0)
    batches = list(torch.utils.data.DataLoader(data, batch_size=8, collate_fn=task.collate_fn))
    true = accumlib.true_gradient(model, batches, task.item_losses, merge=task.merge)
    assert accumlib.compare(seen["ragged"], true).rel_error <= FLOAT32_RTOL
    assert accumlib.compare(seen["normalized"], true).rel_error > 10 * FLOAT32_RTOL
    assert abs(accumlib.compare(seen["naive"], true).norm_ratio - 4) < OFF_BY_K_TOL * 4


def test_the_figure_and_its_alt_text_carry_the_numbers(curves):
    from accumlib_course import _style

    fig = yp.plot(curves)
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    alt = yp.alt_text(curves)
    assert f"{curves.gap(curves.find('naive', 8, 4)):.1e}" in alt


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(settings=[(8, 0)]), r"accum_steps must be an integer between 1 and 64 \(got 0\)"),
        (dict(settings=[(8, 65)]), r"accum_steps must be an integer between 1 and 64 \(got 65\)"),
        (dict(settings=[(0, 4)]), r"batch_size must be an integer between 1 and 64 \(got 0\)"),
        (dict(settings=[(8, 4, 1)]), r"settings must hold \(batch_size, accum_steps\) pairs"),
        (dict(settings=[]), r"settings must hold at least one"),
        (dict(settings="8x4"), r"settings must be a sequence"),
        (dict(loops=("sum",)), r"loops must be one of 'ragged', 'normalized', 'naive' \(got 'sum'\)"),
        (dict(epochs=0), r"epochs must be an integer between 1 and 50 \(got 0\)"),
        (dict(lr=-1.0), r"lr must be a number > 0.0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        yp.compute(**kwargs)


def test_the_widget_redraws_for_a_new_choice(curves):
    ex = yp.widget(initial=curves, device="cpu")
    assert ex.result.curves[0].loop == "ragged" and ex.result.curves[0].batch_size == 8
    ex.controls["loop"].value = "naive"
    assert ex.result.curves[0].loop == "naive" and ex.result.gap(ex.result.curves[0]) > 0.1
    ex.controls["batch_size"].value = 16
    ex.controls["accum_steps"].value = 2
    assert (ex.result.curves[0].batch_size, ex.result.curves[0].accum_steps) == (16, 2)
    assert ex.result.gap(ex.result.curves[0]) > 0.1  # 16 x 2 with the naive sum
    ex.controls["loop"].value = "ragged"
    assert ex.result.gap(ex.result.curves[0]) <= FLOAT32_RTOL  # 16 x 2 = 32: the large batch again
    ex.controls["accum_steps"].value = 3
    assert ex.result.gap(ex.result.curves[0]) > 10 * FLOAT32_RTOL  # a window of 48: another large batch
    with pytest.raises(ValueError, match="loop must be one of"):
        yp.widget(loop="sum")


# --- the schedule in optimizer steps ---------------------------------------------------------------------


def test_the_schedule_matches_transformers_formula():
    transformers = pytest.importorskip("transformers")
    p = torch.zeros(1, requires_grad=True)
    ours, theirs = torch.optim.SGD([p], lr=1.0), torch.optim.SGD([p], lr=1.0)
    a, b = yp.linear_warmup(ours, 3, 10), transformers.get_linear_schedule_with_warmup(theirs, 3, 10)
    for _ in range(12):
        assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], abs=1e-12)
        ours.step(), theirs.step(), a.step(), b.step()


def test_stepping_per_micro_batch_ends_the_schedule_after_a_kth_of_the_run():
    r = yp.schedules(100, 4, 10)
    right, per_mb, in_mb = (
        r.lrs["counted and stepped in optimizer steps"],
        r.lrs["stepped per micro-batch"],
        r.lrs["counted in micro-batches (len(loader))"],
    )
    assert (
        right[0] == 0.0
        and right[10] == pytest.approx(1e-3)
        and r.at_zero("counted and stepped in optimizer steps") == 0
    )
    # lr 0 from step 25 on: the last three quarters learn nothing
    assert r.at_zero("stepped per micro-batch") == 75
    assert sum(per_mb) / sum(right) == pytest.approx(0.25, abs=0.01)
    # warmup 4x long, no decay
    assert r.peak("counted in micro-batches (len(loader))")[0] == 40 and in_mb[-1] / 1e-3 > 0.8


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match=r"warmup_steps must be an integer between 0 and 9; warmup must end"):
        yp.schedules(10, 4, 10)
    with pytest.raises(ValueError, match=r"base_lr must be a number > 0.0"):
        yp.schedules(base_lr=0.0)
    with pytest.raises(ValueError, match=r"total_steps must be an integer >= 5"):
        yp.linear_warmup(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 5, 3)
    assert yp.total_steps(24, 4) == 6 and yp.total_steps(25, 4) == 7


# --- checkpointing against accumulation, measured -----------------------------------------------------


def test_checkpointing_and_accumulation_cut_memory_and_keep_the_gradient():
    r = memory_part.checkpointing(batch_size=64, accum_steps=4, depth=3, width=32, repeats=1)
    big, acc, ckpt, both = r.ways
    # saved activations are linear in the micro-batch (a few bytes of scalars apart)
    assert acc.activation_bytes * 4 == pytest.approx(big.activation_bytes, rel=1e-3)
    # only each block's input is kept (9 x width -> 1 x width)
    assert ckpt.activation_bytes < big.activation_bytes / 3
    assert both.activation_bytes * 4 == pytest.approx(ckpt.activation_bytes, rel=1e-3)
    assert all(w.rel_error <= FLOAT32_RTOL for w in r.ways)
    assert all(w.seconds > 0 for w in r.ways)
    with pytest.raises(
        ValueError, match=r"accum_steps must divide batch_size=10 into equal micro-batches \(got 3\)"
    ):
        memory_part.checkpointing(batch_size=10, accum_steps=3)


# --- the frameworks' settings: every row a run ------------------------------------------------------------


@pytest.mark.slow
def test_each_framework_setting_gets_the_verdict_the_lesson_states():
    pytest.importorskip("trl")
    r = frameworks_part.frameworks()
    assert r["trainer-default"].codes == ("misscaled",) and all(c < 1 for c in r["trainer-default"].factors)
    for key in (
        "trainer-loss-type",
        "trainer-average-tokens",
        "trainer-loss-func-sum",
        "accelerate-counted",
        "lightning-full",
    ):
        assert r[key].ok, key
    assert "unscaled-sum" in r["trainer-loss-func-mean"].codes
    assert all(
        abs(c - m) < OFF_BY_K_TOL * m
        for c, m in zip(r["trainer-loss-func-mean"].factors, r["trainer-loss-func-mean"].micro_batches)
    )
    assert set(r["accelerate"].codes) == set(r["lightning-tail"].codes) == {"mean-of-means", "tail-misscaled"}
    assert "misscaled" in r["trl-sft"].codes and r["peft-prompt"].codes == ("misscaled",)
    assert all(c > 1 for c in r["peft-prompt"].factors)
    with pytest.raises(ValueError, match="keys must be one of"):
        frameworks_part.frameworks("trainer")


# --- the exercise

HEAD = """\
import math
import torch
import torch.nn.functional as F
from accumlib_course.lessons import your_own_project as your_project

def train_fn(model, optimizer, loader):
    k = 4
"""

WRONG = {
    "the starting loop: stepped per micro-batch, counted in micro-batches": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=len(loader))
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
""",
        "scheduler-per-micro-batch",
        "inside a window",
    ),
    "moved beside the step, total still len(loader)": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=len(loader))
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
""",
        "schedule-not-in-optimizer-steps",
        "len(loader) counts micro-batches",
    ),
    "total in optimizer steps, still stepped per micro-batch": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=len(loader) // k)
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        scheduler.step()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
""",
        "scheduler-per-micro-batch",
        "inside a window",
    ),
    "warmup and total both counted in micro-batches": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2 * k, total_steps=len(loader))
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
""",
        "schedule-not-in-optimizer-steps",
        "len(loader) counts micro-batches",
    ),
    "the scheduler stepped before the optimizer": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=len(loader) // k)
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            scheduler.step()
            optimizer.step()
            optimizer.zero_grad()
""",
        "scheduler-per-micro-batch",
        "inside a window",
    ),
    "the fix breaks the gradient: the division is dropped": (
        """\
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=len(loader) // k)
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
""",
        "unscaled-sum",
        "k times too long",
    ),
}

RIGHT = {
    "transformers' own schedule": """\
    from transformers import get_linear_schedule_with_warmup
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, math.ceil(len(loader) / k))
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / k).backward()
        if (i + 1) % k == 0 or i + 1 == len(loader):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
""",
    "a LambdaLR of one's own, the window's items counted": """\
    steps = len(loader) // k
    warm_then_decay = lambda s: s / 2 if s < 2 else (steps - s) / (steps - 2)  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warm_then_decay)
    window = []
    for x, y in loader:
        window.append((x, y))
        if len(window) == k:
            n = sum(len(y) for _, y in window)
            for xb, yb in window:
                (F.cross_entropy(model(xb), yb, reduction="sum") / n).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            window = []
""",
}


def _train_fn(body: str):
    namespace: dict = {}
    exec(HEAD + body, namespace)
    return namespace["train_fn"]


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_answer_fails_with_its_code_and_hint(name):
    body, code, hint = WRONG[name]
    grade = yp.EXERCISE.check(_train_fn(body))
    assert not grade.ok and grade.codes[0] == code, (grade.codes, str(grade))
    assert hint in grade.hint
    assert grade.where and grade.where[0], "the verdict names the steps it concerns"


@pytest.mark.parametrize("name", RIGHT)
def test_a_correct_answer_passes(name):
    if "transformers" in name:
        pytest.importorskip("transformers")
    grade = yp.EXERCISE.check(_train_fn(RIGHT[name]))
    assert grade.ok, str(grade)
    assert [round(s.lr, 6) for s in grade.report.steps] == [round(x, 6) for x in yp.planned_lrs(6)]


def test_the_schedule_check_names_the_steps_off_plan():
    class Step:
        def __init__(self, lr):
            self.lr = lr

    class Report:
        steps = [Step(lr) for lr in yp.planned_lrs(6)]

    assert yp.schedule_check(Report()) == []
    Report.steps[3] = Step(0.09)
    (finding,) = yp.schedule_check(Report())
    assert finding.code == "schedule-not-in-optimizer-steps" and finding.steps == (3,)
    assert math.isclose(yp.planned_lrs(6)[3], 0.075)
