"""The computations behind notebooks 1-3, their widgets (without a browser) and their exercises.

Every widget test sets a control's value and asserts that the recomputed result changed the
way the lesson says it should; every exercise is checked with ``accumlib.verify`` both ways:
the right answer passes, a wrong one is named.
"""

import math

import pytest
import torch

import accumlib
from accumlib.tolerances import FLOAT32_RTOL
from accumlib_course.lessons import _why_accumulate_training
from accumlib_course.lessons import normalizing_the_loss as normalizing
from accumlib_course.lessons import ragged_windows_and_tokens as ragged_windows
from accumlib_course.lessons import why_accumulate as why

# The naive loop's norm ratio is exactly k for equal micro-batches, up to float32 rounding
# of a sum of a few hundred terms (~1e-6 relative measured): FLOAT32_RTOL's margin, far from k +- 1.
RATIO_TOL = FLOAT32_RTOL


def _verify(train_fn, dataset, accum_steps, batch_size, **kw):
    return accumlib.verify(
        train_fn,
        model=accumlib.get_task("mlp-digits").make_model(0),
        dataset=dataset,
        item_losses=accumlib.tasks.classification_losses,
        accum_steps=accum_steps,
        batch_size=batch_size,
        **kw,
    )


def _codes(report):
    return sorted(f.code for f in report.findings)


# --- lesson 1 ------------------------------------------------------------------------------------


def test_why_compute_memory_and_one_window():
    r = why.compute(accum_steps=4, batch_size=8, max_k=8, device="cpu")
    assert r.rel_error["accumulated, loss / k (accumlib.normalized)"] <= FLOAT32_RTOL
    assert abs(r.norm_ratio["accumulated, not divided (accumlib.naive)"] - 4) < RATIO_TOL * 4
    # activations grow linearly with the items in one forward: k x b items cost ~k x the bytes of b
    assert abs(r.memory_ratio - 4) < 0.01 * 4
    assert list(r.large_bytes) == sorted(r.large_bytes) and r.large_bytes[0] == r.micro_bytes
    assert [row[0] for row in r.memory_rows()] == [1, 2, 4, 8]


def test_why_compute_refuses_k_above_max_k():
    with pytest.raises(ValueError, match=r"accum_steps must be an integer between 1 and 8.*\(got 9\)"):
        why.compute(accum_steps=9, max_k=8)


def test_why_widget_recomputes_for_k_and_micro_batch():
    ex = why.widget(device="cpu")
    assert ex.result.accum_steps == 2
    ex.controls["accum_steps"].value = 5
    assert ex.result.accum_steps == 5
    assert abs(ex.result.norm_ratio["accumulated, not divided (accumlib.naive)"] - 5) < RATIO_TOL * 5
    before = ex.result.micro_bytes
    ex.controls["batch_size"].value = 16
    assert ex.result.batch_size == 16 and ex.result.micro_bytes * 2 == pytest.approx(before, rel=0.01)


def test_why_train_reproduces_the_mindspore_experiment():
    t = why.train(2, 32, lr=0.1, epochs=2, device="cpu")
    batch, accumulated, naive_run, doubled = t.runs
    assert len(t.runs[batch].loss_per_step) == 2 * why.N_TRAIN // 64
    # float32: the two runs sum the same terms in a different order; 1e-4 over 40 SGD steps
    assert t.max_curve_gap(batch, accumulated) <= 1e-4
    assert t.runs[batch].test_accuracy == t.runs[accumulated].test_accuracy
    assert t.max_curve_gap(batch, naive_run) > 0.1
    assert t.max_curve_gap(naive_run, doubled) <= 1e-4  # naive at lr == batch 64 at k x lr


def test_why_train_matches_a_dataloader_shuffle():
    """``_batches`` replaces the DataLoader (10x faster in the widget): it must hand out the same items in
    the same order.
    """
    from torch.utils.data import DataLoader, TensorDataset

    x, y = why.digits_subset()[: why.N_TRAIN]
    loader = DataLoader(
        TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(7)
    )
    ours = _why_accumulate_training._batches(x, y, 32, 7)
    assert len(ours) == len(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(loader, ours))


def test_why_training_widget_recomputes():
    ex = why.training_widget(device="cpu")
    ex.controls["accum_steps"].value = 4
    assert ex.result.accum_steps == 4 and "4 x 16 naive (not divided)" in ex.result.runs


def test_digits_subset_matches_accumlib_digits():
    a, b = why.digits_subset(20, 3)[:], accumlib.data.digits(20, seed=3).tensors
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(
        ValueError, match=r"n must be an integer between 1 and 1797; digits holds that many images \(got 0\)"
    ):
        why.digits_subset(0)


# --- lesson 2 ------------------------------------------------------------------------------------


def test_normalizing_three_forms_against_the_oracle():
    r = normalizing.compute(max_k=4, batch_size=4, device="cpu")
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


def test_normalizing_widget_recomputes_past_eight_and_nothing_within_it(monkeypatch):
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
    runs = _count_calls(monkeypatch, normalizing, "trace_loop")
    ex.controls["accum_steps"].value = 3
    assert ex.result[1] == again and runs == []  # nothing recomputed: no loop traced again
    ex.controls["batch_size"].value = 5
    k5, other = ex.result
    assert (
        other != again
        and other.batch_size == 5
        and abs(other.norm_ratio["naive (accumlib.naive)"][2] - 3) < RATIO_TOL * 3
    )


def test_bert_loop_reports_loss_off_by_k_and_the_fix_does_not():
    run = normalizing.bert_epoch(accum_steps=4, batch_size=8, device="cpu")
    assert abs(run.true / run.reported - 4) < RATIO_TOL * 4
    assert abs(run.reported_fixed - run.true) < 1e-5 * run.true


def test_bert_loop_verify_names_the_logged_loss():
    kw = dict(optimizer=normalizing.make_optimizer)
    seed_loop = _verify(normalizing.bert_train_fn(fixed=False), normalizing.exercise_dataset(), 4, 8, **kw)
    assert _codes(seed_loop) == ["logged-loss-scaled"]
    fixed = _verify(normalizing.bert_train_fn(fixed=True), normalizing.exercise_dataset(), 4, 8, **kw)
    assert fixed.ok, str(fixed)


# --- lesson 3 ------------------------------------------------------------------------------------


def test_ragged_windows_the_stack_overflow_case():
    r = ragged_windows.compute(4, 8, n=110, device="cpu")
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
    a = accumlib.harness.trace_loop(ragged_windows.step_at_end, task)
    b = accumlib.harness.trace_loop(accumlib.normalized, task)
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


def test_widgets_show_the_notebooks_result_first():
    """``initial=``: the widget starts from the result the notebook computed, then recomputes on change."""
    r = ragged_windows.compute(device="cpu")
    ex = ragged_windows.widget(device="cpu", initial=r)
    assert ex.result is r
    ex.controls["batch_size"].value = 10  # 11 micro-batches of 10: the tail window holds 3
    assert ex.result is not r and ex.result.strategies["exact: accumlib.ragged"].window_items[-1] == 30


# --- bad values: refused before any work, naming the argument, the rule and the value ----------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: why.compute(accum_steps=0), r"accum_steps must be an integer between 1 and 16.*\(got 0\)"),
        (lambda: why.compute(batch_size=0), r"batch_size must be an integer between 1 and 112.*\(got 0\)"),
        (
            lambda: why.compute(batch_size=200),
            r"batch_size must be .*max_k x batch_size digits must exist.*\(got 200\)",
        ),
        (lambda: why.train(accum_steps=0), r"accum_steps must be an integer >= 1 \(got 0\)"),
        (lambda: why.train(lr=0.0), r"lr must be a number > 0 \(got 0.0\)"),
        (lambda: why.train(optimizer="rmsprop"), r"optimizer must be one of 'sgd', 'adam' \(got 'rmsprop'\)"),
        (lambda: why.lr_sweep(lrs=()), r"lrs must hold at least one learning rate"),
        (lambda: normalizing.compute(max_k=0), r"max_k must be an integer between 1 and \d+ \(got 0\)"),
        (
            lambda: normalizing.compute(batch_size=0),
            r"batch_size must be an integer between 1 and \d+.*\(got 0\)",
        ),
        (lambda: ragged_windows.compute(accum_steps=0), r"accum_steps must be an integer >= 1 \(got 0\)"),
        (lambda: ragged_windows.compute(batch_size=0), r"batch_size must be an integer >= 1 \(got 0\)"),
        (lambda: ragged_windows.compute(n=0), r"n must be an integer between 1 and 1797.*\(got 0\)"),
        (
            lambda: ragged_windows.compute_tokens(accum_steps=0),
            r"accum_steps must be an integer >= 1 \(got 0\)",
        ),
        (
            lambda: ragged_windows.compute_tokens(batch_size=0),
            r"batch_size must be an integer between 1 and 64.*\(got 0\)",
        ),
        (lambda: why.widget(accum_steps=17), r"accum_steps must be an integer between 1 and 16"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bad_values_are_refused_before_any_work(monkeypatch):
    """The check runs first: no loop is traced for a refused call."""

    def boom(*a, **kw):
        raise AssertionError("a loop ran before the arguments were checked")

    for module in (why, normalizing, ragged_windows):
        monkeypatch.setattr(module, "trace_loop", boom)
    for call in (
        lambda: why.compute(accum_steps=0),
        lambda: normalizing.compute(max_k=0),
        lambda: ragged_windows.compute(batch_size=0),
        lambda: ragged_windows.compute_tokens(accum_steps=0),
    ):
        with pytest.raises(ValueError):
            call()


# --- figures and tables ----------------------------------------------------------------------------------


def test_figures_use_the_style_readable_and_colour_blind_safe():
    from matplotlib.colors import to_hex

    from accumlib_course import _style

    r = why.compute(accum_steps=2, batch_size=8, max_k=4, device="cpu")
    figs = [
        why.plot(r),
        normalizing.plot(normalizing.compute(max_k=2, batch_size=4, device="cpu"), highlight=2),
        ragged_windows.plot(ragged_windows.compute(device="cpu")),
        ragged_windows.plot_tokens(ragged_windows.compute_tokens(device="cpu")),
        why.plot_training(why.train(2, 32, epochs=1, device="cpu")),
        why.plot_sweep(why.lr_sweep(lrs=(0.1, 0.2), epochs=1, device="cpu")),
    ]
    banned = {to_hex("tab:red"), to_hex("tab:green")}
    for fig in figs:
        assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
        assert fig.get_suptitle(), "every figure says what it shows"
        colors = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()}
        assert not colors & banned, colors
        _style.png(fig)  # draws without error under the render lock


def test_lessons_show_tables_as_html():
    r = ragged_windows.compute(device="cpu")
    html = r.table()._repr_html_()
    assert html.startswith("<table>") and "exact: accumlib.ragged" in html
    assert str(r.table()).splitlines()[1].startswith("strategy")


# --- lesson 1's first impression: the naive loop is the large batch at k x lr -------------------------


def test_naive_is_the_accumulated_loop_at_k_times_the_learning_rate():
    """Under SGD the undivided loop at lr trains exactly like the divided one at k x lr (the sweep's lrs are
    k apart).
    """
    sweep = why.lr_sweep(2, 32, lrs=(0.05, 0.1, 0.2), epochs=1, device="cpu")
    acc, naive_run = (
        sweep.accuracy["2 x 32 accumulated (loss / k)"],
        sweep.accuracy["2 x 32 naive (not divided)"],
    )
    assert naive_run[:2] == acc[1:]  # naive at 0.05, 0.1 == accumulated at 0.1, 0.2
    assert naive_run[0] != acc[0]  # and not the same as the accumulated loop at its own lr


def test_adam_nearly_cancels_the_naive_bug_sgd_does_not():
    c = normalizing.optimizer_comparison(accum_steps=4, batch_size=16, epochs=1, device="cpu")
    sgd_gap, adam_gap = c.rows()[0][1], c.rows()[1][1]
    # Adam divides by sqrt(v): a k-times gradient changes the update only through eps (1e-8)
    assert adam_gap < 0.01 < 0.1 < sgd_gap


# --- exercises ---------------------------------------------------------------------------------------------


def _solution(name):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / f"{name}.py"
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["train_fn"]


@pytest.mark.parametrize("lesson", [why, normalizing, ragged_windows])
def test_exercise_solution_passes(lesson):
    grade = lesson.EXERCISE.check(_solution(lesson.EXERCISE.name))
    assert grade.ok, str(grade)


def _over_divided(divisor):
    """Lesson 1's loop with the mean divided by ``divisor(k, b)`` instead of k."""
    import torch.nn.functional as F

    def train_fn(model, optimizer, loader):
        k = 2
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / divisor(k, len(y))).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()

    return train_fn


@pytest.mark.parametrize(
    "divisor, factor, cause",
    [
        (lambda k, b: k * k, 1 / 2, "1/k"),  # divided by k twice: c = 1/k
        (lambda k, b: k * b, 1 / 32, "1/b"),  # a mean divided by k x b, as if it were a sum: c = 1/b
    ],
)
def test_over_division_is_named_misscaled_with_its_factor(divisor, factor, cause):
    """Lesson 1's over-division was 'unexplained'; it is one factor c on every step, checked against the
    oracle.
    """
    from accumlib._verify.diagnose import CAUSES

    train_fn = _over_divided(divisor)
    report = _verify(train_fn, why.exercise_dataset(), 2, 32)
    assert _codes(report) == ["misscaled"], str(report)
    # the oracle: every step's gradient is c x the true large-batch gradient, same direction
    assert all(row.norm_ratio == pytest.approx(factor, rel=RATIO_TOL) for row in report.steps)
    assert all(row.rel_error == pytest.approx(1 - factor, rel=RATIO_TOL) for row in report.steps)
    assert CAUSES[cause][0] in report.findings[0].message
    grade = why.EXERCISE.check(train_fn)
    assert not grade.ok and grade.stages == why.EXERCISE.hints["misscaled"]


def test_a_window_that_never_reaches_the_step_is_still_not_misscaled():
    """Negative case for the change above: weights that differ (zeroed mid-window) keep their own code."""
    import torch.nn.functional as F

    def train_fn(model, optimizer, loader):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()  # wipes the window's first micro-batch
            (F.cross_entropy(model(x), y) / 2).backward()
            if (i + 1) % 2 == 0:
                optimizer.step()

    assert _codes(_verify(train_fn, why.exercise_dataset(), 2, 32)) == ["zero-grad-inside-window"]


# --- widgets: what a control changes is recomputed, the rest comes from the cache ------------------------


def _count_calls(monkeypatch, module, name):
    """Record every call of ``module.name`` from now on (still calling it): the calls a cache saves."""
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_why_widget_returning_to_a_batch_size_recomputes_nothing(monkeypatch):
    ex = why.widget(device="cpu")
    ex.controls["accum_steps"].value = 3
    first = ex.result
    ex.controls["batch_size"].value = 16
    runs = _count_calls(monkeypatch, why, "trace_loop")
    measured = _count_calls(monkeypatch, why, "activation_bytes")
    ex.controls["batch_size"].value = 32  # back: both parts come from the cache
    assert runs == [] and measured == []  # no loop traced, no memory measured again
    assert ex.result == first
    ex.controls["batch_size"].value = 8  # a new size is computed: the counters do see work
    assert runs and measured


def test_training_widget_keeps_the_large_batch_at_64():
    ex = why.training_widget(device="cpu")
    ex.controls["accum_steps"].value = 8
    assert ex.result.batch_size == 8 and ex.result.large_batch_size == 64
    assert "batch 64" in ex.result.runs and "8 x 8 naive (not divided)" in ex.result.runs
