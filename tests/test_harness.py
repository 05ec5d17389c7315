"""The reference loops' run under verify (``accumlib.harness``) and their table (``accumlib.reference``) at
their edges.

The harness adds no judge of its own: a trace's verdict and figures are ``accumlib.verify``'s for the
same run (checked against a call of verify by hand and against the oracle of the test's own replay).
Scratch loops with one planted defect each show verify's code in the table, a loop that drops its
partial window shows what it skipped, and a float32 loop within bfloat16's rounding is no loop verify
passes.
"""

from __future__ import annotations

import pytest
import torch

import accumlib
from accumlib import get_task, naive, normalized, ragged
from accumlib.harness import trace_loop, verdict_text
from accumlib.loops import ALL, CONTRACTS, Contract
from accumlib.reference import check_reference_loops
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL

DIGITS = get_task("mlp-digits")  # 110 items in micro-batches of 8: windows of 4, 4, 4 and 2 (14 items)


def test_a_trace_is_verifys_report_of_the_same_run():
    """One judge: the harness's verdict and per-step figures are what verify says when called by hand."""
    trace = trace_loop(naive, DIGITS, lr=0.05)

    def train(model, optimizer, loader):
        return naive(model, optimizer, loader, DIGITS.item_losses, accum_steps=4)

    by_hand = accumlib.verify(
        train,
        model=DIGITS.make_model(0),
        dataset=DIGITS.make_dataset(),
        item_losses=DIGITS.item_losses,
        accum_steps=4,
        batch_size=8,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05),
    )
    assert trace.verdict == tuple(sorted(by_hand.codes)) == ("unscaled-sum",)
    assert [s.rel_error for s in trace.comparisons] == [s.rel_error for s in by_hand.steps]
    assert len(trace.logged) == len(trace.comparisons) == 4  # the loop's own logged losses, one per step


def test_off_by_k_shows_per_window_against_its_own_micro_batch_count():
    """The naive loop's partial window of 2 micro-batches is off by 2, not by k = 4: verify's
    unscaled-sum names the sum of m means, m the window's own count."""
    trace = trace_loop(naive, DIGITS)
    assert trace.window_batches == [4, 4, 4, 2]
    assert [round(c.norm_ratio) for c in trace.comparisons] == [4, 4, 4, 2]  # the tail: 1.96 (8 and 6 items)
    assert trace.verdict == ("unscaled-sum",)


def test_the_step_figures_match_the_tests_own_oracle():
    """The trace's relative errors are against the true large-batch gradient: normalized's tail window
    (2 micro-batches divided by 4) is about half the truth, as the test's own replay computes it."""
    model = DIGITS.make_model(0)
    batches = list(DIGITS.loader())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for window in (batches[0:4], batches[4:8], batches[8:12]):  # the three full windows, each exact
        true = accumlib.true_gradient(model, window, DIGITS.item_losses)
        for p, g in zip(model.parameters(), true.values()):
            p.grad = g.clone()
        opt.step()
    tail = batches[12:]
    true = accumlib.true_gradient(model, tail, DIGITS.item_losses)
    n = [len(y) for _, y in tail]
    model.zero_grad()
    for b in tail:  # normalized: each micro-batch mean divided by k = 4
        (DIGITS.item_losses(model, b).mean() / 4).backward()
    want = accumlib.compare(model, true)
    got = trace_loop(normalized, DIGITS).comparisons[-1]
    assert n == [8, 6]
    assert got.rel_error == pytest.approx(want.rel_error, rel=1e-4)  # float32 sums in different orders
    assert got.norm_ratio == pytest.approx(want.norm_ratio, rel=1e-4)
    assert got.cosine == pytest.approx(want.cosine, abs=1e-6)


def test_verdict_text_reads_ok_for_no_codes():
    assert verdict_text(()) == "ok" and verdict_text(("mean-of-means", "tail-misscaled")) == (
        "mean-of-means, tail-misscaled"
    )


def test_a_callers_count_items_is_the_one_the_loop_uses():
    task, calls = get_task("lm-tokens"), []

    def counter(batch):
        calls.append(1)
        return task.count_items(batch)

    assert trace_loop(ragged, task, count_items=counter).verdict == ()
    assert calls  # the contract's own counter (task.count_items) must not replace the caller's


def scratch_loop(*, scale=1.0, drop_tail=False):
    """A plain, correctly normalized loop with one planted defect: gradients ``scale`` times too large,
    or the last, partial window dropped."""

    def loop(model, optimizer, loader, item_losses, *, accum_steps, device=None, progress=False):
        def step(window):
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (item_losses(model, (x, y)).sum() * scale / n).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            logged.append(0.0)

        logged, window = [], []
        # drawn one at a time, as a user's loop draws them
        for batch in loader:
            window.append(batch)
            if len(window) == accum_steps:
                step(window)
                window = []
        if window and not drop_tail:
            step(window)
        return logged

    return loop


def test_a_loop_that_drops_its_partial_window_shows_3_of_4_steps_and_96_of_110_items(monkeypatch):
    dropping = scratch_loop(drop_tail=True)
    trace = trace_loop(dropping, DIGITS)
    assert (trace.window_batches, trace.window_items, trace.n_batches, trace.n_items) == (
        [4, 4, 4],
        [32, 32, 32],
        14,
        110,
    )
    assert trace.report.findings[0].message == "14 of 110 items reached no optimizer step"
    promise = Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm=("batchnorm",), order=None)
    monkeypatch.setitem(ALL, "dropping", dropping)
    monkeypatch.setitem(CONTRACTS, "dropping", promise)
    row = check_reference_loops(tasks=["mlp-digits"], loops=["dropping"]).rows[0]
    # every step it took is exact: verify's coverage says what it skipped, and so do the columns
    assert row.max_rel_error <= FLOAT32_RTOL
    assert row.verdict == ("tail-dropped",) and not row.holds
    assert row.cells()[5:7] == ("3/4", "96/110")


def test_the_table_reports_the_worst_step_of_each_row():
    """normalized on lm-tokens: per-micro-batch means weigh tokens unequally, differently each step."""
    trace = trace_loop(normalized, get_task("lm-tokens"))
    errors, cosines = [c.rel_error for c in trace.comparisons], [c.cosine for c in trace.comparisons]
    assert min(errors) < max(errors) and min(cosines) < max(cosines)  # the steps differ: best != worst
    row = check_reference_loops(tasks=["lm-tokens"], loops=["normalized"]).rows[0]
    assert (row.max_rel_error, row.min_cosine) == (max(errors), min(cosines))


def test_one_broken_promise_among_kept_ones_turns_the_table_red(monkeypatch):
    u = ("unscaled-sum",)
    lie = Contract(
        full_windows=u,
        ragged_tail=u,
        token_counts=u,
        batchnorm=("batchnorm",),
        order=None,
        takes=("count_items",),
    )
    monkeypatch.setitem(CONTRACTS, "ragged", lie)
    table = check_reference_loops(tasks=["mlp-digits"], loops=["naive", "ragged"])
    assert [r.holds for r in table.rows] == [True, False]
    assert not table.ok and "FAILED" in str(table)


def test_a_float32_loop_within_bf16_rounding_is_misscaled_in_the_table(monkeypatch):
    """Only a loop that runs under autocast is judged against its dtype's replay; a float32 loop 1 % off is
    within bf16's rounding and still a bug, with its factor c = 1.01 in every step's row."""
    nudged = scratch_loop(scale=1.01)  # every gradient 1 % large: within bf16 rounding, past float32
    m = ("misscaled",)
    monkeypatch.setitem(ALL, "nudged", nudged)
    monkeypatch.setitem(
        CONTRACTS, "nudged", Contract(full_windows=m, ragged_tail=m, token_counts=m, batchnorm=m, order=None)
    )
    row = check_reference_loops(tasks=["mlp-digits"], loops=["nudged"]).rows[0]
    assert FLOAT32_RTOL < row.max_rel_error < BF16_RTOL
    assert row.verdict == m and row.holds and row.judged_against == "float32"
    assert {round(s.factor, 4) for s in trace_loop(nudged, DIGITS).comparisons} == {1.01}


def test_an_autocast_loop_is_judged_against_its_dtypes_replay_and_says_so():
    """amp on CPU (bfloat16): ~5e-2 from the float32 gradient, within rounding of its own replay; the
    table's column names what it was judged against, so its ``ok`` is not read as exact."""
    row = check_reference_loops(tasks=["mlp-digits"], loops=["amp"]).rows[0]
    assert FLOAT32_RTOL < row.max_rel_error < BF16_RTOL * 10
    assert (
        row.verdict == () and row.judged_against == "bfloat16 replay" and row.oracle.startswith("recompute")
    )
    assert row.cells()[7:9] == ("bfloat16 replay", "ok")
    trace = trace_loop(accumlib.amp, DIGITS)  # verify ran it twice: the judged run's losses, one per step
    assert len(trace.logged) == len(trace.comparisons) == 4
