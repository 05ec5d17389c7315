"""Issue 47, items through element-wise steps: a loss the script computes per item itself (label smoothing
written out) or a reduction="none" call times per-item weights or a mask, then reduced by a mean or a sum, is
judged under ``accumlib.watch``, the weighted per-item value being the item's loss; a reduction over values
that mix the items is refused by name, never judged. Before this, every loop here read ``unseen-loss``.

Every verdict is checked against the test's own truth: ``accumlib.true_gradient`` at the window's first
parameters over the micro-batches the model was fed, with the loop's per-item loss. Each correct loop has its
broken twin. Tolerance: the engine's reference and this truth are two float32 summation orders of one
gradient (about 1e-7 relative here); FLOAT32_RTOL, the project's stated bound, is 1e-4.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import accumlib
from accumlib.data import digits
from accumlib.tasks import get_task
from accumlib.tolerances import FLOAT32_RTOL

TASK = get_task("mlp-digits")  # 110 items, batch 8: the last window holds 2 micro-batches, of 8 and 6
K = 4
EVEN = 96  # 12 micro-batches of 8: whole windows of equal micro-batches, where mean / k is exact
EPS = 0.1  # label smoothing


def smoothed(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Label smoothing written out, one loss per item, with no standard loss call at all."""
    c = logits.shape[-1]
    target = torch.full_like(logits, EPS / c).scatter_(-1, y[:, None], 1 - EPS + EPS / c)
    return -(target * F.log_softmax(logits, -1)).sum(-1)


def weights(y: torch.Tensor) -> torch.Tensor:
    """Per-sample weights, as a diffusion trainer's: one positive number per item (from its label here)."""
    return 1.0 + y.float() / 10


def weighted(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y, reduction="none") * weights(y)


def weighted_module(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.CrossEntropyLoss(reduction="none")(logits, y) * weights(y)


def masked(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Items of label 3 masked out by a zero weight: they are no items (the truth leaves them out)."""
    return F.cross_entropy(logits, y, reduction="none") * (y != 3)


def log_likelihood(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, -1).gather(-1, y[:, None]).squeeze(-1)


def item_losses_of(per_item, keep=None):
    """``item_losses`` for verify and the truth: the loop's per-item loss, on the items kept."""

    def item_losses(model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        losses = per_item(model(x), y)
        return losses if keep is None else losses[keep(y)]

    return item_losses


def windows(per_item, reduce):
    """Each window's micro-batches backwarded as ``reduce(per-item losses, n, k)``, n the window's items."""

    def loop(model, opt, batches, k):
        batches = list(batches)
        for s in range(0, len(batches), k):
            window = batches[s : s + k]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                reduce(per_item(model(x), y), n, k).backward()
            opt.step()
            opt.zero_grad()

    return loop


def sum_over_n(losses, n, k):  # correct: every item weighed 1/N, N the window's items
    return losses.sum() / n


def mean_over_k(losses, n, k):  # correct where every micro-batch of the window holds as many items
    return losses.mean() / k


def mean(losses, n, k):  # never divided by k
    return losses.mean()


def watched(loop, truth_losses, n: int | None = None):
    """Run ``loop(model, opt, batches, K)`` on mlp-digits under watch; return the report and, per step,
    the test's own ||G - g*|| / ||g*||, g* the window's true gradient of ``truth_losses``."""
    model = TASK.make_model(0)
    data = TASK.make_dataset() if n is None else digits(n)
    batches = list(DataLoader(data, batch_size=TASK.batch_size, shuffle=False))
    index = {id(x): i for i, (x, _) in enumerate(batches)}
    state = {"start": copy.deepcopy(model), "window": []}
    truth: list[float] = []

    def forwarded(module, args):  # which micro-batch the model was fed, by the input tensor itself
        if module is model:  # not the copies the truth runs (deepcopy keeps the hook)
            state["window"].append(batches[index[id(args[0])]])

    def before(optimizer, args, kwargs):
        t = accumlib.true_gradient(state["start"], state["window"], truth_losses)
        G = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        T = torch.cat([t[name].reshape(-1) for name, _ in model.named_parameters()])
        truth.append(float((G - T).norm() / T.norm()))

    def after(optimizer, args, kwargs):
        state["start"], state["window"] = copy.deepcopy(model), []

    hook = model.register_forward_pre_hook(forwarded)
    with accumlib.watch(accum_steps=K, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        opt.register_step_pre_hook(before)
        opt.register_step_post_hook(after)
        loop(model, opt, batches, K)
    hook.remove()
    assert seen.report is not None
    return seen.report, truth


def assert_figures(report, truth):
    """Every step the report judged has the test's own relative error (to float32 rounding)."""
    assert len(report.steps) == len(truth)
    for row, t in zip(report.steps, truth):
        assert math.isclose(row.rel_error, t, rel_tol=1e-3, abs_tol=FLOAT32_RTOL), (row.rel_error, t)


def assert_ok(report, truth):
    assert report.ok and report.codes == set(), report
    assert max(truth) < FLOAT32_RTOL and max(r.rel_error for r in report.steps) < FLOAT32_RTOL
    assert report.items_stepped == report.items_total
    assert_figures(report, truth)


# ---- (a) label smoothing written out: no standard loss call --------------------------------------------


@pytest.mark.parametrize("reduce, n", [(sum_over_n, None), (mean_over_k, EVEN)])
def test_label_smoothing_written_out_is_judged_against_its_own_items(reduce, n):
    report, truth = watched(windows(smoothed, reduce), item_losses_of(smoothed), n)
    assert_ok(report, truth)
    assert report.items_stepped == (n or 110)


def test_label_smoothing_written_out_and_never_divided_by_k_is_an_unscaled_sum():
    report, truth = watched(windows(smoothed, mean), item_losses_of(smoothed), EVEN)
    assert not report.ok and report.codes == {"unscaled-sum"}, report
    assert min(truth) > 1.0  # the test's own truth: every step k times too large (rel err k - 1 = 3)
    assert_figures(report, truth)


def test_a_negated_reduction_makes_the_negated_values_the_items_losses():
    """``-ll.sum() / n``: the root negates the reduction, so each item's loss is -ll_i (its sign read from
    the graph, not from the numbers); its twin never divides by n and is misscaled by about N."""

    def nll(logits, y):
        return -log_likelihood(logits, y)

    report, truth = watched(windows(log_likelihood, lambda ll, n, k: -ll.sum() / n), item_losses_of(nll))
    assert_ok(report, truth)
    report, truth = watched(windows(log_likelihood, lambda ll, n, k: -ll.sum()), item_losses_of(nll))
    assert not report.ok and report.codes == {"misscaled"}, report
    assert min(truth) > 10.0  # G = N g*, N = 32 in whole windows and 14 in the tail
    assert_figures(report, truth)


# ---- (b) reduction="none" times per-sample weights, then a mean -------------------------------------------


@pytest.mark.parametrize("per_item", [weighted, weighted_module], ids=["functional", "module"])
@pytest.mark.parametrize("reduce, n", [(mean_over_k, EVEN), (sum_over_n, None)])
def test_per_sample_weights_times_a_none_reduction_are_the_items_losses(per_item, reduce, n):
    report, truth = watched(windows(per_item, reduce), item_losses_of(per_item), n)
    assert_ok(report, truth)


def test_per_sample_weights_with_mean_over_k_on_a_ragged_tail_is_named():
    """The last window: 2 micro-batches of 8 and 6 items, each mean divided by k = 4."""
    report, truth = watched(windows(weighted, mean_over_k), item_losses_of(weighted))
    assert not report.ok and report.codes == {"mean-of-means", "tail-misscaled"}, report
    assert [r.step for r in report.steps if r.codes] == [3]
    assert max(truth[:3]) < FLOAT32_RTOL and truth[3] > 0.1  # whole windows exact; the tail is not
    assert_figures(report, truth)


def test_a_mask_as_zero_weights_leaves_its_items_out_and_a_mean_over_them_is_misscaled():
    """Zero weights drop items from the count (read off the gradient below the weights): a sum divided by
    the kept count is ok; a mean divides by the masked items too, a misscale the test's truth sees."""
    truth_losses = item_losses_of(masked, keep=lambda y: y != 3)

    def kept_sum(model, opt, batches, k):
        batches = list(batches)
        for s in range(0, len(batches), k):
            window = batches[s : s + k]
            n = sum(int((y != 3).sum()) for _, y in window)
            for x, y in window:
                (masked(model(x), y).sum() / n).backward()
            opt.step()
            opt.zero_grad()

    report, truth = watched(kept_sum, truth_losses)
    assert_ok(report, truth)
    assert report.items_stepped == sum(int((y != 3).sum()) for _, y in DataLoader(TASK.make_dataset(), 8))
    report, truth = watched(windows(masked, mean_over_k), truth_losses, EVEN)
    assert not report.ok and "misscaled" in report.codes, report
    assert min(truth) > 1e-2
    assert_figures(report, truth)


# ---- (c) a reduction that is not over per-item values: refused by name, never judged ----------------------


@pytest.mark.parametrize(
    "per_item, reduce, named",
    [
        (smoothed, lambda losses, n, k: losses.mean() ** 2 / k, None),
        (smoothed, lambda losses, n, k: losses.max() / k, None),
        (smoothed, lambda losses, n, k: losses.logsumexp(0) / k, None),
        (smoothed, lambda losses, n, k: (losses - losses.logsumexp(0)).mean() / k, "LogsumexpBackward0"),
        (weighted, lambda losses, n, k: losses.logsumexp(0) / k, None),
        (weighted, lambda losses, n, k: (losses - losses.mean()).square().mean() / k, "MeanBackward0"),
    ],
    ids=["mean-squared", "max", "logsumexp", "minus-logsumexp", "none-logsumexp", "none-minus-mean"],
)
def test_a_reduction_that_mixes_the_items_is_refused_by_name_never_judged(per_item, reduce, named):
    report, _ = watched(windows(per_item, reduce), item_losses_of(per_item))
    assert not report.ok and report.status == "cannot-judge" and "unseen-loss" in report.codes, report
    where = [w for f in report.findings if f.code == "unseen-loss" for w in f.where]
    assert any("test_watch_elementwise.py" in w for w in where), where
    if named is not None:  # the reduction was found: the op over the items between is said
        assert any(f"({named} runs over the items)" in w for w in where), where


def test_a_sum_over_a_two_dimensional_tensor_of_the_scripts_own_is_refused():
    """Entries or rows: which are the items the graph does not say, so a sum's count is not guessed."""

    def per_class(logits, y):
        target = F.one_hot(y, logits.shape[-1]).float()
        return -(target * F.log_softmax(logits, -1))  # [rows, classes]: the rows are the items

    report, _ = watched(
        windows(per_class, sum_over_n), item_losses_of(lambda lg, y: per_class(lg, y).sum(-1))
    )
    assert report.status == "cannot-judge" and report.codes == {"unseen-loss"}, report
    assert any("whose entries or rows may be the items" in w for f in report.findings for w in f.where)


# ---- the same loops through verify, with the per-item loss as item_losses ----------------------------------


@pytest.mark.parametrize(
    "per_item, reduce, n, codes",
    [
        (smoothed, sum_over_n, None, set()),
        (smoothed, mean, EVEN, {"unscaled-sum"}),
        (weighted, mean_over_k, EVEN, set()),
        (weighted, mean_over_k, None, {"mean-of-means", "tail-misscaled"}),
    ],
)
def test_verify_judges_them_in_place_with_the_same_codes(per_item, reduce, n, codes):
    """verify replays one window through item_losses and finds the engine's items and sum are its own."""
    loop = windows(per_item, reduce)
    report = accumlib.verify(
        lambda model, opt, loader: loop(model, opt, loader, K),
        model=TASK.make_model(0),
        dataset=TASK.make_dataset() if n is None else digits(n),
        item_losses=item_losses_of(per_item),
        accum_steps=K,
        batch_size=TASK.batch_size,
    )
    assert report.oracle == "in-place", report.oracle
    assert report.codes == codes and report.ok == (not codes), report
    assert report.codes == watched(loop, item_losses_of(per_item), n)[0].codes
