"""A loader that fetches one batch ahead does not move a pass's end (issue 47, "passes as the data shows
them"): Accelerate's prepared DataLoader draws the next batch before handing out the current one, so the
DataLoader's own iterator has yielded the whole pass one micro-batch before the loop has. Each case is
the real Accelerate on CPU, one process, under ``accumlib.watch``; 13 micro-batches (12 of 8 digits and
one of 6), k = 4: the third window ends when the underlying iterator has yielded all 13, one micro-batch
before the pass's real end, and the tail is the last micro-batch alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import accumlib
from accumlib.data import digits
from accumlib.tasks import get_task
from accumlib.tolerances import FLOAT32_RTOL

accelerate = pytest.importorskip("accelerate")
K, B, N_ITEMS = 4, 8, 102  # 13 micro-batches: 3 full windows and a tail of one


def _run(mode: str, epochs: int = 2):
    task = get_task("mlp-digits")
    model = task.make_model(0)
    acc = accelerate.Accelerator(cpu=True)
    loader = DataLoader(digits(N_ITEMS), batch_size=B)
    with accumlib.watch(accum_steps=K, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        m, o, dl = acc.prepare(model, opt, loader)
        sizes = [min(B, N_ITEMS - B * j) for j in range(len(dl))]
        for _ in range(epochs):
            for i, (x, y) in enumerate(dl):
                start = i // K * K
                window = sizes[start : start + K]
                if mode == "correct":  # each item weighs 1/N of its own window, the tail's too
                    (F.cross_entropy(m(x), y, reduction="sum") / sum(window)).backward()
                elif mode == "tail-by-k":  # each mean divided by k: right for full windows, the tail's too
                    (F.cross_entropy(m(x), y) / K).backward()
                else:  # "early": a step after 2 of the 4 micro-batches of the second window
                    (F.cross_entropy(m(x), y, reduction="sum") / sum(window)).backward()
                if (i + 1) % K == 0 or i + 1 == len(dl) or (mode == "early" and i == 5):
                    o.step()
                    o.zero_grad()
    assert seen.report is not None
    return seen.report


def test_a_correct_tail_over_a_prefetching_loader_is_ok():
    report = _run("correct")
    assert report.ok and report.codes == set(), report
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 1] * 2
    assert max(r.rel_error for r in report.steps) < FLOAT32_RTOL


def test_a_tail_divided_by_k_over_a_prefetching_loader_is_named_not_an_early_step():
    report = _run("tail-by-k")
    assert not report.ok and report.codes == {"tail-misscaled"}, report
    assert [r.codes for r in report.steps] == [(), (), (), ("tail-misscaled",)] * 2, report


def test_a_real_early_step_over_the_same_loader_is_still_named():
    report = _run("early")
    assert not report.ok and "early-step" in report.codes, report
    assert "early-step" in report.steps[1].codes and "early-step" not in report.steps[-1].codes, report
