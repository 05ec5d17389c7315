"""The notebooks as a workshop participant meets them: JupyterLab in a real (headless) browser.

Each test serves a throwaway copy of notebooks/ with this environment's JupyterLab
(tests/_jupyter.py), opens a notebook in Debian's Chromium through Playwright, runs all cells
from the Run menu, and checks what is rendered; the last test does the same for `make app`
(notebook 7 as a Voila page). Screenshots go to test-artifacts/browser/. The pages must not
reach for the network.
Without Chromium these tests skip, saying how to install it; with ACCUMLIB_REQUIRE_BROWSER=1
(set by .ci/run) a missing browser fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from _jupyter import (
    ERROR_TEXT,
    STDERR_MIME,
    chromium_missing_reason,
    chromium_page,
    images_differ,
    jupyter_lab,
    notebook,
    open_notebook,
    outputs_of,
    run_all_cells,
    voila_app,
    wait_kernel_idle,
)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = Path(os.environ.get("ACCUMLIB_ARTIFACTS", REPO / "test-artifacts")) / "browser"

NB_WHY = "01_why_accumulate.ipynb"
NB_VERIFY = "07_verify_your_loop.ipynb"

# Run All of notebook 1 or 7 takes 20-30 s here (2 cores, load average 5-8 from other jobs);
# 75 s leaves room and still fits the per-test cap with server and browser start-up.
RUN_ALL_TIMEOUT_MS = 75_000
REDRAW_TIMEOUT_S = 30  # one recompute + redraw after a slider step takes ~1-3 s here

# A hard cap per test, below pytest's global 600 s: a hung browser test fails in 2 minutes.
BROWSER_TEST_TIMEOUT_S = 120


def _copy_notebooks(dest: Path) -> None:
    """notebooks/ without checkpoints and without what is not a plain file or folder (running
    kernels leave IPC sockets there)."""

    def skip(folder: str, names: list[str]) -> list[str]:
        return [
            n for n in names
            if n == ".ipynb_checkpoints" or not (os.path.isfile(p := os.path.join(folder, n)) or os.path.isdir(p))
        ]

    shutil.copytree(NOTEBOOKS, dest, ignore=skip)


def _require_chromium() -> None:
    reason = chromium_missing_reason()
    if reason:
        if os.environ.get("ACCUMLIB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ACCUMLIB_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab for the module, serving a copy of notebooks/ (running a notebook in the
    UI rewrites it; the repository's copies stay untouched) plus a scratch/ folder."""
    _require_chromium()
    root = tmp_path_factory.mktemp("lab-root")
    _copy_notebooks(root / "notebooks")
    (root / "scratch").mkdir()
    with jupyter_lab(root) as server:
        yield server


@pytest.fixture
def page(lab, tmp_path):
    with chromium_page(tmp_path / "chromium-profile") as page:
        yield page
        assert page.external_requests == [], "the page asked the network for something"


def _artifact(request, label: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    return ARTIFACTS / f"{name}-{label}.png"


def _need(name: str) -> str:
    if not (NOTEBOOKS / name).exists():
        pytest.fail(f"notebooks/{name} is missing; its browser test needs it")
    return f"notebooks/{name}"


def _slider_and_figure(page):
    """The first slider in the notebook and the figure in the same cell's output."""
    slider = notebook(page).locator(".widget-slider").first
    slider.wait_for(timeout=10_000)
    cell = slider.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-CodeCell ')][1]")
    figure = cell.locator('.jp-OutputArea-output[data-mime-type="image/png"] img').first
    figure.wait_for(timeout=10_000)
    return slider, cell, figure


def _step_slider(page, slider) -> tuple[str, str]:
    """Move the slider one step right with the keyboard, as a person would. Returns the value
    shown before and after."""
    handle = slider.locator(".noUi-handle").first
    before = handle.get_attribute("aria-valuenow")
    handle.focus()
    page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + 5
    while handle.get_attribute("aria-valuenow") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    return before, handle.get_attribute("aria-valuenow")


def _wait_redrawn(figure, old_src: str) -> str:
    deadline = time.monotonic() + REDRAW_TIMEOUT_S
    while time.monotonic() < deadline:
        if figure.count() and (src := figure.get_attribute("src")) and src != old_src:
            return src
        time.sleep(0.2)
    raise AssertionError(f"the figure's <img> did not change within {REDRAW_TIMEOUT_S} s")


def _slider_changes_figure(page, lab, path: str, request) -> None:
    slider, cell, figure = _slider_and_figure(page)
    cell.scroll_into_view_if_needed()
    src_before = figure.get_attribute("src")
    page.screenshot(path=_artifact(request, "before"))
    cell.screenshot(path=_artifact(request, "before-cell"))

    value_before, value_after = _step_slider(page, slider)
    assert value_after != value_before, f"the slider did not move (value {value_before})"
    src_after = _wait_redrawn(figure, src_before)
    wait_kernel_idle(page, lab, path, 30_000)
    page.screenshot(path=_artifact(request, "after"))
    cell.screenshot(path=_artifact(request, "after-cell"))

    assert images_differ(src_before, src_after), (
        f"moving the slider {value_before} -> {value_after} re-rendered an identical figure"
    )


# --- the harness itself, on a scratch notebook: it must see errors and redraws -------------

SCRATCH_CELLS = [
    ("markdown", "# scratch: a slider that redraws a figure, then stderr and an error"),
    ("code", "import sys\nimport ipywidgets as w\nimport matplotlib.pyplot as plt\nprint(sys.prefix)"),
    (
        "code",
        "out = w.Output()\n"
        "k = w.IntSlider(value=2, min=1, max=8, description='k')\n"
        "def show(k):\n"
        "    fig, ax = plt.subplots(figsize=(3, 2))\n"
        "    ax.plot(range(10), [i * k for i in range(10)])\n"
        "    ax.set_ylim(0, 80)\n"
        "    with out:\n"
        "        out.clear_output(wait=True)\n"
        "        display(fig)\n"
        "    plt.close(fig)\n"
        "k.observe(lambda change: show(change['new']), names='value')\n"
        "show(k.value)\n"
        "w.VBox([k, out])",
    ),
    ("code", "print('a warning-like line', file=sys.stderr)"),
    ("code", "1 / 0"),
    ("code", "print('never runs: Run All stops at the error')"),
]


def _write_scratch(root: Path) -> str:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    nb.cells = [new[kind](src) for kind, src in SCRATCH_CELLS]
    nbformat.write(nb, root / "scratch" / "scratch.ipynb")
    return "scratch/scratch.ipynb"


@pytest.mark.browser
@pytest.mark.timeout(BROWSER_TEST_TIMEOUT_S)
def test_harness_sees_errors_and_redraws(lab, page, request):
    """The checks the notebook tests rely on can fail: stderr and a traceback are found, Run All
    stops at the error, the kernel is this environment's, and a slider step redraws."""
    path = _write_scratch(lab.root)
    started = time.monotonic()
    open_notebook(page, lab, path)
    prompts = run_all_cells(page, lab, path, RUN_ALL_TIMEOUT_MS)

    assert prompts[:4] == ["[1]:", "[2]:", "[3]:", "[4]:"] and prompts[4] == "[ ]:", prompts
    stdout = outputs_of(page, "application/vnd.jupyter.stdout")
    assert stdout and stdout[0].strip() == sys.prefix, "the kernel is not this environment's Python"
    stderr = outputs_of(page, STDERR_MIME)
    assert len(stderr) == 2, stderr
    assert "a warning-like line" in stderr[0]
    assert "ZeroDivisionError" in stderr[1] and "Traceback" in stderr[1]
    assert ERROR_TEXT.search(stderr[1]) and not ERROR_TEXT.search(stderr[0])  # error vs plain stderr
    _slider_changes_figure(page, lab, path, request)
    print(f"scratch notebook: {time.monotonic() - started:.1f} s in the browser")


def test_images_differ_is_not_vacuous():
    """images_differ() compares pixels: the same figure twice is 'same', another is 'different'."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def png(k: int) -> str:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [0, k])
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    assert not images_differ(png(1), png(1))
    assert images_differ(png(1), png(2))


# --- the lesson notebooks --------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.timeout(BROWSER_TEST_TIMEOUT_S)
def test_notebook_1_runs_and_slider_redraws(lab, page, request):
    path = _need(NB_WHY)
    open_notebook(page, lab, path)
    run_all_cells(page, lab, path, RUN_ALL_TIMEOUT_MS)
    assert outputs_of(page, STDERR_MIME) == [], "error or stderr output in notebook 1"
    _slider_changes_figure(page, lab, path, request)
    assert outputs_of(page, STDERR_MIME) == [], "moving the slider wrote to stderr"


@pytest.mark.browser
@pytest.mark.timeout(BROWSER_TEST_TIMEOUT_S)
def test_notebook_7_report_shows_a_finding(lab, page, request):
    """The exercise's loop (the GradScaler loop of the seed question) is buggy as given: the
    report it renders (an HTML table, one row per optimizer step, then the findings) names
    the finding codes that the cell above printed."""
    from accumlib import CODES

    path = _need(NB_VERIFY)
    open_notebook(page, lab, path)
    run_all_cells(page, lab, path, RUN_ALL_TIMEOUT_MS)
    assert outputs_of(page, STDERR_MIME) == [], "error or stderr output in notebook 7"

    last = notebook(page).locator(".jp-CodeCell").last
    last.scroll_into_view_if_needed()
    last.screenshot(path=_artifact(request, "report"))
    table = last.locator('.jp-OutputArea-output[data-mime-type="text/html"] table').first
    header = [h.strip() for h in table.locator("th").all_inner_texts()]
    assert "codes" in header, f"the rendered report table has no codes column: {header}"
    column = header.index("codes")
    step_codes = {
        code.strip()
        for row in table.locator("tr").all()[1:]
        for code in row.locator("td").nth(column).inner_text().split(",")
        if code.strip() not in ("", "ok", "-")
    }
    listed = set(last.locator('.jp-OutputArea-output[data-mime-type="text/html"] li code').all_inner_texts())
    printed = re.search(r"findings: \[(.*)\]", "\n".join(outputs_of(page, "application/vnd.jupyter.stdout")))
    assert printed, "the exercise cell did not print its findings"
    printed_codes = set(re.findall(r"'([^']+)'", printed.group(1)))

    assert step_codes | listed, "the rendered report shows no finding code"
    assert step_codes <= set(CODES) and listed <= set(CODES), (step_codes, listed)
    assert listed == printed_codes, f"rendered findings {listed} != printed {printed_codes}"
    assert step_codes <= listed, f"step codes {step_codes} not among the findings {listed}"


# --- `make app`: the verifier notebook as a Voila page ----------------------------------------

VOILA_CDN_ICONS = "https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@"
APP_TIMEOUT_MS = 90_000  # Voila runs all of notebook 7 (~40 s here, gallery included) first


@pytest.mark.browser
@pytest.mark.timeout(BROWSER_TEST_TIMEOUT_S)
def test_app_verdict_for_a_pasted_loop(request, tmp_path):
    """A participant opens the app, pastes a loop that sums k micro-batch losses without
    dividing by k, presses verify and reads `unscaled-sum` in the rendered report."""
    _require_chromium()
    pytest.importorskip("voila", reason="voila is not installed: pip install -c constraints.txt -e '.[dev]'")
    _need(NB_VERIFY)
    root = tmp_path / "app"
    _copy_notebooks(root / "notebooks")
    pasted = (
        "import torch.nn.functional as F\n\n"
        "def train_fn(model, optimizer, loader):\n"
        "    for i, (x, y) in enumerate(loader):\n"
        "        F.cross_entropy(model(x), y).backward()  # not divided by k\n"
        "        if (i + 1) % 4 == 0 or i + 1 == len(loader):\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n"
    )
    with voila_app(root, f"notebooks/{NB_VERIFY}") as app, chromium_page(tmp_path / "profile") as page:
        page.goto(app.app_url(), timeout=APP_TIMEOUT_MS)
        box = page.locator(".widget-textarea textarea").last
        box.wait_for(timeout=APP_TIMEOUT_MS)
        assert page.locator(".jp-OutputArea-output pre", has_text="Traceback").count() == 0
        panel = box.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' widget-vbox ')][1]")
        box.fill(pasted)
        panel.locator("button", has_text="verify").click()
        table = panel.locator("table").first
        table.wait_for(timeout=APP_TIMEOUT_MS)
        panel.scroll_into_view_if_needed()
        page.screenshot(path=_artifact(request, "verdict"), full_page=True)
        findings = set(panel.locator("li code").all_inner_texts())
        verdict = panel.locator("p b").first.inner_text()
        external = list(page.external_requests)
    assert "unscaled-sum" in findings, f"the app's verdict names {findings}"
    assert "NOT OK" in verdict, verdict
    # Voila's lab template links Font Awesome from a CDN (icons only; the page works without).
    assert [u for u in external if not u.startswith(VOILA_CDN_ICONS)] == [], external
