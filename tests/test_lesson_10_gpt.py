"""Lesson 10's small GPT: each run's gradient against the oracle, and what the runs show over many steps.

The oracle is the gradient of the window's mean token loss at the window's starting parameters, in
float64 over the whole window as one batch (right padding never changes a causal model's real logits).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from accumlib import compare, true_gradient
from accumlib.data import TEXT_LENGTHS, TextLines, pad_collate
from accumlib.tasks import token_losses
from accumlib.tolerances import FLOAT32_RTOL
from accumlib_course.lessons import your_own_project as yp

ROOT = Path(__file__).resolve().parents[1]
gpt = pytest.importorskip("accumlib_course.lessons._your_own_project_gpt")  # the preset table and the runs


def _window_grad(loop: str, b: int, k: int, window: list[int], lines: TextLines):
    run = gpt._Run(loop, b, k, gpt.PRESETS["tiny"], seed=0)
    run.accumulate(lines, window)
    oracle = true_gradient(
        run.model, [pad_collate([lines[i] for i in window])], token_losses, dtype=torch.float64
    )
    grads = {n: p.grad for n, p in run.model.named_parameters()}
    return compare(grads, oracle), run


@pytest.fixture(scope="module")
def lines():
    return TextLines(gpt.PRESETS["tiny"].n_sequences, seed=0)


@pytest.mark.parametrize("b, k", [(32, 1), (8, 4), (4, 8)])
def test_the_correct_loop_is_the_oracle(lines, b, k):
    window = list(range(32))
    cmp, _ = _window_grad("sum / N", b, k, window, lines)
    assert cmp.rel_error <= FLOAT32_RTOL  # float32 sums against a float64 oracle


def test_the_short_last_window_is_the_oracle_too(lines):
    window = list(range(128, 136))  # the epoch's tail: 8 sentences, 2 micro-batches of 4 where k = 8
    cmp, _ = _window_grad("sum / N", 4, 8, window, lines)
    assert cmp.rel_error <= FLOAT32_RTOL


def test_each_bug_is_off_the_oracle_by_what_it_does(lines):
    window = list(range(32))
    counts = [
        int((pad_collate([lines[i] for i in window[j : j + 4]])[1] != -100).sum()) for j in range(0, 32, 4)
    ]
    n = sum(counts)
    # counted before the shift: every share divided by N + S, one factor N / (N + S) on the whole gradient
    before, _ = _window_grad("counted before the shift", 4, 8, window, lines)
    assert before.norm_ratio == pytest.approx(n / (n + 32), rel=1e-5)
    assert before.cosine == pytest.approx(1.0, abs=1e-6)
    # naive sum: each micro-batch's mean summed = k x (mean / k), both off the oracle's direction
    naive, naive_run = _window_grad("naive sum", 4, 8, window, lines)
    mean_k, mean_run = _window_grad("mean / k", 4, 8, window, lines)
    # token weights 1 / (k n_j), not 1 / N: here n_j from 146 to 207 tokens, rel error 1.6e-2 measured
    assert mean_k.rel_error > 100 * FLOAT32_RTOL
    for (_, p), (_, q) in zip(naive_run.model.named_parameters(), mean_run.model.named_parameters()):
        torch.testing.assert_close(p.grad, 8 * q.grad, rtol=1e-5, atol=1e-9)
    assert naive.norm_ratio > 7  # about k
    # the scheduler's slip changes the learning rate, not the gradient
    sched, run = _window_grad("scheduler per micro-batch", 4, 8, window, lines)
    assert sched.rel_error <= FLOAT32_RTOL
    assert run.scheduler.last_epoch == 8  # stepped 8 times in one window, where 1 was planned
    assert min(counts) < max(counts)  # the micro-batches hold different token counts: why mean / k is off


@pytest.fixture(scope="module")
def tiny():
    return yp.small_gpt("tiny", seed=0)


def test_correct_runs_follow_the_large_batch_and_every_bug_leaves_it(tiny):
    p = gpt.PRESETS["tiny"]
    assert [(r.loop, r.batch_size, r.accum_steps) for r in tiny.runs] == list(gpt.RUNS)
    assert all(len(r.losses) == len(r.distances) == p.steps for r in tiny.runs)
    assert tiny.reference.distances == (0.0,) * p.steps
    correct = [r for r in tiny.runs[1:] if r.correct]
    bugs = [r for r in tiny.runs[1:] if not r.correct]
    assert len(correct) == 2 and len(bugs) == 4
    # measured: correct runs 1.5e-7 loss gap and <= 6e-6 distance; bugs' largest distance 3.3e-3 (counted
    # before the shift) to 1.5 (the scheduler): each bound below sits at least 10x from the measured figure
    worst_correct = max(max(r.distances) for r in correct)
    assert worst_correct < 1e-4
    assert all(tiny.loss_gap(r) <= 10 * FLOAT32_RTOL for r in correct)
    for r in bugs:
        assert max(r.distances) > 30 * worst_correct, r.label
    assert tiny.find("scheduler per micro-batch").losses[-1] > tiny.reference.losses[-1] + 0.1
    assert tiny.reference.losses[-1] < tiny.reference.losses[0] - 0.5  # the model learns
    rows = tiny.rows()
    assert len(rows) == len(gpt.RUNS) - 1 and rows[0][0] == "8 x 4, sum / N"


def test_figure_names_every_run(tiny):
    fig = yp.plot_gpt(tiny)
    left, right = fig.axes
    labels = [line.get_label() for line in left.get_lines()]
    assert labels == ["32 x 1 (the large batch)"] + [r.label for r in tiny.runs[1:]]
    assert right.get_yscale() == "log" and len(right.get_lines()) == len(tiny.runs)  # the runs and the bound


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(preset="huge"), "preset must be one of 'small', 'tiny' (got 'huge')"),
        (dict(preset="tiny", seed=-1), "seed must be an integer >= 0"),
    ],
)
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        yp.small_gpt(**kwargs)


@pytest.fixture(scope="module")
def recorded():
    return yp.small_gpt("small", recorded=True)


def test_the_recorded_small_run_is_this_codes(recorded):
    """The committed run (minutes to make) against a fresh computation of its first steps (seconds)."""
    assert recorded.preset == gpt.PRESETS["small"] and recorded.recorded.startswith("recorded ")
    assert [(r.loop, r.batch_size, r.accum_steps) for r in recorded.runs] == list(gpt.RUNS)
    assert all(len(r.losses) == len(r.distances) == recorded.preset.steps for r in recorded.runs)
    steps = 3  # inside the warm-up: the schedule of the first steps does not depend on the run's length
    fresh = gpt._train(replace(gpt.PRESETS["small"], steps=steps), "small", 0)
    assert fresh.n_parameters == recorded.n_parameters
    for new, old in zip(fresh.runs, recorded.runs):
        # the same sums in another order on another CPU: float32 rounding, far below the bugs' effects
        assert new.losses == pytest.approx(old.losses[:steps], rel=10 * FLOAT32_RTOL), new.label
        for a, b in zip(new.distances, old.distances):
            if max(a, b) <= FLOAT32_RTOL:  # rounding against rounding: both must stay at that level
                continue
            assert a == pytest.approx(b, rel=1e-2), new.label  # a bug's distance, set by the bug


def test_a_stale_record_is_refused(recorded, tmp_path):
    data = json.loads(gpt.RECORDED["small"].read_text())
    data["preset"]["steps"] = 299
    stale = tmp_path / "small_gpt.json"
    stale.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="must be a run of this code's 'small' preset at seed 0"):
        gpt.load(stale)
    with pytest.raises(ValueError, match=r"preset must be one of 'small' with recorded=True"):
        yp.small_gpt("tiny", recorded=True)


def test_the_notebook_shows_the_recorded_run(recorded):
    """The notebook's larger setting is the recorded run, read in an ordinary cell (nbval runs it)."""
    nb = json.loads((ROOT / "notebooks" / "10_your_own_project.ipynb").read_text())
    cells = [
        c for c in nb["cells"] if c["cell_type"] == "code" and 'small_gpt("small"' in "".join(c["source"])
    ]
    assert len(cells) == 1 and "recorded=True" in "".join(cells[0]["source"])
    assert not {"nbval-skip", "nbval-ignore-output"} & set(cells[0]["metadata"].get("tags", []))
    text = "".join(
        "".join(o.get("data", {}).get("text/plain", o.get("text", ""))) for o in cells[0]["outputs"]
    )
    assert recorded.summary() in text and recorded.recorded in text


def test_the_notebooks_prose_states_the_presets(tiny):
    """Counts in the lesson's prose are the presets' (the tiny model's size, the small run's length)."""
    nb = json.loads((ROOT / "notebooks" / "10_your_own_project.ipynb").read_text())
    prose = " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    small, tiny_p = gpt.PRESETS["small"], gpt.PRESETS["tiny"]
    assert f"a {tiny.n_parameters:,}-parameter GPT, {tiny_p.steps} steps" in prose
    assert f"{small.n_layers} layers, {small.d_model} wide, {small.steps} optimizer steps over" in prose
    assert f"over {small.n_sequences:,} sentences" in prose
    assert f"Windows hold {gpt.WINDOW} sentences" in prose
    low, high = TEXT_LENGTHS
    assert f"{low} to {high} characters" in prose
    lengths = [len(s) for s in TextLines(2_000)]
    assert low <= min(lengths) and max(lengths) <= high and max(lengths) - min(lengths) > 50
