"""The papermill report: run it with small parameters, then check what it wrote and what it shows.

The report writes its numbers as JSON to ``results_path``; the test reads that file (not the
function's return value) and converts the executed notebook to HTML as ``make report`` does,
so it checks what a reader of the report gets: tables and figures with alt text, no raw JSON.
"""

import ast
import json
import math
import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from accumlib.tolerances import FLOAT32_RTOL
from accumlib import report
from accumlib.lessons import _style

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "report.ipynb"
# naive scales a full window of k equal micro-batches by k, so its relative error is k - 1 and its
# norm ratio k; a smaller last micro-batch moves the ratio a little, so 10% separates k from k +- 1
RATIO_TOL = 0.1
# 110 digits in micro-batches of 4: 28 micro-batches, the last holding 2 items, so normalized
# (which weights every micro-batch 1/k) misweights the last window even where k divides 28
PARAMS = dict(task="mlp-digits", accum_steps="1 2 4", batch_size=4, norm="batch", precision="bfloat16", device="cpu", seed=0)
N_BATCHES = 28


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The report run by papermill as make report runs it: (notebook, HTML body, JSON results)."""
    papermill = pytest.importorskip("papermill")
    from nbconvert import HTMLExporter

    folder = tmp_path_factory.mktemp("report")
    out, results = folder / "report.ipynb", folder / "report.json"
    os.environ.setdefault("MPLBACKEND", "Agg")
    papermill.execute_notebook(str(NOTEBOOK), str(out), kernel_name="python3", progress_bar=False,
                               parameters=dict(PARAMS, results_path=str(results)))
    body, _ = HTMLExporter().from_filename(str(out))
    return nbformat.read(out, as_version=4), body, json.loads(results.read_text())


@pytest.fixture(scope="module")
def result():
    return report.run(**PARAMS)


def test_report_records_the_parameters_it_was_given(executed):
    _, _, s = executed
    assert (s["task"], s["accum_steps"], s["batch_size"], s["norm"], s["precision"], s["device"], s["seed"]) == (
        "mlp-digits", [1, 2, 4], 4, "batch", "bfloat16", "cpu", 0
    )
    assert (s["n_items"], s["n_batches"], s["min_steps"]) == (110, N_BATCHES, 3)


def test_report_results_are_the_known_verdicts(executed):
    _, _, s = executed
    cells = {(c["loop"], c["k"]): c for c in s["loops"]}
    assert set(cells) == {(loop, k) for loop in ("naive", "normalized", "ragged", "large_batch", "amp (bfloat16)") for k in (1, 2, 4)}
    for c in cells.values():
        assert c["steps"] == c["expected_steps"] == math.ceil(N_BATCHES / c["k"]) == len(c["rel_errors"]) == len(c["logged"])
        assert c["steps"] >= report.MIN_STEPS
        assert c["items_used"] == c["items"] == 110  # every reference loop steps its tail
        assert c["max_rel_error"] == max(c["rel_errors"])
    for k in (1, 2, 4):
        assert cells[("ragged", k)]["verdict"] == "exact" and max(cells[("ragged", k)]["rel_errors"]) <= FLOAT32_RTOL
        assert cells[("large_batch", k)]["verdict"] == "exact"
        # judged as verify judges it: against a bfloat16 replay of each window (the float32 figure is bf16 rounding)
        amp = cells[("amp (bfloat16)", k)]
        assert amp["verdict"] == "close (bfloat16)" and len(amp["replay_rel_errors"]) == amp["steps"]
        assert max(amp["replay_rel_errors"]) < max(amp["rel_errors"])
    assert cells[("naive", 1)]["verdict"] == "exact"
    for k in (2, 4):
        naive = cells[("naive", k)]
        assert naive["verdict"] == "off by ~k"
        assert abs(naive["max_norm_ratio"] - k) < RATIO_TOL * k
        # every step but the last has k equal micro-batches: the naive gradient is k g*, error k - 1
        assert all(abs(e - (k - 1)) < RATIO_TOL * k for e in naive["rel_errors"][:-1])
        normalized = cells[("normalized", k)]
        assert normalized["verdict"] == "not exact"
        # exact on the full windows, wrong only where the 2-item micro-batch sits: the last step
        assert max(normalized["rel_errors"][:-1]) <= FLOAT32_RTOL < normalized["rel_errors"][-1]
    # batch norm: exact at k = 1 (one micro-batch is the large batch), never after
    norm = s["norm_max_rel_error"]
    assert norm["1"] <= FLOAT32_RTOL and norm["2"] > 1e-3 and norm["4"] > 1e-3
    mem = s["memory"]
    for k in (1, 2, 4):
        assert mem[str(k)]["large_batch_bytes"] == pytest.approx(k * mem[str(k)]["micro_batch_bytes"], rel=0.01)
    assert any(f.startswith("naive: exact at k = 1; off by ~k at k = 2, 4") for f in s["findings"])


def test_report_shows_tables_findings_and_figures_with_alt_text(executed):
    nb, body, _ = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html_outputs = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert sum("<table>" in h for h in html_outputs) >= 4  # settings, loops, memory, norm
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "naive: exact at k = 1; off by ~k at k = 2, 4" in text
    assert "SmallCNN with batch norm" in text and "not exact" in text
    imgs = re.findall(r"<img\b[^>]*>", body)
    assert len(imgs) == 3 and len(re.findall(r"src=\"data:image/png;base64,", body)) == 3  # every figure is an <img> ...
    for img in imgs:  # ... with alt text that states the figure's numbers
        alt = re.search(r'\balt="([^"]*)"', img)
        assert alt and len(alt.group(1)) > 80 and re.search(r"\d", alt.group(1)), img[:200]


def test_report_html_carries_no_raw_json(executed):
    nb, body, _ = executed
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "application/json" in o.get("data", {})]
    for key in ('"rel_errors"', '"max_rel_error"', '"norm_max_rel_error"', "rel_errors"):
        assert key not in body


def _line_styles(axes):
    return [ln for ax in axes for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]


@pytest.mark.parametrize("plot", [report.plot_errors, report.plot_steps, report.plot_memory_and_norm])
def test_figures_are_styled_and_show_the_effect_on_their_axes(result, plot):
    from matplotlib.colors import to_hex

    fig = plot(result)
    _style.png(fig)  # draw it: tick labels and offsets exist only after a draw
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    assert fig.get_suptitle() or all(ax.get_title() for ax in fig.axes)
    for ax in fig.axes:
        # no offset or multiplier text: the tick labels themselves carry the difference
        assert ax.yaxis.get_offset_text().get_text() == "" and ax.xaxis.get_offset_text().get_text() == ""
        assert ax.get_xlabel() and ax.get_ylabel()
    lines = _line_styles(fig.axes)
    assert lines and {to_hex(ln.get_color()) for ln in lines} <= {c.lower() for c in _style.PALETTE}
    for ax in fig.axes:  # no contrast by colour alone: the loops of one axes differ in marker or line style
        styles = [(ln.get_marker(), str(ln.get_linestyle())) for ln in _line_styles([ax])]
        assert len(set(styles)) == len(styles)


def test_log_axes_draw_an_exact_zero_on_its_own_tick(result):
    fig = report.plot_errors(result)
    ax = fig.axes[0]
    large_batch = next(ln for ln in ax.get_lines() if ln.get_label() == "large_batch")
    assert list(large_batch.get_ydata()) == [report.ZERO] * len(result.ks)  # exactly 0 at every k
    labels = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    assert labels["0 (bit-exact)"] == report.ZERO


def test_make_report_passes_the_parameters():
    dry = subprocess.run(
        ["make", "-n", "report", "ACCUM=1 2 4 8", "NORM=group", "TASK=lm-tokens"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "papermill notebooks/report.ipynb reports/report.ipynb" in dry
    assert '-p accum_steps "1 2 4 8"' in dry and '-p norm "group"' in dry and '-p task "lm-tokens"' in dry
    assert "-p results_path reports/report.json" in dry
    assert "nbconvert --to html reports/report.ipynb" in dry


def _makefile_defaults() -> dict:
    text = (REPO / "Makefile").read_text()
    make = dict(re.findall(r"^([A-Z]+)\s*\?=\s*(.*)$", text, flags=re.M))
    return dict(task=make["TASK"], accum_steps=report.parse_accum(make["ACCUM"]), batch_size=int(make["BATCH"]), norm=make["NORM"],
                precision=make["PRECISION"], device=make["DEVICE"], seed=int(make["SEED"]))


def _notebook_defaults() -> dict:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    values = {t.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body for t in node.targets}
    return dict(values, accum_steps=report.parse_accum(values["accum_steps"]))


def test_defaults_agree_in_run_the_notebook_and_the_makefile():
    defaults = dict(report.DEFAULTS, accum_steps=report.parse_accum(report.DEFAULTS["accum_steps"]))
    assert _notebook_defaults() == defaults
    make = _makefile_defaults()
    assert make == {name: defaults[name] for name in make}


@pytest.mark.parametrize("task", report.TASK_NAMES)
@pytest.mark.parametrize("norm", report.NORMS)
def test_defaults_give_every_k_at_least_three_steps_on_every_task(task, norm):
    p = report.check_parameters(**dict(report.DEFAULTS, task=task, norm=norm))
    n_batches = len(p.task.loader(p.batch_size))
    assert min(math.ceil(n_batches / k) for k in p.ks) >= report.MIN_STEPS


@pytest.mark.parametrize("task, accum_steps, batch_size, short", [
    ("mlp-digits", "1 2 4 8", 16, "7 micro-batches, so k = 4, 8 give 2, 1 steps"),  # the old defaults: one step at k = 8
    ("mlp-digits", "1 2 4 8", 7, "16 micro-batches, so k = 8 gives 2 steps"),  # 110 / 7: one micro-batch short of 17
    ("lm-tokens", "1 2 4 8", 4, "16 micro-batches, so k = 8 gives 2 steps"),
    ("cnn", [2, 8], 8, "128 examples, which batch_size=8 splits into 16 micro-batches, so k = 8 gives 2 steps"),
])
def test_refuses_k_with_fewer_than_three_steps_and_says_what_works(task, accum_steps, batch_size, short):
    with pytest.raises(ValueError, match="accum_steps and batch_size must give every k at least 3 optimizer steps") as err:
        report.check_parameters(task=task, accum_steps=accum_steps, batch_size=batch_size)
    message = str(err.value)
    assert short in message and f"batch_size={batch_size}" in message
    # the fixes it names do work
    k_max = int(re.search(r"use k <= (\d+)", message).group(1))
    b_max = int(re.search(r"batch_size <= (\d+)", message).group(1))
    report.check_parameters(task=task, accum_steps=[k_max], batch_size=batch_size)
    report.check_parameters(task=task, accum_steps=accum_steps, batch_size=b_max)
    with pytest.raises(ValueError, match="at least 3 optimizer steps"):
        report.check_parameters(task=task, accum_steps=[k_max + 1], batch_size=batch_size)
    with pytest.raises(ValueError, match="at least 3 optimizer steps"):
        report.check_parameters(task=task, accum_steps=accum_steps, batch_size=b_max + 1)


def test_the_norm_section_is_held_to_the_same_rule(monkeypatch):
    monkeypatch.setattr(report.params, "N_IMAGES", 16)  # 16 images in micro-batches of 3: 6 micro-batches, 2 steps at k = 4
    with pytest.raises(ValueError, match="the norm section's 'cnn-group' has 16 examples.*so k = 4 gives 2 steps"):
        report.check_parameters(task="lm-tokens", accum_steps=[1, 2, 4], batch_size=3)
    report.check_parameters(task="lm-tokens", accum_steps=[1, 2], batch_size=3)


@pytest.mark.parametrize("value, expected", [([1, 2], (1, 2)), ("1 2 4 8", (1, 2, 4, 8)), ("2,4", (2, 4)), ((3,), (3,)),
                                             (4, (4,)), ("4", (4,)), ("8 2 2", (2, 8))])
def test_parse_accum(value, expected):
    assert report.parse_accum(value) == expected


@pytest.mark.parametrize("value", ["", "1 x", [0, 2], "-1", 0, [], [2.5], "2.5", 2.5, True, None, [True]])
def test_parse_accum_refuses_bad_values(value):
    # the value is named as given: [2.5] once ran k = 2 silently (issue 13)
    with pytest.raises(ValueError, match=r"accum_steps must be integers >= 1.*\(got " + re.escape(repr(value)) + r"\)"):
        report.parse_accum(value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(task="resnet"), "task must be one of 'cnn', "),
    (dict(accum_steps="1 x"), "accum_steps must be integers >= 1"),
    (dict(accum_steps=[0, 2]), "accum_steps must be integers >= 1"),
    (dict(batch_size=0), r"batch_size must be an integer >= 1 \(got 0\)"),
    (dict(batch_size=2.5), r"batch_size must be an integer >= 1 \(got 2.5"),
    (dict(batch_size=True), r"batch_size must be an integer >= 1 \(got True"),
    (dict(norm="layer"), r"norm must be one of 'batch', 'group', 'none' \(got 'layer'\)"),  # checked even when task is not 'cnn'
    (dict(precision="float8"), r"precision must be one of 'float32', 'bfloat16', 'float16' \(got 'float8'\)"),
    (dict(device="tpu"), r"device must be .*\(got 'tpu'\)"),
    (dict(seed=-1), r"seed must be an integer >= 0 \(got -1\)"),
    (dict(seed="0"), r"seed must be an integer >= 0 \(got '0'"),
    (dict(seed="abc"), r"seed must be an integer >= 0 \(got 'abc'"),  # once failed inside torch (issue 13)
    (dict(accum_steps=[2.5]), r"accum_steps must be integers >= 1.*\(got \[2.5\]\)"),
    (dict(results_path="report.txt"), r"results_path must end in .json, or be '' to write no file \(got 'report.txt'\)"),
    (dict(results_path="/no/such/folder/report.json"), r"results_path must be in an existing folder \(got '/no/such/folder/report.json'"),
    (dict(results_path=3), r"results_path must be a path ending in .json, or '' to write no file \(got 3\)"),
])
def test_run_refuses_bad_parameters_before_any_work(monkeypatch, kwargs, message):
    def no_training(*args, **kw):
        raise AssertionError("run trained before checking its parameters")

    monkeypatch.setattr(report.compute, "trace_loop", no_training)
    with pytest.raises(ValueError, match=message):
        report.run(**kwargs)


def test_run_writes_no_file_without_results_path(result, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert result.summary()["accum_steps"] == [1, 2, 4]
    report.run(**dict(PARAMS, accum_steps=[1]))
    assert list(tmp_path.iterdir()) == []
