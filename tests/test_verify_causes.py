"""Causes read from the window, not fitted after the fact (issue 47): each case was named with the wrong
cause before, and each has its correct twin beside it.

A step's weights are read in place (``inplace.py``: each micro-batch's u_j / m_j, times every factor
``.grad`` took after it), so the cause follows from them and from what the engine saw happen: the scale a
GradScaler gave each backward, a factor applied after the last backward, where the items came from.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _watch_loops import PAD, assert_figures, run
from torch.utils.data import DataLoader

import accumlib
from accumlib.tasks import get_task
from accumlib.tolerances import FLOAT32_RTOL


def _watched(loop, *, k: int | None = None):
    task = get_task("mlp-digits")
    model = task.make_model(0)
    loader = DataLoader(task.make_dataset(), batch_size=task.batch_size)
    with accumlib.watch(accum_steps=k, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loop(model, opt, loader)
    assert seen.report is not None
    return seen.report


def _every_micro_batch(divisor: float):
    def loop(model, opt, loader):
        for x, y in loader:
            (F.cross_entropy(model(x), y) / divisor).backward()
            opt.step()
            opt.zero_grad()

    return loop


def test_a_leftover_division_when_stepping_every_micro_batch_blames_the_script_not_item_losses():
    """Before: ``misscaled`` with the "reduction" cause, whose fix tells an ``accumlib run`` user to change
    the ``item_losses`` they never passed. The items here are the run's own loss calls': a whole-number 1/c
    is a divisor of the script's."""
    bad = _watched(_every_micro_batch(4))
    assert not bad.ok and bad.codes == {"misscaled"}, bad
    assert {r.cause for r in bad.steps} == {"divisor"}
    assert all(abs(r.factor - 0.25) < 1e-6 for r in bad.steps)
    (finding,) = bad.findings
    assert "item_losses" not in finding.message + finding.fix and "d = 4" in finding.message, finding
    good = _watched(_every_micro_batch(1))
    assert good.ok and good.codes == set(), good
    assert max(r.rel_error for r in good.steps) < FLOAT32_RTOL


def test_verify_with_item_losses_still_says_item_losses_may_reduce_otherwise():
    """The recompute oracle judges against item_losses itself: there a whole-number c may be item_losses'
    own reduction, and the finding says to check it first (tests/test_verify_hints.py's case)."""
    task = get_task("mlp-digits")
    report = accumlib.verify(
        _every_micro_batch(4),
        model=task.make_model(0),
        dataset=task.make_dataset(),
        item_losses=task.item_losses,
        accum_steps=1,
        batch_size=task.batch_size,
        oracle="recompute",
    )
    assert report.codes == {"misscaled"} and {r.cause for r in report.steps} == {"reduction"}, report
    in_place = accumlib.verify(
        _every_micro_batch(4),
        model=task.make_model(0),
        dataset=task.make_dataset(),
        item_losses=task.item_losses,
        accum_steps=1,
        batch_size=task.batch_size,
    )
    # in place, the loop's loss calls were checked against item_losses' once: the divisor is the loop's
    assert in_place.oracle == "in-place" and {r.cause for r in in_place.steps} == {"divisor"}, in_place


def _scale_grads_after(mean: bool):
    """torchtune's full-finetune recipe in shape: each micro-batch backwards its loss, the window's tokens
    are counted as it goes, and ``scale_grads`` multiplies every ``.grad`` once after the last backward:
    by 1/tokens (right, with summed token losses), or by 1/k (a mean of micro-batch means)."""

    def loop(model, opt, batches, k):
        batches = list(batches)
        for s in range(0, len(batches), k):
            window, tokens = batches[s : s + k], 0
            for x, y in window:
                loss = F.cross_entropy(
                    model(x).transpose(1, 2), y, ignore_index=PAD, reduction="mean" if mean else "sum"
                )
                tokens += int((y != PAD).sum())
                loss.backward()
            for p in model.parameters():
                p.grad.mul_(1 / (k if mean else tokens))  # scale_grads
            opt.step()
            opt.zero_grad()

    return loop


def test_a_factor_applied_after_the_last_backward_belongs_to_every_weight():
    """Before: the in-place engine kept scale_grads' factor apart from the weights, which read [1, 1, 1, 1]
    (the sum) or a factor of about N: the ragged mean of means was named ``unscaled-sum``, and the
    correct sum passed only through a second convention in the rules. Now both weigh as the test's own
    truth says (``_watch_loops.run``: the merged window's true gradient)."""
    good, truth = run(_scale_grads_after(mean=False))
    assert good.ok and good.codes == set(), good
    assert max(truth) < FLOAT32_RTOL
    assert all(w == pytest.approx(1.0, rel=FLOAT32_RTOL) for r in good.steps for w in r.weights)
    bad, truth = run(_scale_grads_after(mean=True))
    assert not bad.ok and "mean-of-means" in bad.codes and "unscaled-sum" not in bad.codes, bad
    assert min(truth) > 1e-3
    assert_figures(bad, truth)
    # each micro-batch mean weighted 1/k: its tokens weigh N / (k n_j), read from the run itself
    for row in bad.steps:
        assert len(set(round(w, 6) for w in row.weights)) > 1
