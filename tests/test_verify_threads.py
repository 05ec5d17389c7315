"""verify v4: one run at a time, and nothing left behind (issue 27).

verify changes torch process-wide while it records (``accumlib/_verify/lock.py``). A second run
started while one records is refused by name, before it changes anything, and the first run's
report is the one it would have been alone; after any exit of the loop (an exception, a
KeyboardInterrupt, ``max_steps``) every function verify patched is torch's own again, its global
optimizer hook is gone, and the next run starts.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import accumlib
from accumlib import get_task
from accumlib._verify import clips
from accumlib._verify.errors import VerifyBusy
from accumlib.tolerances import FLOAT32_RTOL

TASK = get_task("mlp-digits")
K, B = 4, 8
DATA = torch.utils.data.Subset(TASK.make_dataset(), range(96))


def wrong_loop(pause=None):
    """Each micro-batch's mean divided by nothing (c = k = 4), pausing inside its second window."""

    def train(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            F.cross_entropy(model(x), y).backward()
            if i == K + 1 and pause is not None:
                pause()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    return train


def run(loop, **kw):
    return accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=DATA,
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=B,
        **kw,
    )


def torch_state():
    """Every torch attribute verify may patch, and its global optimizer hooks."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    return (
        torch.amp.GradScaler.step,
        torch.amp.GradScaler.scale,
        torch.optim.lr_scheduler.LRScheduler.step,
        torch.utils.data.DataLoader.__iter__,
        torch.nn.utils.clip_grad_norm_,
        clips.watching(),
        len(_global_optimizer_pre_hooks),
    )


def test_a_second_run_is_refused_by_name_and_the_first_report_is_unchanged():
    alone = run(wrong_loop())
    inside, go_on = threading.Event(), threading.Event()

    def pause():
        inside.set()
        assert go_on.wait(60), "the main thread never let the first run go on"

    out: dict = {}
    first = threading.Thread(
        target=lambda: out.setdefault("report", run(wrong_loop(pause))), name="widget-thread"
    )
    first.start()
    try:
        assert inside.wait(60)
        with pytest.raises(
            VerifyBusy, match=r"accumlib.verify was called while accumlib.verify .*'widget-thread'"
        ):
            run(wrong_loop())
    finally:
        go_on.set()
        first.join(60)
    report = out["report"]
    assert report.codes == alone.codes == {"unscaled-sum"}
    assert len(report.steps) == len(alone.steps) == 3
    for a, b in zip(report.steps, alone.steps):  # the same run in the same process: rounding apart at most
        assert abs(a.factor - b.factor) <= FLOAT32_RTOL * abs(b.factor)
        assert abs(a.factor - K) < 0.25 * K  # and it is the bug: about k
    assert run(wrong_loop()).codes == {"unscaled-sum"}  # the lock was released


@pytest.mark.parametrize("error", [ValueError("the loop's own bug"), KeyboardInterrupt()])
def test_nothing_stays_patched_after_the_loop_raises(error):
    before = torch_state()
    assert not before[5], "a clip listener was left over by an earlier test"

    def pause():
        raise error

    with pytest.raises(type(error)):
        run(wrong_loop(pause))
    assert torch_state() == before
    assert run(wrong_loop()).codes == {"unscaled-sum"}  # and the next run is judged as usual


def test_nothing_stays_patched_after_max_steps():
    before = torch_state()
    report = run(wrong_loop(), max_steps=1)
    assert len(report.steps) == 1 and "unscaled-sum" in report.codes
    assert torch_state() == before
