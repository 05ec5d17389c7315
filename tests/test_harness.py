"""The reference loops' judge (``accumlib.harness``) and table (``accumlib.reference``) at their edges.

``classify`` is fed comparisons just inside and just outside each tolerance (read from
``accumlib.tolerances``), so a loosened gate or a judge that reads the best step instead of the
worst fails here; the table is checked against traces of real loops, and a loop that drops its
partial window must show what it skipped.
"""

from __future__ import annotations

import pytest

from accumlib import get_task, naive, normalized, ragged
from accumlib.compare import Comparison
from accumlib.harness import CLOSE, EXACT, OFF_BY_K, WRONG, Trace, classify, trace_loop
from accumlib.loops import ALL, CONTRACTS, Contract
from accumlib.reference import check_reference_loops
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL, OFF_BY_K_TOL

DIGITS = get_task("mlp-digits")  # 110 items in micro-batches of 8: windows of 4, 4, 4 and 2 (14 items)


def trace_of(*steps: tuple[float, float], windows=None) -> Trace:
    """A trace whose steps have these (relative error, norm ratio); windows of 4 micro-batches unless
    given."""
    comps = [
        Comparison(rel_error=e, cosine=1.0, max_abs_diff=e, norm_ratio=r, per_param={}) for e, r in steps
    ]
    return Trace(comparisons=comps, window_batches=list(windows or [4] * len(steps)))


@pytest.mark.parametrize(
    "steps,low_precision,verdict",
    [
        ([(0.5 * FLOAT32_RTOL, 1.0)], False, EXACT),
        ([(2 * FLOAT32_RTOL, 1.0)], False, WRONG),  # past float32 rounding: not exact
        ([(0.5 * BF16_RTOL, 1.0)], True, CLOSE),  # within bf16 rounding, for an autocast loop
        ([(0.5 * BF16_RTOL, 1.0)], False, WRONG),  # ... but never for a float32 loop
        ([(2 * BF16_RTOL, 1.0)], True, WRONG),
        ([(0.0, 1.0), (0.0, 1.0), (0.5, 1.0)], False, WRONG),  # one wrong step spoils the trace
        # off by k on some steps only is not "off by ~k"
        ([(3.0, 4.0), (3.0, 4.0), (0.0, 1.0)], False, WRONG),
        ([(3.0, 4 * (1 + 0.5 * OFF_BY_K_TOL))], False, OFF_BY_K),
        ([(3.0, 4 * (1 + 2 * OFF_BY_K_TOL))], False, WRONG),  # past the off-by-k tolerance
    ],
)
def test_classify_reads_the_worst_step_against_each_tolerance(steps, low_precision, verdict):
    assert classify(trace_of(*steps), low_precision=low_precision) == verdict


def test_off_by_k_is_judged_per_window_against_its_own_micro_batch_count():
    """The naive loop's partial window of 2 micro-batches is off by 2, not by k = 4."""
    trace = trace_loop(naive, DIGITS)
    assert trace.window_batches == [4, 4, 4, 2]
    assert [round(c.norm_ratio) for c in trace.comparisons] == [4, 4, 4, 2]  # the tail: 1.96 (8 and 6 items)
    assert classify(trace) == OFF_BY_K
    assert classify(trace_of((3.0, 4.0), (1.0, 2.0), windows=[4, 4])) == WRONG  # ratio 2 in a window of 4


def test_classify_refuses_a_loop_that_never_stepped():
    with pytest.raises(ValueError, match=r"trace must hold at least one optimizer step"):
        classify(Trace())


def test_a_callers_count_items_is_the_one_the_loop_uses():
    task, calls = get_task("lm-tokens"), []

    def counter(batch):
        calls.append(1)
        return task.count_items(batch)

    assert classify(trace_loop(ragged, task, count_items=counter)) == EXACT
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
        # drawn one at a time: the harness's oracle is what was drawn since the last step
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
    promise = Contract(full_windows=EXACT, ragged_tail=EXACT, token_counts=WRONG, batchnorm=WRONG, order=None)
    monkeypatch.setitem(ALL, "dropping", dropping)
    monkeypatch.setitem(CONTRACTS, "dropping", promise)
    row = check_reference_loops(tasks=["mlp-digits"], loops=["dropping"]).rows[0]
    assert row.verdict == EXACT  # every step it took is exact: only the columns show the loss
    assert row.cells()[5:7] == ("3/4", "96/110")


def test_the_table_reports_the_worst_step_of_each_row():
    """normalized on lm-tokens: per-micro-batch means weigh tokens unequally, differently each step."""
    trace = trace_loop(normalized, get_task("lm-tokens"))
    errors, cosines = [c.rel_error for c in trace.comparisons], [c.cosine for c in trace.comparisons]
    assert min(errors) < max(errors) and min(cosines) < max(cosines)  # the steps differ: best != worst
    row = check_reference_loops(tasks=["lm-tokens"], loops=["normalized"]).rows[0]
    assert (row.max_rel_error, row.min_cosine) == (max(errors), min(cosines))


def test_one_broken_promise_among_kept_ones_turns_the_table_red(monkeypatch):
    lie = Contract(
        full_windows=OFF_BY_K,
        ragged_tail=OFF_BY_K,
        token_counts=OFF_BY_K,
        batchnorm=WRONG,
        order=None,
        takes=("count_items",),
    )
    monkeypatch.setitem(CONTRACTS, "ragged", lie)
    table = check_reference_loops(tasks=["mlp-digits"], loops=["naive", "ragged"])
    assert [r.holds for r in table.rows] == [True, False]
    assert not table.ok and "FAILED" in str(table)


def test_a_float32_loop_within_bf16_rounding_is_not_exact_in_the_table(monkeypatch):
    """Only a loop whose contract says low_precision (it runs under autocast) gets bf16's tolerance."""
    nudged = scratch_loop(scale=1.01)  # every gradient 1 % large: within bf16 rounding, past float32
    monkeypatch.setitem(ALL, "nudged", nudged)
    monkeypatch.setitem(
        CONTRACTS,
        "nudged",
        Contract(full_windows=WRONG, ragged_tail=WRONG, token_counts=WRONG, batchnorm=WRONG, order=None),
    )
    row = check_reference_loops(tasks=["mlp-digits"], loops=["nudged"]).rows[0]
    assert FLOAT32_RTOL < row.max_rel_error < BF16_RTOL
    assert row.verdict == WRONG and row.holds
