"""The papermill report: ``make report`` run once with small parameters, then what it wrote and shows.

The fixture runs the real ``make report`` (papermill, then nbconvert) into a folder of its own and
reads what a person gets: the HTML page (outputs only: no code, no prompts, the parameters once, as
a table; figures with alt text whose opening sentence is the figure's title, computed from the
findings), the executed notebook, the JSON numbers and the command's stderr (no warning).
"""

import ast
import dataclasses
import html
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from accumlib import get_task
from accumlib.loops import CONTRACTS, LOOPS, Contract
from accumlib.tolerances import FLOAT32_RTOL
from accumlib_course import _style, report
from accumlib_course.report import figures

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "report.ipynb"
# naive scales a full window of k equal micro-batches by k, so its relative error is k - 1 and its
# norm ratio k; a smaller last micro-batch moves the ratio a little, so 10% separates k from k +- 1
RATIO_TOL = 0.1
# 110 digits in micro-batches of 4: 28 micro-batches, the last holding 2 items, so normalized
# (which weights every micro-batch 1/k) misweights the last window even where k divides 28
PARAMS = dict(
    task="mlp-digits",
    accum_steps="1 2 4",
    batch_size=4,
    norm="batch",
    precision="bfloat16",
    device="cpu",
    seed=0,
)
N_BATCHES = 28
# The report's row labels, read from the registry: a low-precision loop runs in the report's precision.
LABELS = [f"{n} ({PARAMS['precision']})" if CONTRACTS[n].low_precision else n for n in LOOPS]
MAKE_VARS = dict(
    TASK="mlp-digits", ACCUM="1 2 4", BATCH="4", NORM="batch", PRECISION="bfloat16", DEVICE="cpu", SEED="0"
)
PARAMETERS_CAPTION = "The report's parameters"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``make report`` as a person runs it, into a folder of its own: the executed notebook, the HTML
    page, the JSON numbers and the command's stderr. The venv's install stamp is taken as up to date
    (``-o``): the test runs the report, never a reinstall."""
    pytest.importorskip("papermill")
    folder = tmp_path_factory.mktemp("report")
    venv = Path(sys.prefix)
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-o",
            str(venv / ".installed-stamp"),
            "report",
            f"VENV={venv}",
            f"PY={sys.executable}",
            f"REPORT_DIR={folder}",
            *(f"{name}={value}" for name, value in MAKE_VARS.items()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(
        nb=nbformat.read(folder / "report.ipynb", as_version=4),
        html=(folder / "report.html").read_text(),
        summary=json.loads((folder / "report.json").read_text()),
        stderr=proc.stderr,
        folder=folder,
    )


@pytest.fixture(scope="module")
def executed(made):
    """(executed notebook, HTML page, JSON numbers), as ``make report`` wrote them."""
    return made["nb"], made["html"], made["summary"]


@pytest.fixture(scope="module")
def result():
    return report.run(**PARAMS)


def test_report_records_the_parameters_it_was_given(executed):
    _, _, s = executed
    assert (
        s["task"],
        s["accum_steps"],
        s["batch_size"],
        s["norm"],
        s["precision"],
        s["device"],
        s["seed"],
    ) == ("mlp-digits", [1, 2, 4], 4, "batch", "bfloat16", "cpu", 0)
    assert (s["n_items"], s["n_batches"], s["min_steps"]) == (110, N_BATCHES, 3)


def test_report_results_are_the_known_verdicts(executed):
    _, _, s = executed
    cells = {(c["loop"], c["k"]): c for c in s["loops"]}
    assert set(cells) == {(loop, k) for loop in LABELS for k in (1, 2, 4)}
    for c in cells.values():
        assert (
            c["steps"]
            == c["expected_steps"]
            == math.ceil(N_BATCHES / c["k"])
            == len(c["rel_errors"])
            == len(c["logged"])
        )
        assert c["steps"] >= report.MIN_STEPS
        assert c["items_used"] == c["items"] == 110  # every reference loop steps its tail
        assert c["max_rel_error"] == max(c["rel_errors"])
    for k in (1, 2, 4):
        assert (
            cells[("ragged", k)]["verdict"] == "ok"
            and max(cells[("ragged", k)]["rel_errors"]) <= FLOAT32_RTOL
        )
        assert cells[("large_batch", k)]["verdict"] == "ok"
        # judged as verify judges it: against a bfloat16 replay of each window (the float32 figure is bf16
        # rounding)
        amp = cells[("amp (bfloat16)", k)]
        assert amp["verdict"] == "ok" and len(amp["replay_rel_errors"]) == amp["steps"]
        assert max(amp["replay_rel_errors"]) < max(amp["rel_errors"])
    assert cells[("naive", 1)]["verdict"] == "ok"  # one micro-batch per window: nothing to divide
    for k in (2, 4):
        naive = cells[("naive", k)]
        assert naive["verdict"] == "unscaled-sum"
        assert abs(naive["max_norm_ratio"] - k) < RATIO_TOL * k
        # every step but the last has k equal micro-batches: the naive gradient is k g*, error k - 1
        assert all(abs(e - (k - 1)) < RATIO_TOL * k for e in naive["rel_errors"][:-1])
        normalized = cells[("normalized", k)]
        # 28 micro-batches of 4, the last of 2 items: every window is full at k = 2 and 4, and the last one
        # weighs its micro-batch of 2 as much as those of 4
        assert normalized["verdict"] == "mean-of-means"
        # exact on the full windows, wrong only where the 2-item micro-batch sits: the last step
        assert max(normalized["rel_errors"][:-1]) <= FLOAT32_RTOL < normalized["rel_errors"][-1]
    # batch norm: exact at k = 1 (one micro-batch is the large batch), never after
    norm = s["norm_max_rel_error"]
    assert norm["1"] <= FLOAT32_RTOL and norm["2"] > 1e-3 and norm["4"] > 1e-3
    mem = s["memory"]
    for k in (1, 2, 4):
        assert mem[str(k)]["large_batch_bytes"] == pytest.approx(
            k * mem[str(k)]["micro_batch_bytes"], rel=0.01
        )
    assert any(f.startswith("naive: ok at k = 1; unscaled-sum at k = 2, 4") for f in s["findings"])


def test_report_shows_tables_findings_and_figures_with_alt_text(executed):
    nb, body, _ = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html_outputs = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert sum("<table>" in h for h in html_outputs) >= 4  # settings, loops, memory, norm
    # the findings, a bulleted list of the page
    assert "<li>naive: ok at k = 1; unscaled-sum at k = 2, 4" in body
    (norm,) = re.findall(r"<li>(SmallCNN with batch norm[^<]*)</li>", body)
    assert "not exact at k = 2, 4" in norm
    imgs = re.findall(r"<img\b[^>]*>", body)
    # every figure is an <img> ...
    assert len(imgs) == 3 and len(re.findall(r"src=\"data:image/png;base64,", body)) == 3
    for img in imgs:  # ... with alt text that states the figure's numbers
        alt = re.search(r'\balt="([^"]*)"', img)
        assert alt and len(alt.group(1)) > 80 and re.search(r"\d", alt.group(1)), img[:200]


def test_report_html_carries_no_raw_json(executed):
    nb, body, _ = executed
    assert not [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "application/json" in o.get("data", {})
    ]
    for key in ('"rel_errors"', '"max_rel_error"', '"norm_max_rel_error"', "rel_errors"):
        assert key not in body


# --- the page a person reads: no code, the parameters once, no warnings, titles that match ----------


def _text(page: str, tag: str = " ") -> str:
    """The page's visible text: no style, script or embedded image, each tag read as ``tag``, entities read,
    white space collapsed. ``tag=""`` joins highlighted code back into its lines (a span per token)."""
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", page, flags=re.S)
    page = re.sub(r'src="data:[^"]*"', "", page)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", tag, page)))


def _code_on_the_page(page: str, nb) -> list[str]:
    """Whatever shows code or its prompts: an input area or prompt in a code cell, an ``In [n]``, a line of
    any code cell."""
    found = []
    cells = re.split(r'(?=<div[^>]*class="jp-Cell )', page)
    found += [
        f"an input area in a code cell: {c[:120]!r}"
        for c in cells
        if "jp-CodeCell" in c[:200] and "jp-InputArea" in c
    ]
    found += [f"a prompt: {m!r}" for m in re.findall(r'class="[^"]*jp-(?:Input|Output)Prompt[^"]*"', page)]
    text = _text(page)
    found += [f"a prompt: {m!r}" for m in re.findall(r"(?:In|Out)\s*\[\s*\d*\s*\]", text)]
    joined = _text(page, tag="")
    lines = {
        re.sub(r"\s+", " ", ln.strip())
        for c in nb.cells
        if c.cell_type == "code"
        for ln in c.source.splitlines()
    }
    found += [f"a line of code: {ln!r}" for ln in sorted(lines) if len(ln) > 8 and ln in joined]
    return found


def test_the_page_shows_no_code_and_no_prompts(executed):
    nb, body, _ = executed
    assert _code_on_the_page(body, nb) == []
    # every output still shows, in its own cell: 3 tables and the findings' list, 3 figures, the JSON note
    assert (
        body.count('class="jp-Cell jp-CodeCell')
        == sum(1 for c in nb.cells if c.cell_type == "code" and c.outputs)
        == 8
    )


def test_the_code_check_sees_code_where_nbconvert_shows_it(executed):
    """The negative: the same executed notebook as nbconvert writes it by default (the old make report)."""
    from nbconvert import HTMLExporter

    nb, _, _ = executed
    default, _ = HTMLExporter().from_notebook_node(nb)
    found = "\n".join(_code_on_the_page(default, nb))
    assert "an input area in a code cell" in found and "a prompt" in found
    assert (
        "a line of code: 'result = report.run(task, accum_steps, batch_size, norm, precision, device, seed, "
        "results_path)'" in found
    )
    # both parameters cells
    assert "accum_steps = " in _text(default) and "accum_steps = " not in _text(executed[1])


def _tables(page: str) -> dict[str, list[tuple[str, ...]]]:
    out: dict[str, list[tuple[str, ...]]] = {}
    for table in re.findall(r"<table\b.*?</table>", page, flags=re.S):
        caption = re.search(r"<caption[^>]*>(.*?)</caption>", table, flags=re.S)
        rows = [
            tuple(html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r, flags=re.S))
            for r in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
        ]
        out.setdefault(html.unescape(caption.group(1)) if caption else "", []).append([r for r in rows if r])
    return out


def test_the_page_shows_the_parameters_once_as_a_table_of_the_values_given(executed):
    _, body, _ = executed
    # one table, not the notebook's defaults and papermill's values as code
    (table,) = _tables(body)[PARAMETERS_CAPTION]
    rows = dict(table)
    assert (
        rows["task"],
        rows["accumulation steps k"],
        rows["micro-batch size"],
        rows["norm layer (CNN section)"],
        rows["precision (amp loop)"],
        rows["device"],
        rows["seed"],
    ) == ("mlp-digits", "1 2 4", "4", "batch", "bfloat16", "cpu", "0")
    assert rows["optimizer steps per epoch"] == "28 at k = 1, 14 at k = 2, 7 at k = 4"
    text = _text(body)
    assert "batch_size = " not in text and "Parameters" not in text.replace(PARAMETERS_CAPTION, "")
    assert text.count(PARAMETERS_CAPTION) == 1


def test_make_report_writes_no_warning(made):
    stderr = made["stderr"]
    assert not re.search(r"warn|unable to parse|unknown parameter|error", stderr, flags=re.I), stderr[-2000:]
    # nor does the notebook: no stderr stream, no error, in any cell
    outputs = [o for c in made["nb"].cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("name") == "stderr" or o.get("output_type") == "error"]


def test_papermill_reads_every_parameter_of_the_parameters_cell(caplog):
    """papermill refuses a line holding two '=' ("Unable to parse line 3", then "Passed unknown parameter:
    batch_size" on every run): the cell parses whole, and the old cell, the negative, does not."""
    from papermill.translators import PythonTranslator

    (cell,) = [
        c for c in nbformat.read(NOTEBOOK, as_version=4).cells if "parameters" in c.metadata.get("tags", [])
    ]
    with caplog.at_level(logging.WARNING, logger="papermill"):
        parsed = PythonTranslator.inspect(cell)
    assert [p.name for p in parsed] == list(report.DEFAULTS) and all(p.help for p in parsed)
    assert not caplog.records
    old = cell.source.replace("so the largest k (8) still", "so k = 8 still")  # the comment of the old cell
    with caplog.at_level(logging.WARNING, logger="papermill"):
        parsed = PythonTranslator.inspect(nbformat.v4.new_code_cell(old))
    assert "batch_size" not in [p.name for p in parsed]
    assert any("Unable to parse line 3" in r.getMessage() for r in caplog.records)


def _alt(page: str, start: str) -> str:
    (alt,) = [
        html.unescape(a) for a in re.findall(r'\balt="([^"]*)"', page) if html.unescape(a).startswith(start)
    ]
    return alt


def test_the_figures_titles_agree_with_the_computed_numbers(executed):
    """Each figure's alt text opens with its title: batch norm's error at k >= 2 is far above float32
    rounding, so the title says accumulation cannot fix it (it once said so of group norm, which it fixes)."""
    _, body, s = executed
    off = [int(k) for k, e in s["norm_max_rel_error"].items() if e > FLOAT32_RTOL]
    assert off == [2, 4]  # batch norm: exact only where one micro-batch is the large batch
    mem = s["memory"]["4"]
    ratio = mem["large_batch_bytes"] / mem["micro_batch_bytes"]
    alt = _alt(body, "What accumulation saves")
    assert alt.startswith(
        f"What accumulation saves: {ratio:.1f}x less activation memory at k = 4, and what it cannot fix: "
        "batch norm, off at k = 2, 4."
    )
    assert "keeps exact" not in alt
    verdicts: dict[str, set[str]] = {}
    for c in s["loops"]:  # an autocast loop's ok is against its own dtype's replay: not exact
        verdicts.setdefault(c["loop"], set()).add("replay" if "replay_rel_errors" in c else c["verdict"])
    exact = [loop for loop, v in verdicts.items() if v == {"ok"}]
    tags = get_task(PARAMS["task"]).tags
    promised = [n for n in LOOPS if CONTRACTS[n].expected(tags) == () and not CONTRACTS[n].low_precision]
    assert exact == promised  # as the contracts promise
    assert {"ragged", "large_batch"} <= set(exact)  # and as this task's ragged tail decides today
    assert _alt(body, "Each loop's worst step").startswith(
        f"Each loop's worst step against the large batch (mlp-digits), exact at every k: {', '.join(exact)}."
    )


def test_a_refused_parameter_fails_the_run_by_its_rule_and_writes_no_page(tmp_path, capsys, monkeypatch):
    """The report's own check, through the command make report calls: exit 1, the rule and the value, no
    HTML."""
    pytest.importorskip("papermill")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from accumlib_course.report import render

    (tmp_path / "report.html").write_text("an earlier report")
    status = render.main(
        [
            str(NOTEBOOK),
            str(tmp_path),
            "-p",
            "accum_steps",
            "1 2 4 8",
            "-p",
            "batch_size",
            "16",
            "-p",
            "device",
            "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1
    assert (
        "the notebook raised ValueError: accum_steps and batch_size must give every k at least 3 optimizer "
        "steps" in err
    )
    assert "batch_size=16" in err
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "report.json").exists()


def _line_styles(axes):
    return [
        ln for ax in axes for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")
    ]


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
    from dataclasses import replace

    # large_batch bit-exact at every k (verify's in-place sums may leave float32 rounding instead)
    cells = {
        key: replace(c, rel_errors=(0.0,) * len(c.rel_errors)) if key[0] == "large_batch" else c
        for key, c in result.cells.items()
    }
    fig = report.plot_errors(replace(result, cells=cells))
    ax = fig.axes[0]
    large_batch = next(ln for ln in ax.get_lines() if ln.get_label() == "large_batch")
    assert list(large_batch.get_ydata()) == [report.ZERO] * len(result.ks)  # exactly 0 at every k
    labels = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    assert labels["0 (bit-exact)"] == report.ZERO


def test_make_report_passes_the_parameters():
    dry = subprocess.run(
        [
            "make",
            "-n",
            "-o",
            ".venv/.installed-stamp",
            "report",
            "ACCUM=1 2 4 8",
            "NORM=group",
            "TASK=lm-tokens",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '-m accumlib_course.report.render notebooks/report.ipynb "reports"' in dry
    assert '-p accum_steps "1 2 4 8"' in dry and '-p norm "group"' in dry and '-p task "lm-tokens"' in dry
    assert '-p results_path "reports/report.json"' in dry


def _makefile_defaults() -> dict:
    text = (REPO / "Makefile").read_text()
    make = dict(re.findall(r"^([A-Z]+)\s*\?=\s*(.*)$", text, flags=re.M))
    return dict(
        task=make["TASK"],
        accum_steps=report.parse_accum(make["ACCUM"]),
        batch_size=int(make["BATCH"]),
        norm=make["NORM"],
        precision=make["PRECISION"],
        device=make["DEVICE"],
        seed=int(make["SEED"]),
    )


def _notebook_defaults() -> dict:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    values = {
        t.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body for t in node.targets
    }
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


@pytest.mark.parametrize(
    "task, accum_steps, batch_size, short",
    [
        # the old defaults: one step at k = 8
        ("mlp-digits", "1 2 4 8", 16, "7 micro-batches, so k = 4, 8 give 2, 1 steps"),
        # 110 / 7: one micro-batch short of 17
        ("mlp-digits", "1 2 4 8", 7, "16 micro-batches, so k = 8 gives 2 steps"),
        ("lm-tokens", "1 2 4 8", 4, "16 micro-batches, so k = 8 gives 2 steps"),
        (
            "cnn",
            [2, 8],
            8,
            "128 examples, which batch_size=8 splits into 16 micro-batches, so k = 8 gives 2 steps",
        ),
    ],
)
def test_refuses_k_with_fewer_than_three_steps_and_says_what_works(task, accum_steps, batch_size, short):
    with pytest.raises(
        ValueError, match="accum_steps and batch_size must give every k at least 3 optimizer steps"
    ) as err:
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
    # 16 images in micro-batches of 3: 6 micro-batches, 2 steps at k = 4
    monkeypatch.setattr(report.params, "N_IMAGES", 16)
    with pytest.raises(
        ValueError, match="the norm section's 'cnn-group' has 16 examples.*so k = 4 gives 2 steps"
    ):
        report.check_parameters(task="lm-tokens", accum_steps=[1, 2, 4], batch_size=3)
    report.check_parameters(task="lm-tokens", accum_steps=[1, 2], batch_size=3)


@pytest.mark.parametrize(
    "value, expected",
    [
        ([1, 2], (1, 2)),
        ("1 2 4 8", (1, 2, 4, 8)),
        ("2,4", (2, 4)),
        ((3,), (3,)),
        (4, (4,)),
        ("4", (4,)),
        ("8 2 2", (2, 8)),
    ],
)
def test_parse_accum(value, expected):
    assert report.parse_accum(value) == expected


@pytest.mark.parametrize("value", ["", "1 x", [0, 2], "-1", 0, [], [2.5], "2.5", 2.5, True, None, [True]])
def test_parse_accum_refuses_bad_values(value):
    # the value is named as given: [2.5] once ran k = 2 silently (issue 13)
    with pytest.raises(
        ValueError, match=r"accum_steps must be integers >= 1.*\(got " + re.escape(repr(value)) + r"\)"
    ):
        report.parse_accum(value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(task="resnet"), "task must be one of 'cnn', "),
        (dict(accum_steps="1 x"), "accum_steps must be integers >= 1"),
        (dict(accum_steps=[0, 2]), "accum_steps must be integers >= 1"),
        (dict(batch_size=0), r"batch_size must be an integer >= 1 \(got 0\)"),
        (dict(batch_size=2.5), r"batch_size must be an integer >= 1 \(got 2.5"),
        (dict(batch_size=True), r"batch_size must be an integer >= 1 \(got True"),
        # checked even when task is not 'cnn'
        (dict(norm="layer"), r"norm must be one of 'batch', 'group', 'none' \(got 'layer'\)"),
        (
            dict(precision="float8"),
            r"precision must be one of 'float32', 'bfloat16', 'float16' \(got 'float8'\)",
        ),
        (dict(device="tpu"), r"device must be .*\(got 'tpu'\)"),
        (dict(seed=-1), r"seed must be an integer >= 0 \(got -1\)"),
        (dict(seed="0"), r"seed must be an integer >= 0 \(got '0'"),
        (
            dict(seed="abc"),
            r"seed must be an integer >= 0 \(got 'abc'",
        ),  # once failed inside torch (issue 13)
        (dict(accum_steps=[2.5]), r"accum_steps must be integers >= 1.*\(got \[2.5\]\)"),
        (
            dict(results_path="report.txt"),
            r"results_path must end in .json, or be '' to write no file \(got 'report.txt'\)",
        ),
        (
            dict(results_path="/no/such/folder/report.json"),
            r"results_path must be in an existing folder \(got '/no/such/folder/report.json'",
        ),
        (
            dict(results_path=3),
            r"results_path must be a path ending in .json, or '' to write no file \(got 3\)",
        ),
    ],
)
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


def test_each_loops_style_comes_from_its_contract_and_keeps_todays_looks():
    """The roles the figures had when they were written by hand, now read from the verdicts."""
    todays = {
        "naive": "buggy",
        "normalized": "other",
        "grad_divided": "other",
        "ragged": "correct",
        "amp": "alternative",
        "large_batch": "oracle",
    }
    assert {n: figures.role_of(CONTRACTS[n]) for n in todays} == todays
    looks = figures.styles(LABELS)
    assert looks["amp (bfloat16)"] == _style.ROLE["alternative"]  # a run label finds its loop's contract
    assert all(looks[n] == _style.ROLE[todays[n]] for n in LABELS if n in todays)


def test_a_new_loop_gets_a_style_of_its_own_without_an_edit(monkeypatch):
    """A scratch loop exact everywhere but BatchNorm shares ragged's role, so its colour, with a marker
    of its own: no two lines of one axes look alike, and no new role is written by hand."""
    scratch = Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm=("batchnorm",), order=9)
    monkeypatch.setitem(CONTRACTS, "global_count", scratch)
    labels = [*LABELS, "global_count"]
    looks = figures.styles(labels)
    assert looks["global_count"]["color"] == _style.ROLE["correct"]["color"]
    shapes = [(s["marker"], str(s["linestyle"])) for s in looks.values()]
    assert len(set(shapes)) == len(shapes)
    assert looks["ragged"] == _style.ROLE["correct"]  # the loop already there keeps its look
    u = ("unscaled-sum",)
    off = dataclasses.replace(scratch, full_windows=u, ragged_tail=u, token_counts=u)
    assert figures.role_of(off) == "buggy"
