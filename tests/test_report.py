"""The papermill report: run it with small parameters, then check the results it recorded.

The report notebook records its results as JSON in the cell tagged ``results``; the test reads
that output from the executed notebook (not the function's return value), so it checks what a
reader of the report sees, and converts the notebook to HTML as ``make report`` does.
"""

import math
import os
import subprocess
from pathlib import Path

import nbformat
import pytest

from accumlib.check import FLOAT32_RTOL
from accumlib.lessons import report

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "report.ipynb"
# naive scales a window of m micro-batches by m; with a smaller last micro-batch the ratio
# moves a little (110 items in batches of 16: the last holds 14), so 10% separates m from m +- 1
RATIO_TOL = 0.1


def _recorded(nb) -> dict:
    cells = [c for c in nb.cells if "results" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "the report must have exactly one cell tagged 'results'"
    data = [o["data"]["application/json"] for o in cells[0].outputs if "application/json" in o.get("data", {})]
    assert len(data) == 1, "the results cell must display its summary as application/json"
    return data[0]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    papermill = pytest.importorskip("papermill")
    out = tmp_path_factory.mktemp("report") / "report.ipynb"
    os.environ.setdefault("MPLBACKEND", "Agg")
    papermill.execute_notebook(
        str(NOTEBOOK), str(out), kernel_name="python3", progress_bar=False,
        parameters=dict(task="mlp-digits", accum_steps="1 2 4", batch_size=16, norm="batch",
                        precision="bfloat16", device="cpu", seed=0),
    )
    return out


def test_report_records_the_parameters_it_was_given(executed):
    s = _recorded(nbformat.read(executed, as_version=4))
    assert (s["task"], s["accum_steps"], s["batch_size"], s["norm"], s["precision"], s["device"], s["seed"]) == (
        "mlp-digits", [1, 2, 4], 16, "batch", "bfloat16", "cpu", 0
    )
    assert (s["n_items"], s["n_batches"]) == (110, 7)


def test_report_results_are_the_known_verdicts(executed):
    s = _recorded(nbformat.read(executed, as_version=4))
    cells = {(c["loop"], c["k"]): c for c in s["loops"]}
    assert set(cells) == {(loop, k) for loop in ("naive", "normalized", "ragged", "large_batch", "amp (bfloat16)") for k in (1, 2, 4)}
    for c in cells.values():
        assert c["steps"] == c["expected_steps"] == math.ceil(7 / c["k"])
        assert c["items_used"] == c["items"] == 110  # every reference loop steps its tail
    for k in (1, 2, 4):
        assert cells[("ragged", k)]["verdict"] == "exact" and cells[("ragged", k)]["max_rel_error"] <= FLOAT32_RTOL
        assert cells[("large_batch", k)]["verdict"] == "exact"
        assert cells[("amp (bfloat16)", k)]["verdict"] == "close (bf16)"
    assert cells[("naive", 1)]["verdict"] == "exact"
    for k in (2, 4):
        assert cells[("naive", k)]["verdict"] == "off by ~k"
        assert abs(cells[("naive", k)]["max_norm_ratio"] - k) < RATIO_TOL * k
        # 7 micro-batches never fill the last window at k = 2 or 4: normalized misscales it
        assert cells[("normalized", k)]["verdict"] == "not exact"
    # batch norm: exact at k = 1 (one micro-batch is the large batch), never after
    norm = s["norm_max_rel_error"]
    assert norm["1"] <= FLOAT32_RTOL and norm["2"] > 1e-3 and norm["4"] > 1e-3
    mem = s["memory"]
    for k in (1, 2, 4):
        assert mem[str(k)]["large_batch_bytes"] == pytest.approx(k * mem[str(k)]["micro_batch_bytes"], rel=0.01)


def test_report_shows_figures_tables_and_findings(executed):
    nb = nbformat.read(executed, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3
    assert sum("text/html" in o.get("data", {}) for o in outputs) >= 3  # settings, loops, memory/norm tables
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "naive: exact at k = 1; off by ~k at k = 2, 4" in text
    assert "SmallCNN with batch norm" in text and "not exact" in text


def test_report_html_embeds_the_figures(executed):
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(executed))
    assert body.count("data:image/png;base64,") >= 3


def test_make_report_passes_the_parameters():
    dry = subprocess.run(
        ["make", "-n", "report", "ACCUM=1 2 4 8", "NORM=group", "TASK=lm-tokens"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "papermill notebooks/report.ipynb reports/report.ipynb" in dry
    assert '-p accum_steps "1 2 4 8"' in dry and '-p norm "group"' in dry and '-p task "lm-tokens"' in dry
    assert "nbconvert --to html reports/report.ipynb" in dry


@pytest.mark.parametrize("value, expected", [([1, 2], (1, 2)), ("1 2 4 8", (1, 2, 4, 8)), ("2,4", (2, 4)), ((3,), (3,))])
def test_parse_accum(value, expected):
    assert report.parse_accum(value) == expected


@pytest.mark.parametrize("value", ["", "1 x", [0, 2], "-1"])
def test_parse_accum_refuses_bad_values(value):
    with pytest.raises(ValueError, match="accum_steps must be"):
        report.parse_accum(value)


def test_run_refuses_bad_parameters():
    with pytest.raises(ValueError, match="precision must be one of"):
        report.run(precision="float8")
    with pytest.raises(ValueError, match="norm must be one of"):
        report.run(task="cnn", norm="layer")
    with pytest.raises(ValueError, match="task must be 'cnn' or one of"):
        report.run(task="resnet")
