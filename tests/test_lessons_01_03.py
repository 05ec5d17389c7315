"""The computations behind notebooks 1-3, their widgets (without a browser) and their exercises.

Every widget test sets a control's value and asserts that the recomputed result changed the
way the lesson says it should; every exercise is checked with ``accumlib.verify`` both ways:
the right answer passes, a wrong one is named.
"""

import math

import pytest
import torch

import accumlib
from accumlib.check import FLOAT32_RTOL
from accumlib.lessons import normalizing, ragged_windows, why

# The naive loop's norm ratio is exactly k for equal micro-batches, up to float32 rounding
# of a sum of a few hundred terms (~1e-6 relative); 1e-3 is a wide margin that still
# separates k from k +- 1.
RATIO_TOL = 1e-3


def _verify(train_fn, dataset, accum_steps, batch_size, **kw):
    return accumlib.verify(
        train_fn, model=accumlib.get_task("mlp-digits").make_model(0), dataset=dataset,
        item_losses=accumlib.classification_losses, accum_steps=accum_steps, batch_size=batch_size, **kw,
    )


def _codes(report):
    return sorted(f.code for f in report.findings)


# --- lesson 1 ------------------------------------------------------------------------------------


def test_why_compute_memory_and_one_window():
    r = why.compute(accum_steps=4, micro_batch_size=8, max_k=8, device="cpu")
    assert r.rel_error["accumulated, loss / k (accumlib.normalized)"] <= FLOAT32_RTOL
    assert abs(r.norm_ratio["accumulated, not divided (accumlib.naive)"] - 4) < RATIO_TOL * 4
    # activations grow linearly with the items in one forward: k x b items cost ~k x the bytes of b
    assert abs(r.memory_ratio - 4) < 0.01 * 4
    assert list(r.large_bytes) == sorted(r.large_bytes) and r.large_bytes[0] == r.micro_bytes
    assert [row[0] for row in r.memory_rows()] == [1, 2, 4, 8]


def test_why_compute_refuses_k_above_max_k():
    with pytest.raises(ValueError, match="accum_steps must be <= max_k"):
        why.compute(accum_steps=9, max_k=8)


def test_why_widget_recomputes_for_k_and_micro_batch():
    ex = why.widget(device="cpu")
    assert ex.result.accum_steps == 2
    ex.controls["accum_steps"].value = 5
    assert ex.result.accum_steps == 5
    assert abs(ex.result.norm_ratio["accumulated, not divided (accumlib.naive)"] - 5) < RATIO_TOL * 5
    before = ex.result.micro_bytes
    ex.controls["micro_batch_size"].value = 16
    assert ex.result.micro_batch_size == 16 and ex.result.micro_bytes * 2 == pytest.approx(before, rel=0.01)


def test_why_train_reproduces_the_mindspore_experiment():
    t = why.train(64, 2, lr=0.1, epochs=2, device="cpu")
    batch, accumulated, naive_run, doubled = t.runs
    assert len(t.runs[batch].loss_per_step) == 2 * why.N_TRAIN // 64
    # float32: the two runs sum the same terms in a different order; 1e-4 over 40 SGD steps
    assert t.max_curve_gap(batch, accumulated) <= 1e-4
    assert t.runs[batch].test_accuracy == t.runs[accumulated].test_accuracy
    assert t.max_curve_gap(batch, naive_run) > 0.1
    assert t.max_curve_gap(naive_run, doubled) <= 1e-4  # naive at lr == batch 64 at k x lr


def test_why_train_refuses_indivisible_batch():
    with pytest.raises(ValueError, match="batch_size must be divisible by accum_steps"):
        why.train(64, 3)


def test_why_training_widget_recomputes():
    ex = why.training_widget(device="cpu")
    ex.controls["accum_steps"].value = 4
    assert ex.result.accum_steps == 4 and "4 x 16 naive (not divided)" in ex.result.runs


def test_why_exercise_right_and_wrong_answers():
    right = _verify(why.exercise_loop(2), why.exercise_dataset(), 2, 32)
    assert right.ok, str(right)
    wrong = _verify(why.exercise_loop(1), why.exercise_dataset(), 2, 32)
    assert not wrong.ok and "unscaled-sum" in _codes(wrong)


def test_digits_subset_matches_accumlib_digits():
    a, b = why.digits_subset(20, 3)[:], accumlib.digits(20, seed=3).tensors
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="n must be between 1 and"):
        why.digits_subset(0)


# --- lesson 2 ------------------------------------------------------------------------------------


def test_normalizing_three_forms_against_the_oracle():
    r = normalizing.compute(max_k=4, micro_batch_size=4, device="cpu")
    for i, k in enumerate(r.ks):
        assert abs(r.norm_ratio["naive (accumlib.naive)"][i] - k) < RATIO_TOL * k
        assert r.rel_error["loss / k (accumlib.normalized)"][i] <= FLOAT32_RTOL
        assert r.rel_error["grad / k after the window"][i] <= FLOAT32_RTOL
        assert abs(r.reported_ratio[i] - 1 / k) < RATIO_TOL / k


def test_grad_divided_in_float64_is_exact_to_float64():
    # float64: the identity holds to ~1e-15; 1e-12 leaves a 1000x margin and is far below float32's 1e-7
    task = normalizing._task(3, 5, 0)
    model = task.make_model(0).double()
    data = [(x.double(), y) for x, y in task.loader()]
    seen = []
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    opt.register_step_pre_hook(lambda o, a, kw: seen.append(accumlib.grads_of(model)))
    accumlib.grad_divided(model, opt, data, task.item_losses, accum_steps=3)
    oracle = accumlib.true_gradient(model, data[:3], task.item_losses)
    assert accumlib.compare(seen[0], oracle).rel_error < 1e-12


def test_normalizing_widget_recomputes_past_eight():
    ex = normalizing.widget(device="cpu")
    k, result = ex.result
    assert k == 4 and result.ks == tuple(range(1, 9))
    ex.controls["accum_steps"].value = 10
    k, result = ex.result
    assert k == 10 and result.ks[-1] == 10
    assert abs(result.norm_ratio["naive (accumlib.naive)"][-1] - 10) < RATIO_TOL * 10
    # back within 1..8: the sweep up to 8 is reused (only the highlight moves); a new
    # micro-batch size is a new sweep whose naive ratio is still k
    ex.controls["accum_steps"].value = 2
    k2, again = ex.result
    assert k2 == 2 and again.ks == tuple(range(1, 9))
    ex.controls["accum_steps"].value = 3
    assert ex.result[1] is again
    ex.controls["micro_batch_size"].value = 5
    k5, other = ex.result
    assert other is not again and other.micro_batch_size == 5 and abs(other.norm_ratio["naive (accumlib.naive)"][2] - 3) < RATIO_TOL * 3


def test_bert_loop_reports_loss_off_by_k_and_the_fix_does_not():
    run = normalizing.bert_epoch(accum_steps=4, micro_batch_size=8, device="cpu")
    assert abs(run.true / run.reported - 4) < RATIO_TOL * 4
    assert abs(run.reported_fixed - run.true) < 1e-5 * run.true


def test_bert_loop_verify_names_the_logged_loss():
    kw = dict(optimizer=normalizing.make_optimizer)
    seed_loop = _verify(normalizing.bert_train_fn(fixed=False), normalizing.exercise_dataset(), 4, 8, **kw)
    assert _codes(seed_loop) == ["logged-loss-scaled"]
    fixed = _verify(normalizing.bert_train_fn(fixed=True), normalizing.exercise_dataset(), 4, 8, **kw)
    assert fixed.ok, str(fixed)


def test_normalizing_exercise_right_and_wrong_answers():
    assert _verify(normalizing.exercise_loop("after"), normalizing.exercise_dataset(), 4, 8).ok
    wrong = _verify(normalizing.exercise_loop("inside"), normalizing.exercise_dataset(), 4, 8)
    assert not wrong.ok and wrong.findings
    with pytest.raises(ValueError, match="divide must be 'inside' or 'after'"):
        normalizing.exercise_loop("before")


# --- lesson 3 ------------------------------------------------------------------------------------


def test_ragged_windows_the_stack_overflow_case():
    r = ragged_windows.compute(110, 8, 4, device="cpu")
    drop, by_k, by_batches, exact = (r.strategies[n] for n in ragged_windows.STRATEGIES)
    assert r.micro_batches == 14
    assert (drop.steps, drop.items_stepped) == (3, 96) and drop.worst <= FLOAT32_RTOL
    assert (by_k.steps, by_k.items_stepped, by_k.window_items[-1]) == (4, 110, 14)
    # the tail holds 2 of 4 micro-batches and is still divided by 4: about half the true gradient
    assert by_k.norm_ratio[-1] == pytest.approx(0.5, abs=0.05) and by_k.rel_error[-1] > 0.25
    # 8 + 6 samples weighed per micro-batch: the 6 count 8/6 too much, a smaller but real error
    assert 0.01 < by_batches.rel_error[-1] < 0.5 and max(by_batches.rel_error[:-1]) <= FLOAT32_RTOL
    assert (exact.steps, exact.items_stepped) == (4, 110) and exact.worst <= FLOAT32_RTOL


def test_step_at_end_is_accumlib_normalized():
    task = accumlib.get_task("mlp-digits")
    a = accumlib.trace_loop(ragged_windows.step_at_end, task)
    b = accumlib.trace_loop(accumlib.normalized, task)
    assert [round(c.rel_error, 5) for c in a.comparisons] == [round(c.rel_error, 5) for c in b.comparisons]


def test_ragged_widget_round_numbers_hide_the_bugs():
    ex = ragged_windows.widget(device="cpu")
    assert ex.result.strategies["drop the tail: (i + 1) % k"].items_stepped == 96
    ex.controls["n"].value = 128  # 128 = 4 windows of 4 x 8: every strategy is exact
    assert all(s.worst <= FLOAT32_RTOL and s.items_stepped == 128 for s in ex.result.strategies.values())
    ex.controls["accum_steps"].value = 3  # 16 micro-batches, 3 does not divide them
    assert ex.result.strategies["drop the tail: (i + 1) % k"].items_stepped == 120
    assert ex.result.strategies["exact: accumlib.ragged"].steps == math.ceil(16 / 3)


def test_token_counts_mean_of_means_is_wrong_ragged_is_exact():
    r = ragged_windows.compute_tokens(device="cpu")
    by_means, by_tokens = r.rel_error.values()
    assert len(r.windows) == 4 and all(len(set(w.tokens)) > 1 for w in r.windows)
    assert all(abs(w.mean_of_means - w.token_mean) > 0 for w in r.windows)
    assert min(by_means) > 0.01 and max(by_tokens) <= FLOAT32_RTOL


@pytest.mark.parametrize("answer, codes", [("k", {"tail-misscaled"}), ("batches", {"mean-of-means"})])
def test_ragged_exercise_wrong_answers_are_named(answer, codes):
    report = _verify(ragged_windows.exercise_loop(answer), ragged_windows.exercise_dataset(), 4, 8)
    assert not report.ok and codes <= set(_codes(report)), str(report)


def test_ragged_exercise_right_answer_passes():
    report = _verify(ragged_windows.exercise_loop("items"), ragged_windows.exercise_dataset(), 4, 8)
    assert report.ok, str(report)


def test_widgets_show_the_notebooks_result_first():
    """``initial=``: the widget starts from the result the notebook computed, then recomputes on change."""
    r = ragged_windows.compute(device="cpu")
    ex = ragged_windows.widget(device="cpu", initial=r)
    assert ex.result is r
    ex.controls["batch_size"].value = 10  # 11 micro-batches of 10: the tail window holds 3
    assert ex.result is not r and ex.result.strategies["exact: accumlib.ragged"].window_items[-1] == 30
