"""accumlib.verify against the oracle: numbers, every code, the guarantees, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import K, windows_of, within_rounding
from conftest import exact_loop as exact
from conftest import verify_digits as run
from hypothesis import given, settings
from hypothesis import strategies as st

import accumlib
from accumlib import CODES, LOOPS, TASKS, Finding, Report, compare, get_task, true_gradient
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL

TASK = get_task("mlp-digits")  # 110 items, batch 8: 14 micro-batches, windows 4, 4, 4, 2 (8 + 6 items)


def naive(model, opt, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if (i + 1) % K == 0 or i + 1 == len(loader):
            opt.step()
            opt.zero_grad()


# ---- the numbers in the report are the oracle's ----------------------------------------------


def test_report_rows_agree_with_true_gradient():
    """Record what the loop's optimizer saw ourselves and compare with accumlib.true_gradient."""
    seen = []

    def recording_naive(model, opt, loader):
        window = []
        for i, batch in enumerate(loader):
            window.append(batch)
            F.cross_entropy(model(batch[0]), batch[1]).backward()
            if (i + 1) % K == 0 or i + 1 == len(loader):
                oracle = true_gradient(model, window, TASK.item_losses)
                seen.append(compare(model, oracle))
                opt.step()
                opt.zero_grad()
                window = []

    report = run(recording_naive)
    assert len(report.steps) == len(seen) == 4
    for row, c in zip(report.steps, seen):
        # both sides are float32 gradients of the same windows, compared in float64
        assert row.norm_ratio == pytest.approx(c.norm_ratio, rel=FLOAT32_RTOL)
        assert row.rel_error == pytest.approx(c.rel_error, rel=FLOAT32_RTOL)
    # the naive loop is about m x too large: 4 micro-batches, then a 2-micro-batch tail
    assert [round(r.norm_ratio) for r in report.steps] == [4, 4, 4, 2]
    assert report.codes == {"unscaled-sum"}


def test_exact_loop_passes_with_tiny_error():
    report = run(exact)
    assert report.ok and report.findings == ()
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]
    assert (report.items_stepped, report.items_total) == (110, 110)


# ---- every reference loop passes or fails as its docstring says -------------------------------


def expected_codes(loop: str, task: str) -> set[str]:
    tags = set(TASKS[task].tags)
    bn = {"batchnorm"} if "batchnorm" in tags else set()
    if loop == "large_batch":
        return set()  # one forward over the window is the oracle, BatchNorm included
    if loop == "naive":
        return {"unscaled-sum"} | bn
    if loop == "normalized":
        if "ragged-tail" in tags:
            return {"tail-misscaled", "mean-of-means"}  # 2-batch tail of 8 + 6 items, divided by 4
        if "token-counts" in tags:
            return {"mean-of-means"}
        return bn
    return bn  # ragged, amp: exact (amp within bf16)


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_reference_loops_get_their_documented_verdict(loop, task):
    t = TASKS[task]
    kw = {"count_items": t.count_items} if loop in ("ragged", "amp") else {}
    if loop == "large_batch":
        kw = {"merge": t.merge}

    def train_fn(model, opt, loader):
        return LOOPS[loop](model, opt, loader, t.item_losses, accum_steps=t.accum_steps, **kw)

    report = accumlib.verify(
        train_fn,
        model=t.make_model(0),
        dataset=t.make_dataset(),
        item_losses=t.item_losses,
        accum_steps=t.accum_steps,
        batch_size=t.batch_size,
        collate_fn=t.collate_fn,
    )
    assert report.codes == expected_codes(loop, task), str(report)
    if not report.codes:
        tol = BF16_RTOL if loop == "amp" else FLOAT32_RTOL
        assert max(r.rel_error for r in report.steps) <= tol


# ---- codes not covered by the gallery's simple cases ------------------------------------------


def test_unknown_inputs_are_matched_by_rows():
    """A loop that copies its inputs (new storage) is still attributed to the right micro-batches."""

    def copying(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x.clone()), y, reduction="sum") / 32).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    report = run(copying, n=128)
    assert report.ok, str(report)


def test_never_steps_is_tail_dropped_not_a_crash():
    def no_step(model, opt, loader):
        for x, y in loader:
            F.cross_entropy(model(x), y).backward()

    report = run(no_step)
    assert report.codes == {"tail-dropped"}
    assert "never called optimizer.step()" in report.findings[0].message
    assert report.items_stepped == 0 and report.items_total == 110


def test_step_without_micro_batch_is_early_step():
    def double_step(model, opt, loader):
        exact(model, opt, loader)
        opt.step()  # nothing drawn since the last step

    report = run(double_step)
    assert report.codes == {"early-step"}
    assert report.steps[-1].micro_batches == 0


# ---- a window longer than accum_steps: late-step (issues 27, 30: each of these passed before) -----------


def test_k_typed_larger_than_asked_is_late_step_and_the_correct_loop_beside_it_is_not():
    """k = 4 typed where accum_steps = 2 is asked: each step averages 4 micro-batches, 32 items where 16
    were asked. Every step matches the large batch of its own window, so verify said OK before."""
    report = run(lambda model, opt, loader: exact(model, opt, loader, k=4), k=2)
    assert report.codes == {"late-step"}, str(report)
    assert not report.ok and report.findings[0].steps == (0, 1, 2)  # the last window, 2, is what was asked
    assert "4 micro-batches" in report.findings[0].message
    # the step is what was not asked for: its gradient is its own window's large batch, to float32 rounding
    assert within_rounding(report)
    correct = run(lambda model, opt, loader: exact(model, opt, loader, k=2), k=2)
    assert correct.ok and not correct.codes and [r.micro_batches for r in correct.steps] == [2] * 7


def _one_step_per_epoch(divide):
    def loop(model, opt, loader):
        for x, y in loader:
            divide(F.cross_entropy(model(x), y, reduction="sum"), y, loader).backward()
        opt.step()  # once, after the epoch: every micro-batch in one window
        opt.zero_grad()

    return loop


def test_one_step_per_epoch_is_late_step_and_only_the_codes_it_deserves():
    # divided by the epoch's item count: exactly the epoch's large batch, still not the batch asked for
    by_items = run(_one_step_per_epoch(lambda s, y, dl: s / len(dl.dataset)))
    assert by_items.codes == {"late-step"}, str(by_items)
    assert by_items.steps[0].micro_batches == 14 and within_rounding(by_items)
    assert "14 micro-batches" in by_items.findings[0].message
    # the textbook loss / k over 16 equal micro-batches: c = m / k = 4 follows from the window, no misscale
    by_k = run(_one_step_per_epoch(lambda s, y, dl: s / len(y) / K), n=128)
    assert by_k.codes == {"late-step"}, str(by_k)
    assert by_k.steps[0].factor == pytest.approx(16 / K, rel=FLOAT32_RTOL)
    # on 110 items the last micro-batch holds 6, the rest 8: each mean weighed 1/k is mean-of-means as well
    assert run(_one_step_per_epoch(lambda s, y, dl: s / len(y) / K)).codes == {"late-step", "mean-of-means"}
    correct = run(exact)
    assert correct.ok and not correct.codes  # the correct loop beside them


def test_a_tail_merged_into_the_last_full_window_is_late_step():
    """Windows 4, 4, 6: a last window longer than k is no tail (a tail is shorter), it is a late step."""

    def merged_tail(model, opt, loader):
        ws = windows_of(loader)
        ws[-2:] = [ws[-2] + ws[-1]]
        for window in ws:
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad()

    report = run(merged_tail)
    assert report.codes == {"late-step"} and report.findings[0].steps == (2,), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 6]


def test_a_late_step_still_names_what_else_is_wrong():
    """naive steps every 4 where 2 is asked and never divides: both are named, the window first. A factor
    other than m / k is a misscale of its own, and a gradient no bug explains is unexplained."""
    report = run(naive, k=2)
    assert [f.code for f in report.findings] == ["late-step", "unscaled-sum"], str(report)
    off = run(_one_step_per_epoch(lambda s, y, dl: s / (1.04 * len(dl.dataset))))
    assert off.codes == {"late-step", "misscaled"}, str(off)
    assert off.steps[0].factor == pytest.approx(1 / 1.04), str(off)
    uneven = run(_one_step_per_epoch(lambda s, y, dl: s / len(y) / (K + int(y[0]) % 3)))
    assert uneven.codes == {"late-step", "unexplained"}, str(uneven)


def test_non_finite_gradient_is_a_finding():
    def nan_grads(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) * float("nan")).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    report = run(nan_grads, n=128)
    assert report.codes == {"non-finite"}


def test_window_without_items_is_a_finding():
    lm = get_task("lm-tokens")

    def ignore_all(model, batch):  # every token ignored: the window holds no item
        return lm.item_losses(model, batch)[:0]

    def loop(model, opt, loader):
        for i, batch in enumerate(loader):
            model(batch[0]).sum().mul(0).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    report = accumlib.verify(
        loop,
        model=lm.make_model(0),
        dataset=lm.make_dataset(),
        item_losses=ignore_all,
        accum_steps=K,
        batch_size=4,
        collate_fn=lm.collate_fn,
    )
    assert "no-items" in report.codes


def test_logged_per_step_list_checked():
    def divided_log(model, opt, loader):
        logged, total = [], 0.0
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y) / K
            loss.backward()
            total += loss.item()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
                logged.append(total / K)  # mean of divided micro-batch losses: 1/K of the window's loss
                total = 0.0
        return logged

    assert run(divided_log, n=128).codes == {"logged-loss-scaled"}
    # and the reference loops log the true window mean: no finding (checked in the loop test too)
    assert run(lambda m, o, dl: accumlib.ragged(m, o, dl, TASK.item_losses, accum_steps=K)).ok


def test_clip_of_unscaled_window_passes_and_really_clipped():
    norms = []

    def clipped(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
            opt.step()
            opt.zero_grad()

    report = run(clipped)
    assert report.ok, str(report)
    assert min(norms) > 0.1  # every window was really clipped, so the pass is not vacuous
    assert all(r.clip < 1.0 for r in report.steps)
    # like with like: the clipped gradient against the oracle clipped the same way, float32 rounding
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


# ---- guarantees --------------------------------------------------------------------------------


def test_model_optimizer_and_data_are_untouched():
    model = TASK.make_model(0)
    data = TASK.make_dataset()
    before = copy.deepcopy(model.state_dict())
    tensors = [t.clone() for t in data.tensors]
    report = accumlib.verify(
        naive, model=model, dataset=data, item_losses=TASK.item_losses, accum_steps=K, batch_size=8
    )
    assert not report.ok
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(tensors, data.tensors))


def test_dropout_stays_in_the_users_model():
    model = accumlib.models.MLP(dropout=0.3)
    accumlib.verify(
        exact,
        model=model,
        dataset=TASK.make_dataset(),
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=8,
    )
    assert model.net[2].p == 0.3


def test_train_fn_error_reaches_caller_with_note():
    def broken(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            F.cross_entropy(model(x), y).backward()
            if i == 5:
                raise KeyError("user bug")
            if (i + 1) % K == 0:
                opt.step()

    with pytest.raises(KeyError, match="user bug") as info:
        run(broken)
    assert any("6 micro-batch forwards and 1 optimizer steps" in n for n in info.value.__notes__)
    assert any(f.name == "broken" for f in info.traceback)  # the user's own frame is in the traceback


def test_clip_patch_is_restored_after_an_error():
    original = torch.nn.utils.clip_grad_norm_

    def broken(model, opt, loader):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        run(broken)
    assert torch.nn.utils.clip_grad_norm_ is original


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, error, words",
    [
        ({"train_fn": 3}, TypeError, "train_fn must be callable"),
        ({"model": "mlp"}, TypeError, "model must be a torch.nn.Module"),
        ({"dataset": 5}, TypeError, "dataset must be a map-style dataset"),
        ({"dataset": []}, ValueError, "dataset must hold at least one item"),
        ({"item_losses": None}, TypeError, "item_losses must be callable"),
        ({"accum_steps": 0}, ValueError, r"accum_steps must be an integer >= 1 \(got 0\)"),
        ({"accum_steps": 2.0}, ValueError, "accum_steps must be an integer"),
        ({"batch_size": 0}, ValueError, r"batch_size must be an integer >= 1 \(got 0\)"),
        ({"optimizer": "sgd"}, TypeError, "optimizer must be None or callable"),
        ({"optimizer": lambda ps: None}, TypeError, "optimizer must return a torch.optim.Optimizer"),
        ({"collate_fn": 1}, TypeError, "collate_fn must be None or callable"),
    ],
)
def test_bad_input_names_argument_rule_and_value(change, error, words):
    kw = (
        dict(
            train_fn=exact,
            model=TASK.make_model(0),
            dataset=TASK.make_dataset(),
            item_losses=TASK.item_losses,
            accum_steps=K,
            batch_size=8,
        )
        | change
    )
    fn = kw.pop("train_fn")
    with pytest.raises(error, match=words):
        accumlib.verify(fn, **kw)


def test_an_optimizer_instance_is_refused_with_the_factory_to_write():
    """Before: 'optimizer must be None or callable (got AdamW)', with no example of what to pass."""
    model = TASK.make_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    with pytest.raises(
        TypeError,
        match=r"not an optimizer \(got a AdamW instance.*optimizer=lambda params: "
        r"torch\.optim\.AdamW\(params, lr=0\.0003\)",
    ):
        accumlib.verify(
            exact,
            model=model,
            dataset=TASK.make_dataset(),
            item_losses=TASK.item_losses,
            accum_steps=K,
            batch_size=8,
            optimizer=opt,
        )
    # the factory it names runs, and leaves the caller's optimizer alone
    report = accumlib.verify(
        exact,
        model=model,
        dataset=TASK.make_dataset(),
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=8,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
    )
    assert report.ok and not opt.state, str(report)


def test_items_of_different_sizes_without_collate_fn_are_refused_before_the_loop_runs():
    """Before: torch's 'stack expects each tensor to be equal size' from inside the loop."""
    lm = accumlib.get_task("lm-tokens")
    ran = []
    with pytest.raises(
        ValueError, match=r"collate_fn must be given when items differ in size.*got item shapes \[\(40,\)\]"
    ):
        accumlib.verify(
            lambda *a: ran.append(1),
            model=lm.make_model(0),
            dataset=lm.make_dataset(),
            item_losses=lm.item_losses,
            accum_steps=K,
            batch_size=4,
        )
    assert not ran


def test_frozen_model_is_refused():
    model = TASK.make_model(0).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad=True"):
        accumlib.verify(
            exact,
            model=model,
            dataset=TASK.make_dataset(),
            item_losses=TASK.item_losses,
            accum_steps=K,
            batch_size=8,
        )


# ---- the report ---------------------------------------------------------------------------------


def test_report_prints_table_html_and_json():
    import json

    report = run(naive)
    text = str(report)
    assert "unscaled-sum" in text and "|g|/|g*|" in text and "NOT OK" in text
    assert "<table>" in report._repr_html_()
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["findings"][0]["code"] == "unscaled-sum" and len(data["steps"]) == 4


def test_codes_and_severities():
    issue_codes = {
        "unscaled-sum",
        "mean-of-means",
        "tail-dropped",
        "tail-misscaled",
        "zero-grad-inside-window",
        "no-zero-grad",
        "early-step",
        "scheduler-per-micro-batch",
        "clip-per-micro-batch",
        "clip-before-unscale",
        "batchnorm",
        "dropout",
        "logged-loss-scaled",
    }
    assert issue_codes <= set(CODES)
    assert Report([], [Finding("dropout", "m", "f")], K, 0, 0).ok  # a note does not fail a loop
    assert not Report([], [Finding("batchnorm", "m", "f")], K, 0, 0).ok


def test_clipping_we_cannot_intercept_is_recognised_from_norms():
    """A loop holding its own reference to clip_grad_norm_ (imported before verify ran) is still judged by
    norms."""
    from torch.nn.utils.clip_grad import clip_grad_norm_ as own_clip

    def clipped(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            own_clip(model.parameters(), 0.1)
            opt.step()
            opt.zero_grad()

    def misscaled(model, opt, loader):  # a bug that also shrinks steps: norms differ, so it is not excused
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / (K + i % 3)).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    assert run(clipped).ok
    assert run(misscaled, n=128).codes == {"unexplained"}


def test_optimizer_built_inside_the_loop_is_seen():
    def own_adam(model, opt, loader):
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)  # ignores the optimizer verify passed
        naive(model, adam, loader)

    report = run(own_adam)
    assert report.codes == {"unscaled-sum"} and len(report.steps) == 4


def test_window_skipped_by_gradscaler_is_not_merged_into_the_next():
    def overflow_once(model, opt, loader):
        scaler = torch.amp.GradScaler("cpu")
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y) / K
            if i == 5:
                loss = loss * 1e38  # the scaled gradient overflows: GradScaler skips window 2
            scaler.scale(loss).backward()
            if (i + 1) % K == 0:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()

    report = run(overflow_once, n=128)
    assert report.ok, str(report)
    assert report.steps[1].codes == ("skipped by GradScaler",)
    assert [r.micro_batches for r in report.steps] == [4] * 4


def _textbook(k):
    def loop(model, opt, loader):  # loss / k on micro-batch means; the tail stepped
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / k).backward()
            if (i + 1) % k == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()

    return loop


DIGITS_50 = accumlib.data.digits(50)  # loaded once: sklearn parses its CSV on every call


@settings(max_examples=10, deadline=None, derandomize=True)  # the same examples every run: no flaky kills
@given(n=st.integers(1, 50), b=st.integers(1, 9), k=st.integers(1, 5))
def test_awkward_sizes_on_purpose(n, b, k):
    """Sizes k and b need not divide: the exact loop always passes, the textbook loop fails only where it
    must."""
    data = torch.utils.data.Subset(DIGITS_50, range(n))

    def verify(fn):
        return accumlib.verify(
            fn,
            model=TASK.make_model(0),
            dataset=data,
            item_losses=TASK.item_losses,
            accum_steps=k,
            batch_size=b,
        )

    def exact_k(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), k):
            window = batches[s : s + k]
            items = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / items).backward()
            opt.step()
            opt.zero_grad()

    assert verify(exact_k).ok
    n_mb = -(-n // b)
    m_last = n_mb % k or k
    expected = set()
    if m_last < k:
        expected.add("tail-misscaled")
    if m_last > 1 and n % b:
        expected.add("mean-of-means")  # the last micro-batch is smaller than its window-mates
    assert verify(_textbook(k)).codes == expected


def test_two_epochs_each_with_a_stepped_tail_pass():
    def two_epochs(model, opt, loader):
        exact(model, opt, loader)
        exact(model, opt, loader)

    report = run(two_epochs)
    assert report.ok, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2] * 2


def test_oracle_runs_in_float32_even_when_the_step_happens_under_autocast():
    def step_inside_autocast(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
                opt.step()  # the capture (and so the oracle) runs inside this context
            opt.zero_grad()

    report = run(step_inside_autocast)
    assert report.ok and max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


def test_diverging_loop_gets_non_finite_finding_not_a_crash():
    def tail_dropping_exact(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y, reduction="sum") / 32).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    report = run(tail_dropping_exact, optimizer=lambda ps: torch.optim.SGD(ps, lr=1e38))  # diverges at once
    assert "non-finite" in report.codes and "tail-dropped" in report.codes
    assert report.steps[0].codes == ()  # the first step, before the blow-up, was right
    assert (report.items_stepped, report.items_total) == (96, 110)


def test_json_stays_valid_when_a_step_has_no_reference():
    import json

    def nan_grads(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) * float("nan")).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    data = json.loads(run(nan_grads, n=32).to_json())  # allow_nan=False inside: NaN would raise
    assert data["steps"][0]["norm_ratio"] is None and data["steps"][0]["codes"] == ["non-finite"]
