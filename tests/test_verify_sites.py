"""verify v4: findings point at the user's code (issue 27): the file:line of the call that made each
finding (the backward, the clip, the scheduler step, the optimizer step), in the text report, the JSON
and the HTML, named the same on any machine (relative to the working directory here).

The lines expected are found in this file's own source by a marker comment, never typed in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import accumlib
from accumlib import get_task

TASK = get_task("mlp-digits")
K, B = 4, 8
DATA = torch.utils.data.Subset(TASK.make_dataset(), range(96))
HERE = os.path.relpath(Path(__file__).resolve())


def line_of(marker):
    return next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith(f"# {marker}"))


def run(loop):
    return accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=DATA,
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=B,
    )


def never_divided(model, opt, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()  # BACKWARD
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()


def clipped_each_micro_batch(model, opt, loader):
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y, reduction="sum") / (K * B)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # CLIP
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()


def scheduled_per_micro_batch(model, opt, loader):
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y, reduction="sum") / (K * B)).backward()
        sched.step()  # SCHEDULER
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()


def stepped_early(model, opt, loader):
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y, reduction="sum") / (2 * B)).backward()
        if (i + 1) % 2 == 0:
            opt.step()  # STEP
            opt.zero_grad()


def test_each_finding_points_at_the_users_call_that_made_it():
    cases = [
        (never_divided, "unscaled-sum", "BACKWARD"),
        (clipped_each_micro_batch, "clip-per-micro-batch", "CLIP"),
        (scheduled_per_micro_batch, "scheduler-per-micro-batch", "SCHEDULER"),
        (stepped_early, "early-step", "STEP"),
    ]
    for loop, code, marker in cases:
        report = run(loop)
        finding = next(f for f in report.findings if f.code == code)
        at = f"{HERE}:{line_of(marker)}"
        assert finding.where == (at,), (code, finding.where)
        assert f"\n    at: {at}\n" in str(report)
        assert json.loads(report.to_json())["findings"][[f.code for f in report.findings].index(code)][
            "where"
        ] == [at]
        assert f"<i>at:</i> {at}" in report._repr_html_()


def test_a_file_beside_the_package_is_named_from_the_checkout_from_any_working_directory(monkeypatch):
    """A notebook's kernel works in notebooks/: a loop in a file of the checkout outside it (the course's
    examples, lesson 9) is named from the checkout's root, as from the root itself, never by this machine's
    absolute path (which committed outputs would then carry)."""
    root = Path(accumlib.__file__).resolve().parents[1]
    at = f"{Path(__file__).resolve().relative_to(root)}:{line_of('BACKWARD')}"
    monkeypatch.chdir(root / "notebooks")
    finding = next(f for f in run(never_divided).findings if f.code == "unscaled-sum")
    assert finding.where == (at,), finding.where
    monkeypatch.chdir(root / "tests")  # under the working directory: named from it, as before
    finding = next(f for f in run(never_divided).findings if f.code == "unscaled-sum")
    assert finding.where == (f"test_verify_sites.py:{line_of('BACKWARD')}",), finding.where


def test_a_correct_loop_has_no_sites_and_a_run_finding_none():
    def right(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y, reduction="sum") / (K * B)).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    assert run(right).findings == ()
    dropped = run(lambda m, o, dl: [F.cross_entropy(m(x), y).backward() for x, y in dl])  # never steps
    assert all(f.where == () for f in dropped.findings if f.code == "tail-dropped")
