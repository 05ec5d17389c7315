"""Lesson 8: gradient accumulation under DistributedDataParallel, measured on real ranks.

``compute(world_size, accum_steps, ks) -> DistributedResult`` spawns one group of
``world_size`` ranks (gloo on loopback) and runs in it the three communication variants
at every k in ``ks`` (counting what DDP all-reduces) and, at ``accum_steps``, the
reference loop and the per-rank-count mistake, each checked against the oracle (the
float64 large-batch gradient over every rank's window) at every optimizer step.
``plot(result)`` draws both; ``widget()`` re-runs them behind a Run button.

The identity on R ranks, N items over all ranks' windows (DDP averages over ranks):

    grad (1/N) sum_r sum_{i in window_r} l_i  ==  (1/R) sum_r sum_j grad( (R/N) sum_{i in b_rj} l_i )

``EXERCISE`` asks the learner to write that normalization in their own DDP loop, which runs on 2
real gloo ranks (``_distributed_exercise`` sends it there) under ``accumlib.verify(..., ranks="all")``; its
solution is ``notebooks/solutions/08-count-tokens-across-ranks.py``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from accumlib.checks import check_choice, check_float, check_int, check_ints
from accumlib.distributed.launch import max_world_size
from accumlib.tasks import TASKS, get_task
from accumlib_course.distributed.experiment import COMM_VARIANTS, RunResult, RunSpec, run_specs, shard_loader

from .. import _style
from . import _distributed_exercise
from ._distributed_figure import DistributedResult, plot
from ._exercise import Exercise

TASK = "lm-tokens"  # sequences of 4 to 40 tokens: the ranks hold different token counts
DEFAULT_KS = (1, 2, 4, 8)  # lm-tokens on 2 ranks: 8 micro-batches each, so k = 8 is one step

# What the Run button costs, measured (compute(), idle 2-core CPU, lm-tokens, the widget's ks):
# world size 1: 9.4 s, 2: 10.6 s, 3: 17.2 s. Start-up of the ranks (importing torch) dominates.
MEASURED_RUN_S = {1: 9, 2: 11, 3: 17}


@functools.lru_cache(maxsize=8)
def micro_batches_per_rank(world_size: int, task: str = TASK) -> int:
    """Micro-batches each rank's shard holds: no window can be longer."""
    return len(shard_loader(get_task(task), 0, world_size))


def compute(
    world_size: int = 2,
    accum_steps: int = 4,
    ks: Sequence[int] = DEFAULT_KS,
    task: str = TASK,
    timeout: float = 300.0,
) -> DistributedResult:
    """Run the lesson's experiments in ONE spawned group; every number the notebook states comes from here.

    Results are cached per argument set, so the widget redraws a setting it has run before at once.

    >>> compute(world_size=0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must be an integer between 1 and ... (got 0)
    """
    world_size = check_int(
        "world_size",
        world_size,
        low=1,
        high=max_world_size(),
        why="the ranks this machine holds (8 per core, 512 MiB each)",
    )
    task = check_choice("task", task, sorted(TASKS))
    per_rank = micro_batches_per_rank(world_size, task)
    why = f"the micro-batches each rank holds ({task} on {world_size} ranks)"
    accum_steps = check_int("accum_steps", accum_steps, low=1, high=per_rank, why=why)
    ks = check_ints("ks", ks, low=1, high=per_rank, why=why)
    timeout = check_float("timeout", timeout, low=0, low_open=True)
    return _run(world_size, accum_steps, ks, task, timeout)


@functools.lru_cache(maxsize=16)
def _run(
    world_size: int, accum_steps: int, ks: tuple[int, ...], task: str, timeout: float
) -> DistributedResult:
    specs = [RunSpec(v, task, k, oracle=False) for k in ks for v in COMM_VARIANTS]
    specs += [RunSpec("no_sync", task, accum_steps), RunSpec("per-rank counts", task, accum_steps)]
    start = time.perf_counter()
    results = run_specs(specs, world_size=world_size, timeout=timeout)
    comm: dict[str, dict[int, RunResult]] = {v: {} for v in COMM_VARIANTS}
    for r in results[: len(ks) * len(COMM_VARIANTS)]:
        comm[r.spec.variant][r.spec.accum_steps] = r
    return DistributedResult(
        world_size, task, accum_steps, ks, comm, results[-2], results[-1], time.perf_counter() - start
    )


# --- the widget ------------------------------------------------------------------------------------
#
# Why the old widget crashed in JupyterLab (issue 12), read from the installed sources:
# 1. JupyterLab 4.6 sends widget comm messages over a kernel subshell by default
#    (share/jupyter/lab/schemas/@jupyterlab/apputils-extension/kernels-settings.json:14-18,
#    "commsOverSubshells": "perCommTarget"), and ipykernel 7.4 routes such a comm_msg to that
#    subshell (ipykernel/kernelbase.py:612-628), which runs in its own thread
#    (ipykernel/subshell.py:12, SubshellThread). So the Run button's callback runs in a second
#    thread, beside the main thread that executes cells.
# 2. The old callback built its figure with pyplot: plt.subplots registers it in the
#    process-wide Gcf and marks it for the inline backend (matplotlib_inline/backend_inline.py:60-67),
#    and plt.show(fig) displays *every* pyplot figure (backend_inline.py:72-100). Meanwhile each
#    cell the main thread finishes fires post_execute -> flush_figures (backend_inline.py:108-152,
#    registered at :180; ipykernel/ipkernel.py:453 fires it again), which draws every figure in
#    Gcf, the callback's half-built one included.
# 3. Both threads then lay out the log axis' '10^k' tick labels as mathtext through ONE parser
#    cached on the class (matplotlib/mathtext.py:97-98) whose parse resets and pops a shared
#    state stack (matplotlib/_mathtext.py:2351, 2362-2364): 'IndexError: pop from empty list',
#    re-raised from fig.tight_layout() as ValueError/ParseException; `with out:` caught it
#    and showed it in the output area (ipywidgets widget_output.py __exit__).
# Whether it fails depends on whether a cell finishes while the callback draws: hence "intermittent".
#
# The fix, by construction: the figure is pyplot-free (_style.figure: never in Gcf, so
# flush_figures never sees it), has no mathtext at all (plain tick formatters, style's
# use_mathtext=False), is drawn under the style's one render lock (_style.png), and reaches
# the Output by setting its `outputs` (a widget state update), so the callback neither
# prints nor re-parents the shell's display from the second thread.


def _widget_ks(world_size: int) -> tuple[int, ...]:
    return tuple(k for k in DEFAULT_KS if k <= micro_batches_per_rank(world_size))


class DistributedWidget:
    """k and the world size, a Run button that spawns the ranks, a progress bar, a status line, the figure.

    Nothing runs until Run is pressed. A setting already run (or the notebook's ``initial``
    result) is redrawn at once from the cache.
    """

    STAGES = 3  # ranks started, ranks done, figure drawn

    def __init__(
        self,
        initial: DistributedResult | None = None,
        world_sizes: Sequence[int] = (1, 2, 3),
        accum_steps: Sequence[int] = (1, 2, 3, 4),
    ) -> None:
        import ipywidgets as w

        world_sizes = check_ints("world_sizes", world_sizes, low=1, high=max(MEASURED_RUN_S))
        accum_steps = check_ints(
            "accum_steps",
            accum_steps,
            low=1,
            high=min(micro_batches_per_rank(r) for r in world_sizes),
            why="the micro-batches each rank holds at the largest world size offered",
        )
        self.cache: dict[tuple[int, int], DistributedResult] = {}
        if initial is not None:
            self.cache[(initial.world_size, initial.accum_steps)] = initial
        start_k = (
            initial.accum_steps
            if initial is not None and initial.accum_steps in accum_steps
            else accum_steps[-1]
        )
        start_r = (
            initial.world_size
            if initial is not None and initial.world_size in world_sizes
            else world_sizes[0]
        )
        self.accum_steps = w.Dropdown(
            options=list(accum_steps), value=start_k, description="k", layout=w.Layout(width="130px")
        )
        self.world_size = w.Dropdown(
            options=list(world_sizes),
            value=start_r,
            description="world size",
            style={"description_width": "initial"},
            layout=w.Layout(width="150px"),
        )
        self.run = w.Button(
            description="Run",
            button_style="primary",
            icon="play",
            tooltip="spawn the ranks and measure this setting",
        )
        self.progress = w.IntProgress(value=0, min=0, max=self.STAGES, layout=w.Layout(width="140px"))
        self.status = w.Label()
        self.out = w.Output()
        self.result: DistributedResult | None = None
        self.error: str = ""
        self.run.on_click(self._on_run)
        for control in (self.accum_steps, self.world_size):
            control.observe(self._on_change, names="value")
        self.widget = w.VBox(
            [w.HBox([self.accum_steps, self.world_size, self.run, self.progress]), self.status, self.out]
        )
        self._on_change()
        if initial is not None:
            self._show(initial)

    def expected_s(self, world_size: int) -> int:
        return MEASURED_RUN_S[world_size]

    def _on_change(self, change: Any = None) -> None:
        key = (self.world_size.value, self.accum_steps.value)
        if key in self.cache:
            self.status.value = "Already run: press Run to redraw it at once."
        else:
            self.status.value = (
                f"Run spawns {key[0]} rank{'s' if key[0] > 1 else ''}: about {self.expected_s(key[0])} s "
                "on 2 idle CPU cores (measured), longer on a busy machine."
            )

    def _on_run(self, button: Any = None) -> None:
        """The Run button's callback (in JupyterLab it runs in a subshell's thread: see the comment above)."""
        key = (self.world_size.value, self.accum_steps.value)
        self.run.disabled = True
        self.error = ""
        self.progress.bar_style = "info"
        self.progress.value = 0
        start = time.perf_counter()
        try:
            result = self.cache.get(key)
            if result is None:
                self.status.value = (
                    f"Running {key[0]} rank(s) at k = {key[1]} (about {self.expected_s(key[0])} s)..."
                )
                self.progress.value = 1
                result = compute(world_size=key[0], accum_steps=key[1], ks=_widget_ks(key[0]))
                self.cache[key] = result
            self.progress.value = 2
            self.status.value = "Drawing..."
            self._show(result)
            self.progress.value = self.STAGES
            self.progress.bar_style = "success"
            self.status.value = (
                f"Done in {time.perf_counter() - start:.1f} s: world size {key[0]}, k = {key[1]}; "
                "change a setting and press Run again."
            )
        except Exception as e:  # a callback's error would only reach the server log: show it here
            self.error = f"{type(e).__name__}: {e}"
            self.progress.bar_style = "danger"
            self.status.value = f"Failed: {self.error[:200]}"
            _style.show_in(self.out, f"Run failed: {self.error}")
        finally:
            self.run.disabled = False

    def _show(self, result: DistributedResult) -> None:
        self.result = result
        fig = plot(result)
        alt = (
            f"Left: all-reduce KiB per step against k for {', '.join(COMM_VARIANTS)}. Right: relative error "
            f"per step, global count at most {result.reference.max_rel_error:.0e}, per-rank count up to "
            f"{result.per_rank.max_rel_error:.0e}."
        )
        _style.show_in(self.out, result.table(), result.error_table(), fig, alt=alt)

    @property
    def children(self) -> tuple:
        """The widget tree's top level, so tools that walk ipywidgets containers find the Run button."""
        return tuple(self.widget.children)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def widget(
    initial: DistributedResult | None = None,
    world_sizes: Sequence[int] = (1, 2, 3),
    accum_steps: Sequence[int] = (1, 2, 3, 4),
) -> DistributedWidget:
    """Pick k and the world size, press Run: spawns the ranks again and redraws; ``initial`` is shown
    first.
    """
    return DistributedWidget(initial, world_sizes, accum_steps)


# --- the exercise ----------------------------------------------------------------------------------

# 2 real ranks, 4 micro-batches each per step: 2 steps
EXERCISE_RANKS, EXERCISE_K = _distributed_exercise.WORLD_SIZE, 4


def _exercise_hints() -> dict[str, str | tuple[str, ...]]:
    weigh = (
        "Take one token on rank 0 and one on rank 1 in the same window. Your backward gives each a factor on "
        "its own rank, and DDP's all-reduce takes the mean over the R ranks. In the large batch every token "
        "of the window, on every rank, weighs 1/N, N the tokens of all ranks together. "
    )
    return {
        "per-rank-mean": (
            weigh + "With n_rank a token weighs 1/(R n_r): equal only when both ranks hold as many tokens.",
            "Every rank must divide by the same N before its first backward, but a rank sees only its own "
            "tokens. One collective of one number per window gives every rank the sum of every rank's "
            "count: which one?",
            "torch.distributed.all_reduce sums a tensor in place on every rank. With that N, what factor on "
            "each rank's token-loss sum leaves 1/N per token once DDP has divided by R?",
        ),
        "misscaled": (
            "Every token now weighs the same, but all of them are off by one factor c (the report's c "
            "column). Compare c with 1/R and with R.",
            "DDP's all-reduce already divides the sum of the ranks' gradients by R: scale each rank's loss "
            "so that the mean over ranks, not the sum, gives every token 1/N.",
            "With n_global the all-reduced token count: loss = token_losses.sum() * dist.get_world_size() / "
            "n_global.",
        ),
        "ranks-diverged": (
            "The ranks stepped with different gradients: no all-reduce ran in that window. DDP all-reduces "
            "in the backward of a forward run outside no_sync(): which micro-batch of the window must that "
            "be?"
        ),
        "unsharded-data": (
            "Every rank trained on the same items: give each rank its own share of loader.dataset, as the "
            "starting loop's DistributedSampler did."
        ),
        "unexplained": (
            "Your loop weighs the tokens of one rank's window unequally. Take two tokens on one rank, in two "
            "micro-batches of different lengths: what factor does your backward give each? In the large "
            "batch every token of the window, on every rank, weighs 1/N, N the tokens of all ranks together.",
            "A micro-batch's mean gives each of its n tokens 1/n: a short micro-batch's tokens weigh more. "
            "Sum the token losses instead, and divide by one count for the whole window of every rank: "
            "which collective gives every rank that count before its first backward?",
            "Count the window's tokens on this rank, all_reduce the count (n_global), and backward "
            "token_losses.sum() * dist.get_world_size() / n_global: DDP's mean over the R ranks leaves 1/N.",
        ),
        "error": (
            "Your loop raised on a rank (the error above says where). Keep the loop's shape: DDP around the "
            "model, the DistributedSampler's shard, no_sync() on every micro-batch of a window but the last."
        ),
    }


def _on_ranks(train_fn: Any) -> Any:
    """``train_fn`` on 2 real gloo ranks under ``accumlib.verify(..., ranks="all")``: rank 0's report."""
    (result,) = _distributed_exercise.grade([train_fn], k=EXERCISE_K)
    if isinstance(result, _distributed_exercise.LoopFailed):
        raise result
    return result


def check_all(train_fns: Sequence[Any]) -> list[Any]:
    """``EXERCISE.check`` of each loop, all in one launch of the ranks (each check alone spawns them: ~6
    s).
    """
    return [
        EXERCISE.grade(error=r.feedback)
        if isinstance(r, _distributed_exercise.LoopFailed)
        else EXERCISE.grade(r)
        for r in _distributed_exercise.grade(list(train_fns), k=EXERCISE_K)
    ]


EXERCISE = Exercise(
    "08-count-tokens-across-ranks",
    "Normalize by the tokens of every rank",
    task=TASK,
    accum_steps=EXERCISE_K,
    hints=_exercise_hints(),
    run=_on_ranks,
    call="distributed.EXERCISE",
)
