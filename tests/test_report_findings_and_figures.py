"""What the report states, checked on one small run: its findings, tables, figures and alt text, and
the JSON file it writes, against identities the loops must show (no papermill: a few seconds).

110 digits in micro-batches of 12 make 10 micro-batches, the last holding 2 items. At k = 3 the
windows hold 3, 3, 3 and 1 micro-batches: naive's full windows are exactly k g* (relative error 2,
norm ratio 3) and its one-micro-batch tail is exact. At k = 2 every window holds 2 micro-batches,
the last a 12-item and a 2-item one, which naive weights equally: that step points elsewhere. The
norm section's 128 images make 11 micro-batches: BatchNorm is exact at k = 1 (one micro-batch is
the large batch) and on k = 2's one-micro-batch tail, and off on every full window of k >= 2.
"""

import json
import math
import os

import pytest
import torch

from accumlib import get_task
from accumlib.loops import ALL, LOOPS
from accumlib.text import fmt_error
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL
from accumlib_course import report

KS, BATCH, SEED = (1, 2, 3), 12, 1  # seed 1, not run's default 0: a seed that is not forwarded shows
N_ITEMS, N_BATCHES = 110, 10


@pytest.fixture(scope="module")
def run_in_folder(tmp_path_factory):
    """The report run from a folder with a bare ``results_path`` (no folder part): (result, the JSON it
    wrote, folder)."""
    folder = tmp_path_factory.mktemp("bare")
    here = os.getcwd()
    os.chdir(folder)
    try:
        result = report.run(
            task="mlp-digits",
            accum_steps=list(KS),
            batch_size=BATCH,
            norm="batch",
            precision="float32",
            device="cpu",
            seed=SEED,
            results_path="report.json",
        )
    finally:
        os.chdir(here)
    return result, json.loads((folder / "report.json").read_text()), folder


@pytest.fixture(scope="module")
def result(run_in_folder):
    return run_in_folder[0]


@pytest.fixture(scope="module")
def summary(run_in_folder):
    return run_in_folder[1]


def _cells(summary):
    return {(c["loop"], c["k"]): c for c in summary["loops"]}


def _finding(summary, start):
    (found,) = [f for f in summary["findings"] if f.startswith(start)]
    return found


def test_a_bare_results_path_is_written_in_the_working_folder(run_in_folder):
    result, written, folder = run_in_folder
    assert [p.name for p in folder.iterdir()] == ["report.json"]
    assert written == json.loads(json.dumps(result.summary()))  # every number, as the result states it
    assert report.check_parameters(results_path="report.json").results_path == "report.json"


def test_the_seed_reaches_the_model(summary):
    """Step 1 at k = 1 logs the first micro-batch's mean loss under the initial model of the given seed."""
    t = get_task("mlp-digits")
    first = next(iter(t.loader(BATCH)))
    with torch.no_grad():
        losses = {s: float(t.item_losses(t.make_model(s), first).mean()) for s in (0, SEED)}
    assert abs(losses[SEED] - losses[0]) > FLOAT32_RTOL  # the two seeds do differ
    logged = _cells(summary)[("large_batch", 1)]["logged"][0]
    assert logged == pytest.approx(losses[SEED], rel=FLOAT32_RTOL)


def test_cells_keep_each_loops_worst_step(summary):
    cells = _cells(summary)
    naive = cells[("naive", 3)]
    # full windows of 3 equal micro-batches: exactly 3 g*; the one-micro-batch tail: exactly g*
    assert naive["window_batches"] == [3, 3, 3, 1]
    assert naive["max_norm_ratio"] == pytest.approx(3, rel=FLOAT32_RTOL)
    assert naive["rel_errors"][-1] <= FLOAT32_RTOL < naive["max_rel_error"]
    assert naive["max_rel_error"] == pytest.approx(2, rel=FLOAT32_RTOL)
    # k = 2: the last window weights a 2-item micro-batch like a 12-item one, so that step points elsewhere
    assert cells[("naive", 2)]["min_cosine"] < 1 - FLOAT32_RTOL
    assert cells[("ragged", 2)]["min_cosine"] >= 1 - FLOAT32_RTOL
    for c in cells.values():
        assert (
            c["steps"] == c["expected_steps"] == math.ceil(N_BATCHES / c["k"])
            and c["items_used"] == c["items"] == N_ITEMS
        )


def test_the_findings_name_each_loops_worst_k(result, summary):
    cells = _cells(summary)
    for loop in ("naive", "normalized"):
        worst = result.worst_k(loop)
        assert worst == max(KS, key=lambda k: cells[(loop, k)]["max_rel_error"])  # no tie here
        finding = _finding(summary, f"{loop}: ")
        assert f"relative error {fmt_error(cells[(loop, worst)]['max_rel_error'])} at k = {worst}" in finding
    naive = _finding(summary, "naive: ")
    assert "ok at k = 1; unscaled-sum at k = 2, 3" in naive  # verify's codes, per k
    assert "at k = 1," not in naive  # k = 1 is naive's best step (exact), never its worst


def _with_errors(result, loop, errors):
    """``result`` with ``loop``'s worst step at each k set to ``errors[k]`` (the rest kept)."""
    from dataclasses import replace

    cells = dict(result.cells)
    for k, e in errors.items():
        cells[(loop, k)] = replace(cells[(loop, k)], rel_errors=(e,))
    return replace(result, ks=tuple(errors), cells=cells)


def test_the_worst_k_does_not_rest_on_a_difference_below_float32_rounding(result):
    """Which k is worst must be the same on every CPU (an AMD host named k = 8 where Intel named k = 4):
    errors within FLOAT32_RTOL (relative) of the largest tie, and a tie goes to the smallest k."""
    tie = {1: 3e-8, 2: 0.5, 3: 0.75 * (1 + FLOAT32_RTOL / 10)}
    assert _with_errors(result, "normalized", {**tie, 2: 0.75}).worst_k("normalized") == 2
    # swapping the last digits between the two tied k names the same k
    assert _with_errors(result, "normalized", {1: 3e-8, 2: tie[3], 3: 0.75}).worst_k("normalized") == 2
    # all rounding: no k is worse than another, the smallest is named
    assert _with_errors(result, "ragged", {1: 2e-7, 2: 9e-8, 3: 3e-7}).worst_k("ragged") == 1
    # a difference above float32 rounding still decides (the negative side)
    assert _with_errors(result, "normalized", {1: 3e-8, 2: 0.5, 3: 0.75}).worst_k("normalized") == 3
    assert _with_errors(result, "naive", {1: 2e-7, 2: 3e-4, 3: 1e-7}).worst_k("naive") == 2
    findings = _with_errors(result, "normalized", {**tie, 2: 0.75}).findings()
    assert "relative error 0.75 at k = 2," in next(f for f in findings if f.startswith("normalized: "))


def test_no_finding_of_dropped_items_when_every_loop_steps_its_tail(summary):
    assert not [f for f in summary["findings"] if "reached no optimizer step" in f]


def test_the_norm_section_reports_each_ks_worst_step_and_the_worst_k(result, summary):
    norm = {int(k): e for k, e in summary["norm_max_rel_error"].items()}
    assert list(norm) == list(KS)
    assert norm[1] <= FLOAT32_RTOL  # one micro-batch is the large batch
    # k = 2's last window is one micro-batch (exact): the worst step, not the best, must be kept
    assert norm[2] > FLOAT32_RTOL and norm[3] > FLOAT32_RTOL
    finding = _finding(summary, "SmallCNN with batch norm")
    assert f"worst relative error {fmt_error(max(norm.values()))} over k = 1, 2, 3 (not exact" in finding
    assert result.norm_table().rows == [(str(k), fmt_error(e)) for k, e in norm.items()]


def test_memory_finding_and_table_compare_one_micro_batch_with_the_large_batch(result, summary):
    mem = {int(k): v for k, v in summary["memory"].items()}
    for k in KS:
        assert mem[k]["large_batch_bytes"] == pytest.approx(k * mem[k]["micro_batch_bytes"], rel=0.01)
    m, big = mem[3]["micro_batch_bytes"], mem[3]["large_batch_bytes"]
    finding = _finding(summary, "Activation memory")
    assert f"one micro-batch of {BATCH} needs {m / 1024:.1f} KiB" in finding
    assert (
        f"the large batch of k = 3 micro-batches would need {big / 1024:.1f} KiB ({big / m:.2f}x)" in finding
    )
    table = result.memory_table()
    assert [(r[0], r[1], r[4]) for r in table.rows] == [
        ("1", "12", "1.00x"),
        ("2", "24", "2.00x"),
        ("3", "36", "3.00x"),
    ]


def test_the_settings_count_the_tail_step(result):
    rows = dict(result.settings().rows)
    assert rows["data"] == f"{N_ITEMS} items in {N_BATCHES} micro-batches"
    # ceil(10 / k): the tail is a step
    assert rows["optimizer steps per epoch"] == "10 at k = 1, 5 at k = 2, 4 at k = 3"
    assert rows["seed"] == str(SEED) and rows["norm layer (CNN section)"] == "batch"


def test_the_loop_table_shows_each_cells_worst_step(result, summary):
    table = result.loop_table()
    rows = {(r[0], int(r[1])): r for r in table.rows}
    for c in summary["loops"]:
        row = rows[(c["loop"], c["k"])]
        assert row[2] == fmt_error(max(c["rel_errors"])) and row[5] == f"{c['steps']}/{c['steps']}"
        assert row[6] == f"{N_ITEMS}/{N_ITEMS}" and row[7] == c["verdict"]


# --- figures: their data through matplotlib's objects, and their alt text ---------------------------


def _lines(ax):
    return {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_the_error_figure_plots_each_loops_worst_step_by_k(result, summary):
    fig = report.plot_errors(result)
    (ax,) = fig.axes
    lines = _lines(ax)
    assert list(lines) == result.loops
    cells = _cells(summary)
    for loop, line in lines.items():
        assert list(line.get_xdata()) == list(KS)
        assert list(line.get_ydata()) == [max(report.ZERO, max(cells[(loop, k)]["rel_errors"])) for k in KS]
    (band,) = [p for p in ax.patches if p.get_label().startswith("exact: within float32 rounding")]
    # the band ends at the float32 bound
    assert band.get_y() + band.get_height() == pytest.approx(FLOAT32_RTOL)
    alt = report.alt_errors(result)
    naive = [max(cells[("naive", k)]["rel_errors"]) for k in KS]
    assert naive[0] <= FLOAT32_RTOL  # k = 1: one micro-batch per window, nothing to divide
    k1 = "0" if naive[0] == 0 else f"{naive[0]:.2g}"  # verify's in-place rounding, or a bit-exact 0
    assert f"naive: {k1} at k = 1, {naive[1]:.2g} at k = 2, {naive[2]:.2g} at k = 3;" in alt
    assert "for k = 1, 2, 3 on mlp-digits with micro-batches of 12" in alt


def test_the_step_figure_defaults_to_the_largest_k(result, summary):
    cells = _cells(summary)
    fig = report.plot_steps(result)
    assert "at k = 3 " in fig.get_suptitle() and "4 optimizer steps" in fig.get_suptitle()
    errors, gaps = fig.axes
    ref = cells[("large_batch", 3)]["logged"]
    for loop in result.loops:
        c = cells[(loop, 3)]
        assert list(_lines(errors)[loop].get_xdata()) == [1, 2, 3, 4]
        assert list(_lines(errors)[loop].get_ydata()) == [max(report.ZERO, e) for e in c["rel_errors"]]
        # the right panel: each loop's logged loss minus the large-batch run's (0 for the large batch itself)
        assert list(_lines(gaps)[loop].get_ydata()) == [a - b for a, b in zip(c["logged"], ref)]
    assert [t.get_text() for t in errors.get_xticklabels()] == ["1", "2", "3", "4\ntail: 1 of 3"]
    alt = report.alt_steps(result)
    assert alt.startswith(
        "Two line charts over the 4 optimizer steps at k = 3 (the last window holds 1 of 3 micro-batches)"
    )
    assert "naive: 2, 2, 2, 0;" in alt


def test_the_step_figure_at_a_k_with_full_windows_marks_no_tail(result):
    fig = report.plot_steps(result, 2)
    assert "at k = 2 " in fig.get_suptitle()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "3", "4", "5"]
    assert "at k = 2 (the last window holds 2 of 2 micro-batches)" in report.alt_steps(result, 2)


def test_the_memory_and_norm_figure_plots_both_sides(result, summary):
    fig = report.plot_memory_and_norm(result)
    memory, norm = fig.axes
    mem = {int(k): v for k, v in summary["memory"].items()}
    lines = _lines(memory)
    assert list(lines["one large batch of k micro-batches"].get_ydata()) == [
        mem[k]["large_batch_bytes"] / 1024 for k in KS
    ]
    assert list(lines["one micro-batch (accumulation)"].get_ydata()) == [
        mem[k]["micro_batch_bytes"] / 1024 for k in KS
    ]
    (ragged,) = _lines(norm).values()
    assert list(ragged.get_ydata()) == [max(report.ZERO, e) for e in summary["norm_max_rel_error"].values()]
    alt = report.alt_memory_and_norm(result)
    big = mem[3]["large_batch_bytes"] / 1024
    assert f"k = 3: {mem[3]['micro_batch_bytes'] / 1024:.1f} against {big:.1f} KiB" in alt


# --- loops that go wrong: what the report then says ------------------------------------------------


@pytest.fixture(scope="module")
def wrong_loops():
    """The report with two reference loops swapped for wrong ones in the registry (k = 1):
    a naive loop that forgets the last micro-batch, and an amp loop that doubles every gradient."""
    naive, amp = ALL["naive"], ALL["amp"]

    def forgets_the_last(model, optimizer, loader, item_losses, **kw):
        def all_but_last():
            n = len(loader)
            for i, batch in enumerate(loader):  # the last one is drawn, after the last step, and never used
                if i < n - 1:
                    yield batch

        return naive(model, optimizer, all_but_last(), item_losses, **kw)

    def doubled(model, optimizer, loader, item_losses, **kw):
        return amp(model, optimizer, loader, lambda m, b: 2 * item_losses(m, b), **kw)

    # their registry names: their contracts still apply
    forgets_the_last.__name__, doubled.__name__ = "naive", "amp"
    with pytest.MonkeyPatch.context() as mp:
        for name, loop in (("naive", forgets_the_last), ("amp", doubled)):
            mp.setitem(LOOPS, name, loop)
            mp.setitem(ALL, name, loop)
        return report.run(
            task="mlp-digits",
            accum_steps=[1],
            batch_size=BATCH,
            norm="group",
            precision="bfloat16",
            device="cpu",
        )


def test_a_loop_that_drops_a_micro_batch_shows_the_missing_step_and_items(wrong_loops):
    cell = wrong_loops.cells[("naive", 1)]
    last = N_ITEMS - BATCH * (N_BATCHES - 1)  # 2 items in the last micro-batch
    assert (cell.steps, cell.expected_steps, cell.items_used, cell.items) == (
        N_BATCHES - 1,
        N_BATCHES,
        N_ITEMS - last,
        N_ITEMS,
    )
    row = next(r for r in wrong_loops.loop_table().rows if r[0] == "naive")
    assert (row[5], row[6]) == (f"{N_BATCHES - 1}/{N_BATCHES}", f"{N_ITEMS - last}/{N_ITEMS}")
    assert f"Items that reached no optimizer step: naive at k = 1: {last}." in wrong_loops.findings()
    assert f"{N_ITEMS - last}/{N_ITEMS} items stepped" in next(
        f for f in wrong_loops.findings() if f.startswith("naive: ")
    )


def test_a_wrong_low_precision_loop_is_not_exact_in_the_report(wrong_loops):
    """The doubled amp loop: the report's verdict is verify's (against the bf16 replay, where the
    doubled gradient is off by exactly 1), never "ok" by default: verify names it, c = 2."""
    cell = wrong_loops.cells[("amp (bfloat16)", 1)]
    assert cell.verdict == "misscaled"
    assert len(cell.ref_errors) == cell.steps == N_BATCHES
    assert all(abs(e - 1) <= BF16_RTOL for e in cell.ref_errors)
    assert wrong_loops.cells[("ragged", 1)].verdict == "ok"  # the others are judged as before


# --- titles that say what the numbers say ------------------------------------------------------------


@pytest.fixture(scope="module")
def group_norm(result):
    """The same report with group norm: its norm section run as ``run`` runs it (the exact loop on the CNN at
    every k, each step against the oracle); the loop section, which does not depend on the norm, is kept."""
    from dataclasses import replace

    from accumlib import ragged
    from accumlib.harness import trace_loop

    cnn = report.cnn_task("group", SEED)
    errors = {
        k: max(
            c.rel_error
            for c in trace_loop(
                ragged, cnn, accum_steps=k, batch_size=BATCH, seed=SEED, device="cpu"
            ).comparisons
        )
        for k in KS
    }
    return replace(result, norm="group", norm_errors=errors)


def test_the_norm_title_says_what_accumulation_cannot_fix_only_where_the_numbers_say_so(result, group_norm):
    # batch norm: the exact loop misses the large batch at every k >= 2, far above float32 rounding
    assert [k for k, e in result.norm_errors.items() if e > FLOAT32_RTOL] == [2, 3] == result.norm_inexact_ks
    m, big = result.memory[3]
    batch = report.title_memory_and_norm(result)
    assert batch == (
        f"What accumulation saves: {big / m:.1f}x less activation memory at k = 3,\n"
        "and what it cannot fix: batch norm, off at k = 2, 3"
    )
    # group norm normalizes each sample alone: exact at every k, and the title says so (it once said
    # "cannot fix")
    assert max(group_norm.norm_errors.values()) <= FLOAT32_RTOL and group_norm.norm_inexact_ks == []
    group = report.title_memory_and_norm(group_norm)
    assert group.endswith("and what it keeps exact: group norm, at every k") and "cannot fix" not in group
    fig = report.plot_memory_and_norm(group_norm)
    assert (
        fig.get_suptitle() == group
        and fig.axes[1].get_title() == "ragged, SmallCNN, group norm:\nexact at every k"
    )
    assert report.alt_memory_and_norm(group_norm).startswith(group.replace(",\n", ", ") + ". ")
    assert report.plot_memory_and_norm(result).axes[1].get_title() == (
        f"ragged, SmallCNN, batch norm:\noff by up to {max(result.norm_errors.values()):.2g}"
    )
    # the finding reads the same rule
    (finding,) = [f for f in group_norm.findings() if f.startswith("SmallCNN with group norm")]
    assert finding.endswith("(exact: per-sample normalization does not see the micro-batching).")


def test_the_norm_title_follows_the_numbers_not_the_layers_name(result, group_norm):
    """The same titles with the two norm sections' numbers swapped: the claim moves with the numbers."""
    from dataclasses import replace

    swapped = replace(result, norm_errors=group_norm.norm_errors)  # "batch" with exact numbers
    assert report.title_memory_and_norm(swapped).endswith("and what it keeps exact: batch norm, at every k")
    swapped = replace(group_norm, norm_errors=result.norm_errors)
    assert report.title_memory_and_norm(swapped).endswith(
        "and what it cannot fix: group norm, off at k = 2, 3"
    )
    assert report.title_memory_and_norm(
        replace(result, norm="none", norm_errors=group_norm.norm_errors)
    ).endswith("and what it keeps exact: no norm layer, at every k")


def test_the_error_title_names_the_loops_exact_at_every_k(result, summary, wrong_loops):
    exact = [
        loop
        for loop in result.loops
        # verify passed it against float32 at every k (an autocast loop's ok is against its own replay)
        if all(
            c["verdict"] == "ok" and "replay_rel_errors" not in c
            for c in summary["loops"]
            if c["loop"] == loop
        )
    ]
    assert exact == result.exact_loops == ["ragged", "large_batch"]  # naive and normalized miss at k >= 2
    title = report.title_errors(result)
    assert title == (
        "Each loop's worst step against the large batch (mlp-digits),\nexact at every k: ragged, large_batch"
    )
    assert report.plot_errors(result).get_suptitle() == title
    assert report.alt_errors(result).startswith(title.replace(",\n", ", ") + ". Line chart")
    # at k = 1 alone, normalized is exact too; the doubled amp loop is not, nor the naive loop that forgets
    # the last micro-batch, although each step it takes is exact: verify names it, 2 items reach no step
    assert wrong_loops.cells[("naive", 1)].verdict == "tail-dropped"
    assert report.title_errors(wrong_loops).endswith("exact at every k: normalized, ragged, large_batch")


def test_the_findings_show_as_a_list(result):
    findings = result.findings_list()
    assert findings.lines == tuple(result.findings())
    assert str(findings) == "\n".join(f"- {line}" for line in result.findings())
    page = findings._repr_html_()
    assert page.count("<li>") == len(result.findings()) and page.startswith("<ul>")
    assert "<= 1e-04" not in page and "&lt;= 1e-04" in page  # escaped: "<=" in a finding is text, not a tag
