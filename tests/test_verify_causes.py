"""Causes read from the window, not fitted after the fact (issue 47): each case was named with the wrong
cause before, and each has its correct twin beside it.

A step's weights are read in place (``inplace.py``: each micro-batch's u_j / m_j, times every factor
``.grad`` took after it), so the cause follows from them and from what the engine saw happen: the scale a
GradScaler gave each backward, a factor applied after the last backward, where the items came from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
