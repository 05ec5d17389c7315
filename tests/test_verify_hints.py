"""verify v3: when item_losses may not be the loop's own loss, the report says so from the numbers.

A factor c that is a whole number d (or 1/d) and matches no count of the window is what a different
reduction gives: item_losses averaging an item's d outputs where the loop sums them. The verdict stays
misscaled (the two losses differ; verify cannot know which one the user meant), with that lead first.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import accumlib
from accumlib.tolerances import FIT_RTOL, FLOAT32_RTOL

K, B, OUT = 4, 8, 3


def regression_data(n=128):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, generator=g)
    return list(zip(x, x @ torch.randn(5, OUT, generator=g) + 0.1 * torch.randn(n, OUT, generator=g)))


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, OUT))


def mean_over_outputs(m, batch):
    x, y = batch
    return F.mse_loss(m(x), y, reduction="none").mean(dim=1)  # one loss per item: its 3 outputs averaged


def sum_over_outputs(m, batch):
    x, y = batch
    return F.mse_loss(m(x), y, reduction="none").sum(dim=1)


def summing_loop(m, opt, loader, max_norm=math.inf, divisor=1.0):
    """Each window's squared errors summed over items and outputs, divided by divisor x its item count."""
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.mse_loss(m(x), y, reduction="sum") / (divisor * n)).backward()
        if max_norm < math.inf:
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        opt.step()
        opt.zero_grad()


def run(item_losses, **loop_kw):
    return accumlib.verify(
        lambda m, o, dl: summing_loop(m, o, dl, **loop_kw),
        model=model(),
        dataset=regression_data(),
        item_losses=item_losses,
        accum_steps=K,
        batch_size=B,
    )


def test_a_mean_over_outputs_where_the_loop_sums_is_named_as_a_possible_item_losses_mismatch():
    report = run(mean_over_outputs)
    assert not report.ok and report.codes == {"misscaled"}, str(report)
    assert all(r.factor == pytest.approx(OUT, rel=FIT_RTOL) for r in report.steps)
    text = str(report)
    assert "item_losses may reduce each item differently from the loop" in text, text
    assert (
        "check that item_losses(model, batch) returns, per item, exactly the term the loop's loss adds up"
        in text
    )
    # the twin: item_losses that sums the outputs, as the loop does, is exact
    twin = run(sum_over_outputs)
    assert twin.ok and not twin.codes, str(twin)


def test_a_clipped_step_that_matches_while_c_is_one_half_says_both_things():
    """clip_grad_norm_ acts on both gradients, so the update is the correct one (rel err ~1e-7), while the
    loss is divided by 2N: masked by clipping, and c = 1/2 may be item_losses' reduction, not the loop's."""
    report = run(sum_over_outputs, max_norm=0.05, divisor=2.0)
    assert not report.ok and report.codes == {"misscaled"}, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL
    assert all(r.factor == pytest.approx(0.5, rel=FIT_RTOL) for r in report.steps)
    text = str(report)
    assert "masked by clipping" in text and "item_losses may reduce each item differently" in text, text
    exact = run(sum_over_outputs, max_norm=0.05)
    assert exact.ok and not exact.codes, str(exact)


def test_a_factor_that_is_no_whole_ratio_gets_no_such_lead():
    report = run(sum_over_outputs, divisor=1.3)
    assert report.codes == {"misscaled"} and "reduce each item differently" not in str(report), str(report)
