"""Lesson 8 (distributed): compute against the oracle, bad values, the figure, the Run widget, the crash.

One spawned group of 2 ranks (module fixture) feeds every test that needs a result; the
widget test spawns once more (world size 1) to press Run for real.

The crash of issue 12: in JupyterLab the Run button's callback runs in a kernel subshell's
thread (see the comment above ``DistributedWidget`` in ``accumlib_course/lessons/distributed.py``)
while the main thread's inline backend draws pyplot figures, and two threads laying out
mathtext at once break matplotlib's one shared parser. ``test_the_old_drawing_crashes_*``
reproduces that race; ``test_the_widget_drawing_does_not_crash_*`` runs the new drawing
under the same stress.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from accumlib_course import _style
from accumlib_course.distributed import FLOAT32_RTOL
from accumlib_course.distributed.experiment import COMM_VARIANTS, PER_RANK_MIN_ERROR
from accumlib_course.lessons import distributed as lesson

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "08_distributed.ipynb"
# How long the race harness may take to show the old crash (measured: 0.2-0.5 s on 2 loaded cores),
# and how long the new drawing must survive the same stress.
RACE_BUDGET_S = 20.0
STRESS_S = 4.0


@pytest.fixture(scope="module")
def result() -> lesson.DistributedResult:
    return lesson.compute(world_size=2, accum_steps=4, ks=(1, 2, 4, 8))


# --- compute ------------------------------------------------------------------------------------


def test_global_counts_give_the_large_batch_gradient_and_per_rank_counts_do_not(result):
    # every step, every rank, against the float64 oracle
    assert result.reference.max_rel_error <= FLOAT32_RTOL
    assert all(min(step) > PER_RANK_MIN_ERROR for step in result.per_rank.rel_errors)  # wrong at every step
    # ... in exactly the predicted way: DDP's mean of each rank's own window mean
    assert max(max(step) for step in result.per_rank.rel_to_rank_means) <= FLOAT32_RTOL
    assert all(spread == 0.0 for r in (result.reference, result.per_rank) for spread in r.param_spread)
    # ranks hold different token counts
    assert all(len(set(items)) > 1 for items in result.reference.window_items)


def test_no_sync_pays_one_round_per_step_and_the_mistakes_pay_k(result):
    import accumlib

    n_params = sum(p.numel() for p in accumlib.get_task("lm-tokens").make_model(0).parameters())
    assert result.ks == (1, 2, 4, 8)
    assert result.bytes_per_step("no_sync") == [4 * n_params] * len(result.ks)
    assert result.bytes_per_step("every micro-batch") == [4 * n_params * k for k in result.ks]
    assert (
        result.calls_per_step("no_sync on backward only")
        == result.calls_per_step("every micro-batch")
        == list(result.ks)
    )


def test_tables_hold_the_measured_numbers(result):
    table = result.table()
    assert table.header == ("k", *COMM_VARIANTS) and len(table.rows) == len(result.ks)
    assert "<table>" in table._repr_html_()
    steps = result.error_table().rows
    assert [float(r[1]) for r in steps] == [float(f"{max(s):.1e}") for s in result.reference.rel_errors]
    tokens = result.token_table().rows
    assert [int(r[2]) for r in tokens] == [sum(i) for i in result.reference.window_items]


def test_compute_is_cached_per_setting(result):
    # same setting: no new spawn
    assert lesson.compute(world_size=2, accum_steps=4, ks=[8, 4, 2, 1]) is result


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(world_size=0), r"world_size must be an integer between 1 and \d+; .* \(got 0\)"),
        (dict(world_size=2.0), r"world_size must be an integer .* \(got 2.0 of type float\)"),
        (
            dict(world_size=10_000),
            r"world_size must be an integer between 1 and \d+; the ranks this machine holds .* \(got 10000\)",
        ),
        (
            dict(accum_steps=0),
            r"accum_steps must be an integer between 1 and 8; the micro-batches each rank holds .* \(got 0\)",
        ),
        (dict(accum_steps=9), r"accum_steps must be an integer between 1 and 8; .* \(got 9\)"),
        (
            dict(world_size=4, accum_steps=8),
            r"accum_steps must be an integer between 1 and 4; .*lm-tokens on 4 ranks.* \(got 8\)",
        ),
        (dict(ks=()), r"ks must be a non-empty sequence of integers \(got \(\)\)"),
        (dict(ks=(1, 0)), r"ks\[1\] must be an integer between 1 and 8; .* \(got 0\)"),
        (dict(ks=(1, 16)), r"ks\[1\] must be an integer between 1 and 8; .* \(got 16\)"),
        (dict(task="cifar"), r"task must be one of .*'lm-tokens'.* \(got 'cifar'\)"),
        (dict(timeout=0), r"timeout must be a number > 0 \(got 0\)"),
    ],
)
def test_bad_values_are_refused_before_any_rank_starts(kwargs, message, monkeypatch):
    monkeypatch.setattr(
        lesson, "run_specs", lambda *a, **k: pytest.fail("spawned ranks before checking the arguments")
    )
    with pytest.raises(ValueError, match=message):
        lesson.compute(**kwargs)


# --- the figure ---------------------------------------------------------------------------------


def test_plot_is_readable_and_says_what_it_shows(result):
    fig = lesson.plot(result)
    assert min(_style.font_sizes(fig)) >= _style.MIN_FONT_PT
    assert "no_sync" in fig.get_suptitle() and "token count" in fig.get_suptitle()
    left, right = fig.axes[:2]
    assert left.get_title() and right.get_title()
    assert [t.get_text() for t in left.get_legend().get_texts()] == list(COMM_VARIANTS)
    # no contrast by colour alone: the two error bars differ in hatching, the lines in marker and style
    bars = [c for c in right.containers]
    assert bars[0][0].get_hatch() != bars[1][0].get_hatch()
    lines = left.get_lines()
    assert len({(ln.get_marker(), str(ln.get_linestyle())) for ln in lines}) == len(lines)
    assert "#D62728" not in {str(ln.get_color()).upper() for ln in lines}  # no tab:red


def test_plot_needs_neither_pyplot_nor_mathtext(result, monkeypatch):
    """By construction: drawing the lesson's figure never enters Gcf nor matplotlib's shared mathtext
    parser.
    """
    from matplotlib import mathtext

    def refuse(*args, **kwargs):
        raise AssertionError("mathtext was used to draw lesson 8's figure")

    monkeypatch.setattr(mathtext.MathTextParser, "parse", refuse)
    fig = lesson.plot(result)
    assert fig.canvas.manager is None  # not a pyplot figure: the inline backend's flush never sees it
    assert _style.png(fig)[:4] == b"\x89PNG"
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert not any("$" in t for t in texts)


def test_plot_mathtext_guard_can_fail(monkeypatch):
    """The guard above does catch mathtext: a log axis drawn the default way trips it."""
    from matplotlib import mathtext

    fig, ax = _style.figure()
    ax.set_yscale("log")
    ax.set_ylim(1e-8, 1e-1)  # LogFormatterSciNotation writes '10^k' as mathtext, whatever the style says

    def refuse(*args, **kwargs):
        raise AssertionError("mathtext")

    monkeypatch.setattr(mathtext.MathTextParser, "parse", refuse)
    with pytest.raises(AssertionError, match="mathtext"):
        _style.png(fig)


# --- the crash of issue 12, reproduced and gone -------------------------------------------------


def _old_drawing(i: int) -> None:
    """What the old widget did in the callback's thread, and what the inline backend's flush did
    with the same pyplot figure in the main thread: a pyplot figure, log axis (mathtext '10^k'
    ticks), tight_layout, then a render. A new dpi per call misses MathTextParser's lru_cache,
    as a new render size does."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    try:
        ax.set_yscale("log")
        ax.bar([1, 2], [1e-7 * (i % 7 + 1), 2e-2])
        fig.set_dpi(50 + i % 97)
        fig.tight_layout()
        fig.savefig(io.BytesIO(), format="png")
    finally:
        plt.close(fig)


def _race(first, second, seconds: float) -> list[BaseException]:
    errors: list[BaseException] = []

    def loop(draw) -> None:
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end and not errors:
            try:
                draw(i)
            except Exception as e:  # noqa: BLE001 - the race's error is what we look for
                errors.append(e)
            i += 1

    threads = [threading.Thread(target=loop, args=(fn,)) for fn in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_the_old_drawing_crashes_when_two_threads_draw():
    """The harness reproduces issue 12's error: two threads laying out mathtext at once."""
    errors = _race(_old_drawing, _old_drawing, RACE_BUDGET_S)
    assert errors, f"no crash in {RACE_BUDGET_S} s: the harness no longer reproduces the race"
    # The shared parser's state is torn in more than one way: a popped empty stack (what the
    # workshop saw), or a half-built parse that no longer knows \mathdefault (seen in CI). Both
    # are pyparsing errors raised from mathtext, and neither happens with one thread.
    import pyparsing

    chain: list[BaseException] = []
    e: BaseException | None = errors[0]
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert any(
        isinstance(c, pyparsing.ParseBaseException) or "pop from empty list" in str(c) for c in chain
    ), [f"{type(c).__name__}: {c}" for c in chain]


def test_the_old_drawing_alone_does_not_crash():
    """The negative case: the same drawing in one thread is sound, so the crash above is the race."""
    for i in range(40):
        _old_drawing(i)


def test_the_widget_drawing_does_not_crash_beside_a_pyplot_thread(result):
    """The same stress with the callback's new drawing: the inline backend may draw pyplot figures
    with mathtext in the main thread, the widget's thread never touches that parser."""

    def widget_drawing(i: int) -> None:
        fig = lesson.plot(result)
        _style.output(fig, alt="stress")

    assert _race(_old_drawing, widget_drawing, STRESS_S) == []
    assert _race(widget_drawing, widget_drawing, STRESS_S) == []


# --- the widget, driven without a browser -------------------------------------------------------


def _images(panel) -> list[dict]:
    return [o for o in panel.out.outputs if "image/png" in o.get("data", {})]


def test_widget_shows_the_notebooks_result_and_changing_a_control_runs_nothing(result, monkeypatch):
    panel = lesson.widget(initial=result)
    assert panel.result is result and len(_images(panel)) == 1
    assert 'alt="' in _images(panel)[0]["data"]["text/html"]
    monkeypatch.setattr(lesson, "compute", lambda **kw: pytest.fail("a control change must not spawn ranks"))
    panel.world_size.value = 1
    assert "about 9 s" in panel.status.value  # the time it will take, stated before Run
    panel.accum_steps.value = result.accum_steps
    panel.world_size.value = result.world_size
    assert "Already run" in panel.status.value
    panel.out.outputs = ()
    panel.run.click()  # cached: redrawn at once
    assert panel.error == "" and len(_images(panel)) == 1 and panel.progress.value == panel.STAGES


def test_pressing_run_spawns_the_ranks_and_draws_the_figure(monkeypatch):
    panel = lesson.widget()
    panel.world_size.value, panel.accum_steps.value = 1, 2
    seen = {}
    real = lesson.compute

    def watched(**kwargs):
        seen.update(
            disabled=panel.run.disabled,
            progress=panel.progress.value,
            status=panel.status.value,
            kwargs=kwargs,
        )
        return real(**kwargs)

    monkeypatch.setattr(lesson, "compute", watched)
    panel.run.click()
    assert panel.error == "", panel.error
    # busy while the ranks run
    assert seen["disabled"] and seen["progress"] == 1 and "about" in seen["status"]
    assert seen["kwargs"] == dict(world_size=1, accum_steps=2, ks=(1, 2, 4, 8))
    assert (
        not panel.run.disabled
        and panel.progress.value == panel.STAGES
        and panel.progress.bar_style == "success"
    )
    assert len(_images(panel)) == 1 and panel.result.accum_steps == 2 and panel.result.world_size == 1
    assert panel.result.reference.max_rel_error <= FLOAT32_RTOL
    assert "Done in" in panel.status.value


def test_a_failed_run_is_shown_in_the_widget_and_the_button_comes_back(monkeypatch):
    panel = lesson.widget()

    def broken(**kwargs):
        raise RuntimeError("rank 1 died")

    monkeypatch.setattr(lesson, "compute", broken)
    panel.run.click()
    assert panel.error == "RuntimeError: rank 1 died" and "Failed" in panel.status.value
    assert not panel.run.disabled and panel.progress.bar_style == "danger"
    assert "rank 1 died" in panel.out.outputs[0]["text"]


def test_widget_refuses_settings_it_cannot_run():
    with pytest.raises(
        ValueError, match=r"accum_steps\[\d\] must be an integer between 1 and 6; .* \(got 8\)"
    ):
        lesson.widget(accum_steps=(1, 8))


# --- the exercise: the learner's own DDP loop on 2 real ranks ---------------------------------------
#
# Every answer below runs in ONE launch (``lesson.check_all``): the ranks' start-up (~6 s) dominates.

SOLUTION = NOTEBOOK.parent / "solutions" / f"{lesson.EXERCISE.name}.py"
RIGHT = "loss = token_losses.sum() * dist.get_world_size() / n_global"
SYNC_LAST = "with contextlib.nullcontext() if last else ddp.no_sync():"
ANSWERS = {  # name -> (what replaces what in the solution, or None for the notebook's starting cell)
    "starting cell": None,
    "solution": {},
    "share N / R": {RIGHT: "loss = token_losses.sum() / (n_global / dist.get_world_size())"},
    "no no_sync": {SYNC_LAST: "with contextlib.nullcontext():"},
    "forgets R": {RIGHT: "loss = token_losses.sum() / n_global"},
    "divides by R again": {RIGHT: RIGHT + " / dist.get_world_size()  # 'average over the ranks'"},
    "no_sync everywhere": {SYNC_LAST: "with ddp.no_sync():"},
    "no sampler": {"sampler=sampler, ": ""},
    "micro-batch means": {RIGHT: "loss = token_losses.mean() / K"},
    "typo": {RIGHT: "loss = token_losses.sum() * dist.get_world_size() / n_globl"},
}


def _starting_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells if "exercise" in c.get("metadata", {}).get("tags", [])]
    return source.replace("distributed.EXERCISE.check(train_fn)", "")


def _loop(name: str, source: str):
    """``train_fn`` of ``source``, exec'd the way a kernel runs a cell (its lines kept for tracebacks)."""
    import linecache

    filename = f"<answer {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["train_fn"]


def _answer(name: str):
    edits = ANSWERS[name]
    if edits is None:
        return _loop(name, _starting_cell())
    source = SOLUTION.read_text()
    for old, new in edits.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return _loop(name, source)


@pytest.fixture(scope="module")
def grades() -> dict:
    start = time.perf_counter()
    found = lesson.check_all([_answer(name) for name in ANSWERS])
    print(f"{len(ANSWERS)} answers graded on 2 ranks in {time.perf_counter() - start:.1f} s")
    return dict(zip(ANSWERS, found))


def test_the_starting_loop_reads_per_rank_mean_with_a_staged_hint(grades):
    g = grades["starting cell"]
    assert not g.ok and g.codes == ("per-rank-mean",), g
    assert g.stages == lesson.EXERCISE.hints["per-rank-mean"] and len(g.stages) == 3
    page = g._repr_html_()
    assert page.count("<details>") == 3 and "Still stuck? Hint 3" in page
    assert page.index(g.stages[0][:30]) < page.index(g.stages[1][:30]) < page.index(g.stages[2][:30])
    assert "fix:" not in str(g) and "average_tokens_across_devices" not in page  # verify's fix is the answer


@pytest.mark.parametrize("name", ["solution", "share N / R"])
def test_right_answers_pass(grades, name):
    g = grades[name]
    assert g.ok and not g.codes and not g.costs, g
    assert all(s.rel_error < FLOAT32_RTOL for s in g.report.steps)


def test_syncing_every_micro_batch_passes_at_a_cost(grades):
    g = grades["no no_sync"]
    assert g.ok and g.costs and g.costs[0].startswith("[sync-every-micro-batch]"), g
    assert "At a cost" in str(g) and "At a cost" in g._repr_html_()


@pytest.mark.parametrize("name", ["forgets R", "divides by R again"])
def test_a_loss_divided_by_r_once_too_often_is_misscaled_one_over_r(grades, name):
    g = grades[name]
    assert not g.ok and g.codes == ("misscaled",), g
    assert "c = 1/R" in g.messages[0] and g.stages == lesson.EXERCISE.hints["misscaled"]
    assert all(abs(s.factor - 0.5) < 1e-4 for s in g.report.steps)


@pytest.mark.parametrize(
    "name,code", [("no_sync everywhere", "ranks-diverged"), ("no sampler", "unsharded-data")]
)
def test_communication_and_sharding_mistakes_get_their_own_hint(grades, name, code):
    g = grades[name]
    assert not g.ok and code in g.codes, g
    assert g.hint == lesson.EXERCISE.hints[code]


def test_micro_batch_means_are_not_passed(grades):
    g = grades["micro-batch means"]
    assert not g.ok and g.hint, g


def test_an_error_in_the_loop_comes_back_as_feedback_with_its_line(grades):
    g = grades["typo"]
    assert not g.ok and g.report is None
    assert g.error.startswith("NameError: name 'n_globl' is not defined (in train_fn, line "), g.error
    assert "/ n_globl)" in g.error
    assert (
        str(g).startswith(f"{lesson.EXERCISE.name}: your code raised NameError")
        and g.hint == lesson.EXERCISE.hints["error"]
    )


def test_a_loop_that_never_ends_is_stopped_and_said_so():
    import multiprocessing

    from accumlib_course.lessons import _distributed_exercise

    source = "import time\n\ndef train_fn(model, optimizer, loader):\n    time.sleep(3600)\n"
    start = time.perf_counter()
    # 8 s: past the ranks' start on an idle machine; on a busy one they may still be importing when
    # stopped, which is the same timeout to the learner
    (result,) = _distributed_exercise.grade([_loop("sleeps", source)], k=lesson.EXERCISE_K, timeout=8)
    assert time.perf_counter() - start < 30
    assert isinstance(result, _distributed_exercise.LoopFailed) and result.feedback.startswith(
        "TimeoutError: the ranks did not finish"
    )
    assert not multiprocessing.active_children()


def test_what_cannot_travel_to_the_ranks_is_refused_or_named():
    from accumlib_course.lessons import _distributed_exercise

    def outer():
        k = 3

        def inner(model, optimizer, loader):
            return k

        return inner

    with pytest.raises(TypeError, match="top level of a cell"):
        _distributed_exercise.ship(outer())
    namespace: dict = {}
    exec(
        "import threading\nLOCK = threading.Lock()\ndef helper():\n    return LOCK\ndef train_fn(model, "
        "optimizer, loader):\n    return helper()\n",
        namespace,
    )
    shipped = _distributed_exercise.ship(namespace["train_fn"])
    assert set(shipped.functions) == {"train_fn", "helper"} and "LOCK" in shipped.missing
    rebuilt = _distributed_exercise.rebuild(shipped)
    with pytest.raises(NameError) as err:
        rebuilt(None, None, None)
    assert "LOCK was not sent to the ranks: a lock cannot be sent" in _distributed_exercise.feedback(
        err.value, shipped
    )


def test_no_cell_of_notebook_8_holds_an_answer():
    cells = [
        "".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"
    ]
    assert not any("expected =" in c or "n_global" in c for c in cells)
    assert sum("distributed.EXERCISE.check(train_fn)" in c for c in cells) == 1
