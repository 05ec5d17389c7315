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

    def verified(**oracle):
        return accumlib.verify(
            _every_micro_batch(4),
            model=task.make_model(0),
            dataset=task.make_dataset(),
            item_losses=task.item_losses,
            accum_steps=1,
            batch_size=task.batch_size,
            **oracle,
        )

    report = verified(oracle="recompute")
    assert report.codes == {"misscaled"} and {r.cause for r in report.steps} == {"reduction"}, report
    in_place = verified()
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


def _tiny_llama_run(count_before_shift: bool, *, per_micro_batch: bool):
    """A tiny Llama built from its config (Transformers' own causal-LM loss, which shifts the labels), 8
    padded micro-batches of 2 sequences, k = 4, under watch. ``per_micro_batch``: each micro-batch's mean
    over its shifted labels is weighted by its own label count over the window's (Accelerate's example);
    else the window's count is handed to the model as ``num_items_in_batch`` (the Trainer's). The count
    is taken after the shift (right) or before it (one label too many per sequence)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        ids = torch.randint(0, 50, (2, 12), generator=g)
        labels = ids.clone()
        lengths = torch.randint(3, 13, (2,), generator=g)
        labels[torch.arange(12)[None] >= lengths[:, None]] = -100
        batches.append((ids, labels))

    def count(labels):
        return (labels if count_before_shift else labels[:, 1:]).ne(-100).sum()

    with accumlib.watch(accum_steps=4, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for s in range(0, 8, 4):
            window = batches[s : s + 4]
            total = sum(count(labels) for _, labels in window)
            for ids, labels in window:
                if per_micro_batch:
                    (model(input_ids=ids, labels=labels).loss * count(labels) / total).backward()
                else:
                    model(input_ids=ids, labels=labels, num_items_in_batch=total).loss.backward()
            opt.step()
            opt.zero_grad()
    assert seen.report is not None
    return seen.report


@pytest.mark.parametrize("per_micro_batch", [True, False])
def test_labels_counted_before_a_causal_lms_shift_are_named_by_the_shift(per_micro_batch):
    """The in-place engine's fits carried no sequences, so the rules for labels counted before the shift
    could never match on it: at 5d241f5 the per-micro-batch weighting read ``unexplained`` here (and
    ``misscaled`` with c = 1.0000 on ~250-token sequences). The sequences are now read from the loss
    call's target (Transformers flattens the shifted labels as a view of a (rows, length) tensor)."""
    good = _tiny_llama_run(False, per_micro_batch=per_micro_batch)
    assert good.ok and good.codes == set(), good
    assert max(r.rel_error for r in good.steps) < FLOAT32_RTOL
    bad = _tiny_llama_run(True, per_micro_batch=per_micro_batch)
    assert not bad.ok, bad
    if per_micro_batch:  # weights (N_j + S_j) / N_j x sum N / sum (N + S), read per micro-batch
        assert bad.codes == {"mean-of-means"}, bad
        assert "shifted labels" in bad.findings[0].message, bad
    else:  # one count too large for the whole window: c = N / (N + S)
        assert bad.codes == {"misscaled"} and {r.cause for r in bad.steps} == {"shift"}, bad
