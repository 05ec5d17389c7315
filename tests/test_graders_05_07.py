"""Graders of lessons 5-7: realistic wrong answers fail with the right code and first hint, correct forms
pass.

Lesson 6 is graded on both players: D under ``accumlib.verify``, G against G's own large-batch gradient
(each window's noise, judged by D as it was when G made the fakes). Lesson 8's answers are graded in
one launch of the ranks in ``tests/test_lesson_08.py`` (the starting loop reads ``per-rank-mean`` with
a staged hint; right answers pass; misscaled, communication and sharding mistakes get their hints).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from test_graders_01_04 import _fails, _passes

from accumlib_course.lessons import batchnorm_vs_groupnorm as norms
from accumlib_course.lessons import gans_two_optimizers as gan
from accumlib_course.lessons import verify_your_loop as vl

NOTEBOOK_7 = Path(__file__).resolve().parents[1] / "notebooks" / "07_verify_your_loop.ipynb"


# --- lesson 5: BatchNorm ---------------------------------------------------------------------------------


def l5_loop(prepare=lambda model: None, divide=lambda loss, k, y: loss / (k * len(y))):
    def train_fn(model, optimizer, loader):
        k = 4
        prepare(model)
        for i, (x, y) in enumerate(loader):
            divide(F.cross_entropy(model(x), y, reduction="sum"), k, y).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return train_fn


def _bn_eval(model, freeze=False):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
            if freeze:
                m.requires_grad_(False)


def test_lesson_5_wrong_answers():
    _fails(norms.EXERCISE, l5_loop(), "batchnorm")  # the start
    frozen = _fails(norms.EXERCISE, l5_loop(lambda m: _bn_eval(m, freeze=True)), "frozen-parameter")
    assert "bn" in frozen.messages[0].lower() or "weight" in frozen.messages[0]  # it names the parameters
    # a mean, never / k
    _fails(norms.EXERCISE, l5_loop(_bn_eval, divide=lambda loss, k, y: loss / len(y)), "unscaled-sum")
    _fails(norms.EXERCISE, l5_loop(_bn_eval, divide=lambda loss, k, y: loss / (k * k * len(y))), "misscaled")


def test_lesson_5_correct_variants_pass():
    _passes(norms.EXERCISE, l5_loop(_bn_eval))
    _passes(norms.EXERCISE, l5_loop(lambda model: model.eval()))  # the whole model: it has no dropout


# --- lesson 6: a GAN, both players graded


def l6_loop(keep_out="freeze", g_div=True, g_step=True, zero_d_each=False):
    def train_fn(G, D, g_opt, d_opt, loader):
        k = 4
        for i, (z, x) in enumerate(loader):
            if zero_d_each:
                d_opt.zero_grad()
            fake = G(z)
            (gan.d_loss(D, fake.detach(), x) / k).backward()
            g_loss = gan.g_loss(D, fake) if g_div is None else gan.g_loss(D, fake) / (k if g_div else 1)
            if keep_out == "freeze":
                D.requires_grad_(False)
                g_loss.backward()
                D.requires_grad_(True)
            elif keep_out == "inputs":  # backward into G's parameters only
                g_loss.backward(inputs=list(G.parameters()))
            else:
                g_loss.backward()
            if (i + 1) % k == 0:
                d_opt.step()
                if g_step:
                    g_opt.step()
                d_opt.zero_grad()
                g_opt.zero_grad()

    return train_fn


def test_lesson_6_wrong_answers():
    _fails(gan.EXERCISE, l6_loop(keep_out=None), "leak-into-D")  # the start
    # D right, G undivided
    _fails(gan.EXERCISE, l6_loop(g_div=False), "g-unscaled-sum", where="every step (steps 0-1)")
    _fails(gan.EXERCISE, l6_loop(g_step=False), "g-never-stepped")  # D right, G never trains
    _fails(gan.EXERCISE, l6_loop(zero_d_each=True), "zero-grad-inside-window")  # the leak's wrong cure


def test_lesson_6_correct_variants_pass():
    _passes(gan.EXERCISE, l6_loop())
    _passes(gan.EXERCISE, l6_loop(keep_out="inputs"))


# --- lesson 7: paste your own loop --------------------------------------------------------------------------


def l7_loop(
    schedule_per_micro_batch=False, log=lambda mean, k, y: mean.item() * len(y), divide=True, zero_each=False
):
    def train_fn(model, optimizer, loader):
        k = 4
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)
        total, n = 0.0, 0
        for i, (x, y) in enumerate(loader):
            if zero_each:
                optimizer.zero_grad()
            mean = F.cross_entropy(model(x), y)
            (mean / k if divide else mean).backward()
            if schedule_per_micro_batch:
                scheduler.step()
            if (i + 1) % k == 0:
                optimizer.step()
                if not schedule_per_micro_batch:
                    scheduler.step()
                optimizer.zero_grad()
            total, n = total + (log(mean, k, y) if log else 0.0), n + len(y)
        return None if log is None else total / n

    return train_fn


def test_lesson_7_wrong_answers():
    _fails(vl.EXERCISE, l7_loop(schedule_per_micro_batch=True), "scheduler-per-micro-batch")
    _fails(vl.EXERCISE, l7_loop(log=lambda mean, k, y: mean.item() * len(y) / k), "logged-loss-scaled")
    _fails(vl.EXERCISE, l7_loop(divide=False), "unscaled-sum")
    _fails(vl.EXERCISE, l7_loop(zero_each=True), "zero-grad-inside-window")


def test_lesson_7_correct_variants_pass():
    _passes(vl.EXERCISE, l7_loop())
    _passes(vl.EXERCISE, l7_loop(log=None))  # a loop that logs nothing is graded on its steps alone


def test_lesson_7_is_paste_your_own_loop_not_lesson_3_again():
    cells = json.loads(NOTEBOOK_7.read_text())["cells"]
    (cell,) = [c for c in cells if "exercise" in c.get("metadata", {}).get("tags", [])]
    source = "".join(cell["source"])
    assert "Paste your own training loop here" in source
    # no ragged tail
    assert vl.EXERCISE.name == "07-paste-your-own-loop" and len(vl.EXERCISE.make_dataset()) % 32 == 0
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "seed doc" not in text and "seed post" not in text and "seed-0" not in text
    assert (
        "https://pytorch.org/docs/stable/notes/amp_examples.html" in text
        and "https://huggingface.co/blog/gradient_accumulation" in text
    )


def test_lesson_7_a_tail_only_misscale_says_only_the_last_step_is_off():
    """On 110 digits a loop that steps its 2-micro-batch tail divided by 16 samples (not 14) is off at the
    last step only.
    """
    from accumlib.data import digits
    from accumlib_course.lessons._exercise import Exercise

    ragged = Exercise(
        vl.EXERCISE.name,
        vl.EXERCISE.title,
        accum_steps=4,
        batch_size=8,
        hints=vl.EXERCISE.hints,
        make_dataset=lambda: digits(110),
        call=vl.EXERCISE.call,
    )

    def train_fn(model, optimizer, loader):
        k = 4
        sizes = [len(y) for _, y in loader]
        for i, (x, y) in enumerate(loader):
            window = sizes[i - i % k : i - i % k + k]
            (F.cross_entropy(model(x), y, reduction="sum") / (8 * len(window))).backward()
            if (i + 1) % k == 0 or i + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()

    grade = _fails(ragged, train_fn, "misscaled", last=True, where="the last step (step 3)")
    assert "Only the last step" in grade.stages[0] and "every step" not in grade.stages[0]
