"""Lesson 10, what accumulation costs: the tiny GPT measured once (one process, then two gloo ranks).

Timings depend on the machine and its load, so no test compares them; the tests check what is exact
anywhere: activation bytes and positions per k, the gradient's bytes, the all-reduce calls and bytes per
window, FSDP's figures, the table, the figure, that two real processes ran, and every refused argument.
"""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

from accumlib.data import TextLines
from accumlib.models import GPT
from accumlib_course import _style
from accumlib_course.lessons import _your_own_project_cost as cost_part
from accumlib_course.lessons._your_own_project_gpt import PRESETS, WINDOW

launch_module = importlib.import_module("accumlib.distributed.launch")  # the package re-exports the function

KS = (1, 2, 4, 8)
# One spawned run of 2 ranks: ~25 s here (each rank imports torch, DDP and AdamW's torch._dynamo with
# no bytecode cache); 180 s only bounds a hang on loaded cores.
SPAWN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def cost():
    return cost_part.accumulation_cost("tiny", ks=KS, repeats=1, timeout=SPAWN_TIMEOUT_S)


def _tiny_parameters() -> int:
    p = PRESETS["tiny"]
    return sum(q.numel() for q in GPT(TextLines(1).vocab, p.n_layers, p.d_model, p.n_heads).parameters())


# --- one process: the cost of k ------------------------------------------------------------------------


def test_every_k_is_measured_on_a_window_of_32_sentences(cost):
    assert [c.k for c in cost.costs] == list(KS)
    assert all(c.micro_batch * c.k == WINDOW for c in cost.costs)
    # a time was taken (its size is the machine's business)
    assert all(math.isfinite(c.seconds) and c.seconds > 0 for c in cost.costs)
    assert all(c.seconds_per_sentence == c.seconds / WINDOW for c in cost.costs)
    assert cost.threads == 1 and cost.preset_name == "tiny"


def test_activation_memory_falls_as_one_over_k(cost):
    by_k = {c.k: c.activation_bytes for c in cost.costs}
    assert cost.large_activation_bytes == by_k[1]
    assert [by_k[k] for k in KS] == sorted(by_k.values(), reverse=True) and len(set(by_k.values())) == 4
    # The window's peak micro-batch holds its longest sentence, so it pads to the large batch's length
    # and saves for 8 sentences what 32 x 1 saves for 32: 1/4, plus what does not grow with the batch
    # (the position ids). Measured 0.25005; below 0.35 leaves room for another attention kernel.
    assert 0.25 <= by_k[4] / by_k[1] <= 0.35


def test_positions_computed_are_each_micro_batch_padded_to_its_longest_sentence(cost):
    lines = TextLines(WINDOW, seed=0)
    for c in cost.costs:
        # pad_collate shifts the labels: a sentence of L characters gives L - 1 positions
        expected = sum(
            c.micro_batch * (max(len(lines[i]) for i in range(j, j + c.micro_batch)) - 1)
            for j in range(0, WINDOW, c.micro_batch)
        )
        assert c.positions == expected, c.k
    # the negative: smaller micro-batches pad less, so k = 8 computes fewer positions than 32 x 1
    assert cost.costs[-1].positions < cost.costs[0].positions


def test_the_gradient_is_one_copy_of_the_parameters_for_every_k(cost):
    assert cost.n_parameters == _tiny_parameters()
    assert cost.parameter_bytes == 4 * cost.n_parameters  # float32
    assert f"gradient {cost.parameter_bytes / 2**20:.2f} MiB for every k" in cost.table_k().caption


# --- two ranks: the cost of no_sync --------------------------------------------------------------------


def test_two_real_processes_ran(cost):
    assert cost.world_size == 2
    assert [rank for rank, _ in cost.ranks] == [0, 1]
    pids = {pid for _, pid in cost.ranks}
    assert len(pids) == 2 and os.getpid() not in pids


def test_no_sync_all_reduces_once_per_window_and_every_micro_batch_k_times(cost):
    no_sync, every = cost.sync("no_sync"), cost.sync("every micro-batch")
    # the tiny gradient fits DDP's first bucket (1 MiB): one bucket, one all-reduce per synchronised
    # backward; no_sync synchronises the window's last backward only, the other all k = 4
    assert cost.parameter_bytes < torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert (no_sync.calls, every.calls) == (1, cost_part.RANK_K) == (1, 4)
    # each round sends the whole gradient, once per window or once per micro-batch
    assert no_sync.bytes == cost.parameter_bytes
    assert every.bytes == cost_part.RANK_K * no_sync.bytes
    assert all(math.isfinite(s.seconds) and s.seconds > 0 for s in cost.syncs)


def test_fsdp_figures_are_the_parameter_bytes_and_a_world_size_th_of_them(cost):
    assert cost.fsdp_unsharded_bytes == cost.parameter_bytes
    assert cost.fsdp_sharded_bytes == cost.parameter_bytes / cost.world_size == cost.parameter_bytes / 2
    rows = {r[0]: r for r in cost.table_ranks().rows}
    mib = cost.parameter_bytes / 2**20
    assert rows["FSDP2, gradient sync off until the last (computed)"][-1] == f"{mib:.3f}"
    assert rows["FSDP2, reduce-scatter every micro-batch (computed)"][-1] == f"{mib / 2:.3f}"
    assert rows["DDP, no_sync"][2] == "1" and rows["DDP, every micro-batch"][2] == "4"


# --- what is shown ---------------------------------------------------------------------------------------


def test_the_tables_have_a_row_per_k_and_per_run(cost):
    k_table = cost.table_k()
    assert [r[0] for r in k_table.rows] == ["32 x 1", "16 x 2", "8 x 4", "4 x 8"]
    assert k_table.rows[0][4] == "1.000"  # the large batch against itself
    assert f"{_tiny_parameters():,} parameters" in k_table.caption
    assert len(cost.table_ranks().rows) == 4 and "2 gloo ranks" in cost.table_ranks().caption


def test_the_figure_is_readable_on_a_projector_and_its_alt_text_has_the_numbers(cost):
    fig = cost_part.plot_cost(cost)
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    png = _style.png(fig)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width <= 1024 and height <= 768, (width, height)
    for ax in fig.axes:  # integer ticks: the k measured, nothing between
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in KS]
        assert ax.get_legend() is None  # the legend sits below the panels, outside the data
    assert len(fig.legends) == 1
    renderer = fig.canvas.get_renderer()  # laid out by png() above
    legend = fig.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(ax.get_tightbbox(renderer)) for ax in fig.axes)  # labels included
    alt = cost_part.cost_alt_text(cost)
    assert f"{cost.parameter_bytes / 2**20:.2f} MiB for every k" in alt
    assert all(f"k = {c.k}: {c.seconds_per_sentence * 1e3:.2f} ms" in alt for c in cost.costs)


# --- refused before any work starts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(preset="huge"), r"preset must be one of 'small', 'tiny' \(got 'huge'\)"),
        (dict(ks=(1, 3)), r"ks must hold divisors of 32; .* \(got \(1, 3\)\)"),
        (dict(ks=(0,)), r"ks\[0\] must be an integer between 1 and 32; .* \(got 0\)"),
        (dict(ks=(64,)), r"ks\[0\] must be an integer between 1 and 32; .* \(got 64\)"),
        (dict(ks=()), r"ks must be a non-empty sequence of integers \(got \(\)\)"),
        (dict(world_size=1), r"world_size must be an integer between 2 and \d+; .* \(got 1\)"),
        (dict(world_size=2.0), r"world_size must be an integer .* \(got 2.0 of type float\)"),
        (dict(world_size=10**6), r"world_size must be an integer between 2 and \d+; .* \(got 1000000\)"),
        (dict(repeats=0), r"repeats must be an integer between 1 and 20 \(got 0\)"),
        (dict(seed=-1), r"seed must be an integer >= 0 \(got -1\)"),
        (dict(timeout=0), r"timeout must be a number > 0 \(got 0\)"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(monkeypatch, kwargs, message):
    def started(*args, **kw):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(cost_part, "_k_cost", started)
    monkeypatch.setattr(launch_module, "launch", started)
    with pytest.raises(ValueError, match=message):
        cost_part.accumulation_cost(**kwargs)


def test_a_run_past_its_timeout_fails_with_a_clear_error_and_leaves_the_threads_as_they_were():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the one-process part runs on one thread, then gives the caller's back
    try:
        with pytest.raises(
            RuntimeError,
            match=r"2-rank no_sync measurement \(tiny GPT, timeout=1.0 s\) failed: "
            r"TimeoutError: distributed run did not finish within timeout=1.0 s",
        ):
            cost_part.accumulation_cost("tiny", ks=(1,), repeats=1, timeout=1.0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
