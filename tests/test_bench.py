"""`make bench` keeps working: ``bench.py --quick`` on tiny sizes produces every figure.

Checks that each section produced figures and that they are finite, and that the goals
table has one entry per goal of issue 7. Never checks speed: benchmarks print figures,
they are not timed tests (and this machine may be busy).
"""

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("accumlib_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()

# The figures each section must produce, per row: (section, fields that must be finite numbers).
FIGURES = {
    "memory": ("full_bytes", "micro_bytes_max", "ratio"),
    "overhead": ("accumlib_s", "hand_s", "ratio"),
    "price": ("step_s", "ratio_to_k1"),
    "verify": ("verify_s", "alone_s", "ratio"),
    "notebook_times": ("wall_s",),
    "widgets": ("median_s",),
    "allreduce": ("calls_per_step", "bytes_per_step", "bytes_vs_no_sync"),
    "verify_scale": ("alone_s", "verify_s", "time_ratio", "verify_extra_peak_bytes"),
    "verify_trainer": ("alone_s", "verify_s", "ratio"),
    "verify_ranks": ("alone_s", "verify_s", "ratio", "param_bytes", "bytes_per_step", "calls_per_step"),
    "kernel_memory": (
        "private_mib",
        "kernel_private_mib",
        "kernel_private_clean_mib",
        "start_mib",
        "peak_mib",
        "held_mib",
        "held_private_mib",
        "with_processes_peak_mib",
    ),
}


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # One in-process run of every section at tiny sizes (~50 s on an idle 2-core machine: most of
    # it is one nbval kernel start, two spawns of 2 DDP ranks (distributed, verify_ranks) and verify_scale's
    # one child process).
    report = bench.main(["--quick", "--out", str(out)])
    return out, report


def test_every_section_produces_finite_figures(quick_run):
    _, report = quick_run
    assert list(report["sections"]) == list(bench.SECTIONS)
    for section, fields in FIGURES.items():
        res = report["sections"][section]
        assert "not_available" not in res, f"{section}: {res.get('not_available')}"
        assert res["rows"], section
        for row in res["rows"]:
            for f in fields:
                assert _finite(row[f]), (section, f, row)
    section = report["sections"]["notebook_times"]
    assert all(r["passed"] for r in section["rows"]) and section["suite_passed"]
    assert _finite(section["suite_s"]) and _finite(section["separate_s"])


def test_hand_written_twins_do_the_accumlib_loops_work(quick_run):
    _, report = quick_run
    res = report["sections"]["overhead"]
    measured = {r["loop"] for r in res["rows"]}
    assert measured | {r["loop"] for r in res["not_measured"]} == set(bench.accumlib.LOOPS)
    assert measured == set(bench.accumlib.LOOPS) & set(bench.MODULES["overhead"].HAND)
    assert all(r["same_logged_losses"] for r in res["rows"])


def test_a_loop_without_a_twin_is_reported_as_not_measured(monkeypatch):
    """A scratch loop registered beside ragged: the section still runs, times ragged against its twin, and
    names the scratch loop as not measured in its result, its goal and its markdown; it never times a
    loop against nothing, and never claims the goal ("every loop") met."""
    from accumlib.loops import ALL, CONTRACTS, Contract

    overhead = bench.MODULES["overhead"]

    def global_count(model, optimizer, loader, item_losses, *, accum_steps, device=None, progress=False):
        return ALL["ragged"](model, optimizer, loader, item_losses, accum_steps=accum_steps, device=device)

    scratch = Contract(full_windows=(), ragged_tail=(), token_counts=(), batchnorm=("batchnorm",), order=9)
    monkeypatch.setitem(CONTRACTS, "global_count", scratch)
    monkeypatch.setattr(overhead, "LOOPS", {"ragged": ALL["ragged"], "global_count": global_count})
    res = overhead.run(quick=True)
    assert {r["loop"] for r in res["rows"]} == {"ragged"} and res["rows"]
    assert res["not_measured"] == [{"loop": "global_count", "why": overhead.NO_TWIN}]
    goal = res["goals"]["overhead"]
    assert goal["met"] is not True and "not measured: global_count" in goal["measured"]
    md = "\n".join(overhead.lines(res))
    assert "| ragged |" in md and "not measured: global_count (no hand-written twin" in md
    assert "| global_count |" not in md
    # the negative: with every loop twinned nothing is listed as not measured
    monkeypatch.setattr(overhead, "LOOPS", {"ragged": ALL["ragged"]})
    assert overhead.run(quick=True)["not_measured"] == []


def test_every_section_has_the_one_face_and_helpers_are_private():
    """A section's NAME is its file name, its run is run(quick: bool = False); every other module is
    private."""
    import inspect

    folder = BENCH.parent
    public = sorted(p.stem for p in folder.glob("[!_]*.py") if p.stem != "bench")
    assert public == sorted(bench.SECTION_MODULES), "a public module in benchmarks/ that is not a section"
    for name, module in bench.MODULES.items():
        assert module.NAME == name == Path(module.__file__).stem
        params = inspect.signature(module.run).parameters
        assert list(params) == ["quick"] and params["quick"].default is False, (name, params)
        assert set(inspect.signature(module.lines).parameters) == {"res", "short"}, name
        assert isinstance(module.TITLE, str) and isinstance(module.GOALS, dict), name


def test_a_section_whose_name_is_not_its_file_is_refused(monkeypatch):
    import types

    fake = types.ModuleType("memory")
    fake.NAME = "mem"
    monkeypatch.setattr(bench.importlib, "import_module", lambda name: fake)
    with pytest.raises(
        ValueError, match=r"benchmarks/memory.py must set NAME = 'memory', its file name \(got 'mem'\)"
    ):
        bench._section("memory")


def test_goals_table_has_one_entry_per_goal(quick_run):
    _, report = quick_run
    goals = {g["goal"]: g for g in report["goals"]}
    assert list(goals) == list(bench.GOALS)
    for g in goals.values():
        assert g["status"] in ("met", "MISSED", "not measured")
        assert g["measured"]
    # --quick measures nothing for real for the notebook, widget and verify-at-scale goals: never a verdict
    for key in (
        "notebook_each",
        "notebook_suite",
        "widget",
        "verify_scale_memory",
        "verify_scale_time",
        "verify_trainer",
        "verify_ranks_time",
        "verify_ranks_memory",
        "verify_ranks_traffic",
        "kernel_memory",
        "kernel_memory_route",
    ):
        assert goals[key]["met"] is None and goals[key]["status"] == "not measured"
    # the memory goal depends on sizes, not speed: it is decided even on tiny sizes
    assert goals["memory"]["met"] in (True, False)


def test_outputs_written(quick_run):
    out, report = quick_run
    data = json.loads((out / "latest.json").read_text())
    assert [g["goal"] for g in data["goals"]] == list(bench.GOALS)
    md = (out / "latest.md").read_text()
    assert md.startswith("## Performance")
    for g in bench.GOALS:
        assert f"| {g} |" in md
    assert (out / "latest.png").stat().st_size > 10_000


def test_a_missing_piece_is_reported_not_faked(tmp_path, monkeypatch):
    def broken(quick=False):
        raise ImportError("accumlib.verify is not finished")

    monkeypatch.setitem(bench.RUNNERS, "verify", broken)
    report = bench.main(["--quick", "--only", "verify", "--out", str(tmp_path)])
    assert report["sections"]["verify"]["not_available"].startswith("the section raised ImportError")
    goal = next(g for g in report["goals"] if g["goal"] == "verify")
    assert goal["status"] == "not measured" and goal["met"] is None
    assert "not available" in (tmp_path / "latest.md").read_text()


def test_only_rejects_unknown_sections(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--only", "memory,speed", "--out", str(tmp_path)])


def test_one_section_without_merge_never_replaces_every_sections_figures(tmp_path, capsys):
    """`bench.py --only x` once wrote a latest.md of section x alone over the one holding every section."""
    before = {"sections": {"memory": {"figures": "kept"}}}
    (tmp_path / "latest.json").write_text(json.dumps(before))
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--only", "memory", "--out", str(tmp_path)])
    assert "without --merge would replace" in capsys.readouterr().err
    assert json.loads((tmp_path / "latest.json").read_text()) == before  # refused before any work


# --- section 6, widget response per control (benchmarks/widgets.py) ---------------------------------------

widgets = bench.widgets

# A scratch lesson module, free of torch so a kernel loads it in a moment: a widget whose controls redraw a
# PNG figure (one of them reports an error), and a box whose Run button starts a process and whose text it
# reads.
SCRATCH_LESSON = """
import base64, io, subprocess, sys
import ipywidgets as w
from IPython.display import Image, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot(k):
    fig = Figure(figsize=(2, 2))
    FigureCanvasAgg(fig)
    fig.subplots().plot([0, 1], [0, k])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def widget(device="auto", initial=None):
    # the lessons' Explorer in small: each change recomputes and shows a PNG; a compute error is printed
    k = w.IntSlider(value=2, min=1, max=3, description="k")
    option = w.Dropdown(options=["a", "b"], value="b", description="option")
    broken = w.Checkbox(value=False, description="broken")
    out = w.Output()

    def redraw(change=None):
        if broken.value:  # as Explorer shows an error: text in the output area
            error = "ValueError: broken must be False (got True)\\n"
            out.outputs = ({"output_type": "stream", "name": "stdout", "text": error},)
        elif change is not None and change["owner"] is option:  # the two ways an output area is filled
            with out:
                out.clear_output(wait=True)
                display(Image(plot(k.value)))
        else:
            png = base64.b64encode(plot(k.value)).decode()
            data = {"image/png": png, "text/plain": "fig"}
            out.outputs = ({"output_type": "display_data", "metadata": {}, "data": data},)

    for c in (k, option, broken):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([k, option, broken, out])


def run_box():
    text = w.Text(value="x", description="name")  # read when Run is pressed: no redraw of its own
    run = w.Button(description="Run")
    out = w.Output()

    def launch(_):
        # like lesson 8's ranks: a process per press
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        with out:
            print("ran")

    def fail(_):
        raise RuntimeError("observer failed")  # an error that escapes the callback: nothing redraws

    crash = w.ToggleButton(description="crash")
    crash.observe(fail, names="value")
    run.on_click(launch)
    return w.VBox([text, run, crash, w.IntSlider(disabled=True), w.Label("not a control"), out])
"""


def _cell(source, outputs=()):
    return {
        "cell_type": "code",
        "execution_count": 1,
        "id": str(abs(hash(source))),
        "metadata": {},
        "outputs": list(outputs),
        "source": source.splitlines(keepends=True),
    }


def _shown(text_plain):
    """A saved display of a widget (or of a progress bar, whose text is not a widget's repr)."""
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {
            "application/vnd.jupyter.widget-view+json": {
                "model_id": "0",
                "version_major": 2,
                "version_minor": 0,
            },
            "text/plain": text_plain,
        },
    }


def _scratch_notebook(path):
    cells = [
        _cell(
            "%matplotlib inline\nimport torch\nfrom scratch_lesson import compute\nimport scratch_lesson as "
            "sl\ndevice = 'cpu'"
        ),
        _cell(
            "r = compute(2, 'b', False)\nsl.widget(device=device, initial=r)",
            [_shown("VBox(children=(IntSlider(value=2),))")],
        ),
        # not named like a builder: found by its output
        _cell("panel = sl.run_box()\npanel", [_shown("VBox(children=(Text(value='x'),))")]),
        # a progress bar: not a widget
        _cell("sl.compute(2, 'b', False)", [_shown("  0%|          | 0/8 [00:00<?, ?it/s]")]),
        _cell("sl.widget(device=device, initial=r)"),  # the same call again: one widget
    ]
    nb = {
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def test_widget_discovery_names_every_builder_and_nothing_else(tmp_path):
    found, unnamed = widgets.discover([_scratch_notebook(tmp_path / "01_scratch.ipynb")])
    # scratch_lesson is not under accumlib, so discovery ignores it: the notebooks import lessons from
    # accumlib
    assert found == [] and unnamed == ["01_scratch.ipynb cell 1", "01_scratch.ipynb cell 2"]
    nb = tmp_path / "02_scratch.ipynb"
    nb.write_text(
        (tmp_path / "01_scratch.ipynb")
        .read_text()
        .replace("scratch_lesson", "accumlib_course.lessons.scratch")
    )
    found, unnamed = widgets.discover([nb])
    assert [(f.module, f.builder, f.cell, f.main) for f in found] == [
        ("accumlib_course.lessons.scratch", "widget", 1, True),
        ("accumlib_course.lessons.scratch", "run_box", 2, False),
    ]
    assert dict(found[0].kwargs) == {"device": widgets._DEVICE, "initial": widgets._VARIABLE}
    assert unnamed == []


def test_every_control_of_a_widget_is_found_with_a_change():
    import ipywidgets as w

    kinds = [
        w.IntSlider(value=3, max=3),
        w.FloatSlider(value=0.5),
        w.FloatLogSlider(value=0.1, min=-3, max=0),
        w.Dropdown(options=[1, 2], value=2),
        w.SelectionSlider(options=["a", "b", "c"], value="a"),
        w.ToggleButtons(options=["x", "y"]),
        w.Checkbox(value=True),
        w.ToggleButton(),
        w.Text("t"),
        w.Textarea("loop"),
        w.BoundedIntText(value=5, max=5),
        w.IntRangeSlider(value=(1, 3), max=5),
        w.Button(description="Run"),
    ]
    box = w.VBox([w.HBox(kinds[:5]), w.Label("label"), w.IntSlider(disabled=True), *kinds[5:], w.Output()])
    controls = widgets._controls(box)
    # buttons last; the label, the disabled slider and the output are not controls
    assert [c for _, c in controls] == kinds
    for _, c in controls:
        how, a, b = widgets._values(c)
        if how == "press":
            continue
        assert a != b, c
        setattr(c, how, b)  # a valid value: the widget accepts it unchanged
        assert getattr(c, how) == b or math.isclose(getattr(c, how), b), c
    assert widgets._values(w.IntSlider(value=3, max=3))[1:] == (3, 2)  # at the end of its range it steps back


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory):
    """The section run on the scratch lesson, in a real kernel, two changes per control (a few seconds)."""
    tmp = tmp_path_factory.mktemp("widgets")
    (tmp / "scratch_lesson.py").write_text(SCRATCH_LESSON)
    nb = _scratch_notebook(tmp / "01_scratch.ipynb")
    found = [
        widgets.Found(
            nb.name,
            1,
            "scratch_lesson",
            "widget",
            (),
            (("device", widgets._DEVICE), ("initial", widgets._VARIABLE)),
            True,
        ),
        widgets.Found(nb.name, 2, "scratch_lesson", "run_box", (), (), False),
    ]
    mp = pytest.MonkeyPatch()
    # the kernel imports the scratch lesson
    mp.setenv("PYTHONPATH", f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    mp.setattr(widgets, "discover", lambda paths: (found, []))
    try:
        yield widgets.measure([nb], threads=1, repeats=2)
    finally:
        mp.undo()


def test_widget_section_gives_one_row_per_control_with_a_median(scratch_run):
    rows = {r["control"]: r for r in scratch_run["rows"]}
    assert list(rows) == ["k", "option", "broken", "name", "crash", "Run"]
    for r in rows.values():
        assert _finite(r["median_s"]) and r["n"] == len(r["times_s"]) >= 1, r
        assert r["first_s"] == r["times_s"][0]
    # a redraw: a figure, two changes (first and repeat), judged against the goal
    for name in ("k", "option"):
        assert (
            rows[name]["shown"] == "figure"
            and rows[name]["n"] == 2
            and rows[name]["status"] in ("met", "MISSED")
        )
        assert len(rows[name]["quartiles_s"]) == 2 and rows[name]["processes"] == 0
    assert rows["option"]["change"] == "'b' <-> 'a'"
    assert (
        rows["broken"]["status"] == "ERROR"
        and "ValueError: broken must be False" in rows["broken"]["errors"][0]
    )
    assert rows["name"]["status"] == "no redraw"
    assert (
        rows["crash"]["status"] == "ERROR" and rows["crash"]["errors"][0] == "RuntimeError: observer failed"
    )
    assert rows["Run"]["status"] == "exempt" and rows["Run"]["processes"] >= 1 and rows["Run"]["n"] == 1
    goal = scratch_run["goals"]["widget"]
    assert goal["met"] is False  # the ERROR control misses the goal, whatever the times
    assert any("broken" in m for m in goal["missed"]) and "exempt" in goal["measured"]


def test_widget_section_table_states_each_control(scratch_run):
    md = "\n".join(widgets.lines(scratch_run))
    for control in ("k (IntSlider)", "option (Dropdown)", "broken (Checkbox)"):
        assert f"| {control} |" in md
    assert "**ERROR**" in md and "Exempt from the 0.5 s goal" in md and "Run (Button)" in md
    assert "No redraw on change" in md and "name" in md


# --- section 11, kernel memory after Run All (benchmarks/kernel_memory.py) ----------------------------------

kernel_memory = bench.MODULES["kernel_memory"]
proc = sys.modules["_kernel_memory_proc"]  # the helper bench.py's sections loaded
MIB = proc.MIB

# A process that allocates 100 MiB (written, so resident) and frees it ("free") or keeps it ("hold"), or
# allocates nothing ("control"); it waits on stdin before and after, so the test reads /proc at known moments.
HOLDER = """
import sys
print("baseline", flush=True)
sys.stdin.readline()
if sys.argv[1] != "control":
    b = bytearray(b"x") * (100 * 2**20)
if sys.argv[1] == "free":
    del b  # the peak keeps it, the resident set does not
print("done", flush=True)
sys.stdin.readline()
"""

# A parent that runs HOLDER as its child (stdin and stdout shared) and waits: the child's memory is not
# its own.
PARENT = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], check=True)
"""


def _run_holder(argv, read):
    """Start ``argv``, call ``read(pid, step)`` at "baseline" and at "done", return what it returned."""
    import subprocess

    p = subprocess.Popen(
        [sys.executable, "-c", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline() == "baseline\n"
        before = read(p.pid, "baseline")
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline() == "done\n"
        return before, read(p.pid, "done")
    finally:
        p.stdin.close()
        assert p.wait() == 0


@pytest.mark.parametrize("mode", ["free", "control"])
def test_the_peak_reader_sees_a_freed_100_mib_and_the_control_does_not(mode):
    base, after = _run_holder([HOLDER, mode], lambda pid, step: proc.status(pid))
    rise = (after["peak"] - base["rss"]) / MIB
    held = (after["rss"] - base["rss"]) / MIB
    assert base["peak"] >= base["rss"] > 0 and 0 < after["anon"] <= after["rss"]
    if mode == "free":
        # 1 MiB: pages the interpreter hands back between the two readings (99.8 MiB seen on 100)
        assert rise >= 100 - 1, rise
    else:
        assert rise < 20, rise  # a few MiB of interpreter work, far from the 100 MiB
    assert held < 20, held  # freed either way: what a process holds is not its peak


@pytest.mark.parametrize("mode", ["hold", "free"])
def test_the_private_reader_counts_what_the_process_holds_alone(mode):
    base, after = _run_holder([HOLDER, mode], lambda pid, step: (proc.private(pid), proc.status(pid)))
    rise = (after[0] - base[0]) / MIB
    assert 0 < base[0] <= base[1]["rss"] and after[0] <= after[1]["rss"]  # private is part of resident
    if mode == "hold":
        assert rise >= 100 - 1, rise  # the written bytearray is the process's alone (1 MiB as above)
    else:
        assert rise < 20, rise  # freed: no longer held, whatever the peak


@pytest.mark.parametrize("mode", ["hold", "control"])
def test_the_tree_adds_a_child_that_the_parent_peak_leaves_out(mode):
    tree = None

    def read(pid, step):
        nonlocal tree
        tree = tree or proc.Tree(pid)
        tree.sample()  # by hand, at a known moment: no sampling thread, nothing timed
        return proc.status(pid)["peak"]

    _, parent_peak = _run_holder([PARENT, HOLDER, mode], read)
    assert len(tree.children) == 1 and tree.samples == 2 and tree.most_children == 1
    (child_peak,) = tree.children.values()
    assert parent_peak / MIB < 60  # the parent never held the 100 MiB
    if mode == "hold":
        assert child_peak / MIB >= 100 - 1 and tree.children_peak / MIB >= 100 - 1  # 1 MiB as above
        assert tree.peak >= tree.children_peak + 5 * MIB  # the parent's interpreter beside it
    else:
        assert child_peak / MIB < 60 and tree.children_peak / MIB < 60 and tree.peak / MIB < 120


def test_the_tree_leaves_out_the_children_it_is_told_were_there_before():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = proc.Tree(os.getpid(), exclude=frozenset(proc.children(os.getpid())))
        assert child.pid in tree.exclude
        tree.sample()  # by hand: nothing timed
        assert tree.children == {} and tree.most_children == 0 and tree.children_peak == 0
    finally:
        child.kill()
        child.wait()


def test_kernel_memory_is_a_section_and_its_quick_run_sees_the_freed_allocation(quick_run):
    assert "kernel_memory" in bench.SECTIONS and kernel_memory.NAME == "kernel_memory"
    _, report = quick_run
    res = report["sections"]["kernel_memory"]
    (row,) = res["rows"]
    assert row["notebook"] == "quick_check.ipynb" and row["errors"] == [] and row["processes"] == 0
    # the kernel allocated and freed QUICK_MIB in two cells: its peak keeps it, its resident set does not
    assert row["peak_mib"] - row["held_mib"] >= kernel_memory.QUICK_MIB - 1
    assert row["start_mib"] <= row["held_mib"] and row["held_private_mib"] <= row["held_mib"]
    assert 0 < row["kernel_private_mib"] <= row["private_mib"] <= row["held_mib"] + 1  # 1: read later
    assert row["private_mib"] < row["peak_mib"] - kernel_memory.QUICK_MIB + 1  # freed: not private any more
    # its route: the notebook twice in order, one kernel at a time, with a real Jupyter server beside it
    route = res["route"]
    assert route["notebooks"] == ["quick_check.ipynb"] * 2 and route["most_kernels_alive"] == 1, route
    assert route["kernels_peak_mib"] >= row["peak_mib"] - 1 and route["server"]["peak_mib"] > 0
    assert route["total_mib"] == route["kernels_peak_mib"] + route["server"]["peak_mib"]
    assert "REST API" in route["server"]["how"]
    for key in ("kernel_memory", "kernel_memory_route"):
        assert res["goals"][key]["met"] is None  # --quick: never a verdict


def test_kernel_memory_table_states_each_notebook_its_processes_and_the_route():
    row = dict(
        start_mib=60.0,
        held_private_mib=150.0,
        private_mib=280.0,
        kernel_private_mib=280.0,
        kernel_private_clean_mib=3.0,
        live_processes=0,
        processes=0,
        wall_s=2.0,
        errors=[],
    )
    res = {
        "rows": [
            row | {"notebook": "notebooks/01_a.ipynb", "peak_mib": 410.4, "held_mib": 400.0, "met": True},
            row
            | {
                "notebook": "notebooks/08_b.ipynb",
                "peak_mib": 420.0,
                "held_mib": 390.0,
                "private_mib": 320.0,
                "live_processes": 1,
                "met": False,
                "processes": 2,
                "with_processes_peak_mib": 950.0,
            },
            {"notebook": "notebooks/09_c.ipynb", "not_available": "RuntimeError: no kernel"},
        ],
        "route": {
            "route": "short",
            "notebooks": ["00", "01"],
            "kernels_peak_mib": 450.0,
            "most_kernels_alive": 1,
            "samples": 99,
            "server": {"peak_mib": 105.0, "held_mib": 100.0, "private_mib": 87.0, "how": "a server"},
            "total_mib": 555.0,
            "met": True,
            "errors": [],
        },
        "open_tabs": [{"route": "short", "notebooks": ["00", "01"], "held_mib": 690.0, "private_mib": 300.0}],
        "floor": row | {"notebook": "floor.ipynb", "peak_mib": 399.6, "held_mib": 398.0, "met": True},
    }
    md = "\n".join(kernel_memory.lines(res))
    assert "| 01_a | 280 |  | 3 | 410 | 400 | 0 |  | 2.0 | met |" in md
    assert "| 08_b | 320 | 40 | 3 | 420 | 390 | 2 | 950 | 2.0 | **MISSED** |" in md
    assert (
        "The short route (00, 01, in order" in md and "held at most 450 MiB resident at once (1 alive" in md
    )
    assert "with the Jupyter server's 105 MiB (a server; 87 MiB of it private once idle): **555 MiB**" in md
    assert "would hold 690 MiB resident together (300 MiB of it private)" in md
    assert "not available: notebooks/09_c.ipynb: RuntimeError: no kernel" in md
    assert "holds 280 MiB private after its cells, and peaks at 400 MiB resident" in md
    assert "| floor |" not in md  # a reference, not a row judged against the goal


def test_kernel_memory_route_goal_refuses_two_kernels_alive_at_once():
    walk = {
        "route": "short",
        "notebooks": ["00", "01"],
        "kernels_peak_mib": 450.0,
        "most_kernels_alive": 2,
        "server": {"peak_mib": 105.0},
        "total_mib": 555.0,
        "met": True,
        "errors": [],
    }
    goal = kernel_memory._route_goal(walk)
    assert goal["met"] is False and "2 kernels alive at once" in goal["missed"][0]
    assert kernel_memory._route_goal(walk | {"most_kernels_alive": 1})["met"] is True
    assert kernel_memory._route_goal(None)["met"] is None


def test_kernel_memory_refuses_a_prefix_that_names_no_notebook(capsys):
    import kernel_memory

    with pytest.raises(SystemExit) as exit_:
        kernel_memory.main(["99"])
    assert exit_.value.code == 2
    assert "notebooks must name prefixes of notebooks/*.ipynb (got 99)" in capsys.readouterr().err


def test_run_nanogpt_says_not_available_without_a_clone_and_measures_with_one(monkeypatch):
    """nanoGPT's files are never committed: without ACCUMLIB_NANOGPT_SRC the section says so instead of
    printing a number; with a clone, its quick run gives finite figures and the engine's exact bytes."""
    section = bench.MODULES["run_nanogpt"]
    clone = os.environ.get("ACCUMLIB_NANOGPT_SRC")
    monkeypatch.delenv("ACCUMLIB_NANOGPT_SRC", raising=False)
    res = section.run(quick=True)
    assert "ACCUMLIB_NANOGPT_SRC" in res["not_available"] and "rows" not in res
    if not clone:
        pytest.skip("set ACCUMLIB_NANOGPT_SRC to a nanoGPT clone to measure the section")
    monkeypatch.setenv("ACCUMLIB_NANOGPT_SRC", clone)
    res = section.run(quick=True)
    (row,) = res["rows"]
    assert all(_finite(row[f]) for f in ("alone_s", "watch_s", "ratio")), row
    assert row["extra_over_params"] == 1.0 and row["verdict_ok"], row  # one float32 sum per parameter
