"""``accumlib.verify(train_fn)`` judged in place (``accumlib/_verify/inplace_verify.py``): the loop's own
backward is the oracle once one replay through ``item_losses`` has shown the loop's items are
``item_losses``' items; where the engine cannot vouch for a step, the loop runs again on the recompute
oracle. The oracle of every test here is the recompute oracle (``oracle="recompute"``), which replays each
micro-batch through ``item_losses`` (itself checked against ``accumlib.true_gradient`` in test_verify.py).

The false-pass side first: a loop whose loss is not ``item_losses``' mean (label smoothing, padding counted
as items) would pass if the engine's own items were the truth; the check sends it to the recompute oracle,
which names it.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import K, windows_of
from conftest import exact_loop as exact
from conftest import verify_digits as run

import accumlib
from accumlib.data import IGNORE_INDEX, PAD_ID
from accumlib.tolerances import FLOAT32_RTOL, ROUNDING_FLOOR


def test_a_correct_loop_is_judged_in_place_and_exact():
    report = run(exact)
    assert report.oracle == "in-place" and report.ok, report
    # the in-place figure is the recompute oracle's to float32 rounding, step by step
    again = run(exact, oracle="recompute")
    assert again.oracle == "recompute" and again.ok
    assert len(report.steps) == len(again.steps) == 4
    for a, b in zip(report.steps, again.steps):
        assert (a.micro_batches, a.items) == (b.micro_batches, b.items)
        assert a.rel_error <= ROUNDING_FLOOR and b.rel_error <= ROUNDING_FLOOR


def test_a_wrong_loop_is_named_in_place_with_the_recompute_oracles_figures():
    def never_divided(model, opt, loader):
        for window in windows_of(loader, K):
            for x, y in window:
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    fast, slow = run(never_divided), run(never_divided, oracle="recompute")
    assert fast.oracle == "in-place" and slow.oracle == "recompute"
    assert fast.codes == slow.codes == {"unscaled-sum"}
    for a, b in zip(fast.steps, slow.steps):
        assert a.codes == b.codes
        # c = m: 4 micro-batches, then the 2-micro-batch tail; both oracles in float32
        assert a.factor == pytest.approx(b.factor, rel=FLOAT32_RTOL)
        assert a.rel_error == pytest.approx(b.rel_error, rel=FLOAT32_RTOL)
    assert [round(r.factor) for r in fast.steps] == [4, 4, 4, 2]


# ---- the false-pass side: the engine's items are not item_losses' -----------------------------------


def test_a_loop_whose_loss_is_not_item_losses_mean_is_never_judged_by_its_own_loss():
    """Label smoothing in the loop, plain cross-entropy in item_losses: accumulated correctly, but against
    its own loss it would read exact. The check finds the two oracles 1e-1 apart."""

    def smoothed(model, opt, loader):
        for window in windows_of(loader, K):
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum", label_smoothing=0.1) / n).backward()
            opt.step()
            opt.zero_grad()

    report = run(smoothed)
    assert not report.ok and report.codes == {"unexplained"}, report
    assert report.oracle.startswith("recompute (") and "not item_losses' mean" in report.oracle
    assert report.codes == run(smoothed, oracle="recompute").codes


def test_padding_counted_as_items_by_the_loop_is_caught_by_the_item_count():
    """lm-tokens: the loop trains on the padding as targets and divides its window's loss sum by every
    position, padding included: exact against its own items, wrong against item_losses', which leave the
    padding out. The item counts differ at the first micro-batch."""
    task = accumlib.get_task("lm-tokens")

    def pads_counted(model, opt, loader):
        for window in windows_of(loader, K):
            n = sum(y.numel() for _, y in window)  # every position, padding included
            for x, y in window:
                y = y.masked_fill(y == IGNORE_INDEX, PAD_ID)
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
                (loss / n).backward()
            opt.step()
            opt.zero_grad()

    report = run(pads_counted, task=task, b=task.batch_size)
    assert not report.ok, report
    assert report.oracle.startswith("recompute (the loop's loss calls held"), report.oracle
    assert report.codes == run(pads_counted, task=task, b=task.batch_size, oracle="recompute").codes


def test_items_counted_in_another_unit_are_caught_by_the_count_where_the_sums_agree():
    """item_losses returns one loss per sequence (its tokens' sum); the loop divides the token sum by its
    token count. Both sums of losses are the same number with the same gradient, so only the counts tell
    the loop's items (tokens) from verify's (sequences): in place, the loop would read exact."""
    task = accumlib.get_task("lm-tokens")

    def sequence_losses(model, batch):
        x, y = batch
        per_token = F.cross_entropy(model(x).transpose(1, 2), y, reduction="none")  # 0 where y is ignored
        return per_token.sum(dim=1)

    def token_mean(model, opt, loader):
        for window in windows_of(loader, K):
            n = sum(int((y != IGNORE_INDEX).sum()) for _, y in window)
            for x, y in window:
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
                (loss / n).backward()
            opt.step()
            opt.zero_grad()

    kw = dict(task=task, b=task.batch_size, item_losses=sequence_losses)
    report = run(token_mean, **kw)
    assert not report.ok and "misscaled" in report.codes, report
    assert report.oracle.startswith("recompute (the loop's loss calls held"), report.oracle
    assert report.codes == run(token_mean, **kw, oracle="recompute").codes


# ---- where the engine cannot vouch for a step: the run again, on the recompute oracle --------------


def test_a_loss_term_that_appears_late_hands_the_rest_of_the_run_to_the_recompute_oracle():
    """The engine reads each backward's loss calls before the backward runs: a window whose first backward
    it cannot weigh is replayed from there on, in the same run."""
    calls = []

    def late_term(model, opt, loader):
        calls.append(1)
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y) / K
            if i >= 2 * K:  # from the third window on, a second loss call the engine cannot weigh alone
                loss = loss + 0.0 * F.mse_loss(model(x), torch.zeros(len(y), 10))
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()

    model = accumlib.get_task("mlp-digits").make_model(0)
    before = copy.deepcopy(model.state_dict())
    report = run(late_term, model=model)
    assert len(calls) == 1  # no second run
    assert report.oracle == "recompute from step 2 (several-losses)"
    slow = run(late_term, model=model, oracle="recompute")
    assert [(r.items, r.codes) for r in report.steps] == [(r.items, r.codes) for r in slow.steps]
    assert report.codes == slow.codes and "tail-misscaled" in report.codes  # each step divided by K
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # never touched


def test_a_step_the_engine_cannot_judge_mid_window_runs_the_loop_again_from_the_same_random_state():
    """A gradient hook registered in the second window (an identity, so the loop stays correct) is seen only
    at the step: the loop runs again from the start on the recompute oracle. It shuffles with torch's and
    Python's generators; the second run draws the same order as a recompute run from the same seed."""
    calls = []

    def shuffled_then_hooked(model, opt, loader):
        calls.append(1)
        data = loader.dataset
        order = torch.randperm(len(data)).tolist()
        random.shuffle(order)
        for s in range(0, len(order), K * 8):
            if s > 0 and s // (K * 8) == 1:
                model.net[0].weight.register_hook(lambda g: g)
            window = [order[i : i + 8] for i in range(s, min(s + K * 8, len(order)), 8)]
            n = sum(len(ids) for ids in window)
            for ids in window:
                x, y = loader.collate_fn([data[i] for i in ids])
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad()

    random.seed(3)
    torch.manual_seed(3)
    fast = run(shuffled_then_hooked)
    assert len(calls) == 2 and fast.oracle == "recompute (step 1: grad-hook)", fast.oracle
    random.seed(3)
    torch.manual_seed(3)
    slow = run(shuffled_then_hooked, oracle="recompute")
    assert fast.codes == slow.codes and fast.ok == slow.ok
    assert [r.rel_error for r in fast.steps] == [r.rel_error for r in slow.steps]
    random.seed(4)
    torch.manual_seed(4)
    other = run(shuffled_then_hooked, oracle="recompute")  # another order: other figures (the test can fail)
    assert [r.rel_error for r in other.steps] != [r.rel_error for r in slow.steps]


def test_batchnorm_and_autocast_are_the_recompute_oracles():
    calls = []

    def counted(model, opt, loader):
        calls.append(1)
        exact(model, opt, loader)

    bn = run(counted, task=accumlib.get_task("cnn-batchnorm"), dataset=accumlib.data.digits(64, image=True))
    assert bn.oracle == "recompute" and calls == [1]  # no second run: BatchNorm is known up front

    def autocast_exact(model, opt, loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            exact(model, opt, loader)

    report = run(autocast_exact)
    assert report.oracle == "recompute (the loop ran under autocast (torch.bfloat16))", report.oracle
    assert report.ok


def test_the_oracle_is_in_the_json_and_a_wrong_choice_is_refused_by_name():
    assert json.loads(run(exact).to_json())["oracle"] == "in-place"
    with pytest.raises(ValueError, match=r"oracle must be one of.*got 'fast'"):
        run(exact, oracle="fast")
