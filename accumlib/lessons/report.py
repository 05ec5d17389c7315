"""The papermill report (``notebooks/report.ipynb``, ``make report``): every reference loop at every k.

``run(...)`` checks the report's parameters, runs every reference loop at every k, and returns a
``ReportResult``; with ``results_path`` it also writes every number as JSON (``reports/report.json``
under ``make report``), so the HTML carries tables and figures, never raw JSON.

    make report ACCUM="1 2 4 8" TASK=mlp-digits BATCH=3 NORM=group PRECISION=float32 DEVICE=auto SEED=0

Every k must give at least ``MIN_STEPS`` optimizer steps, or the per-step figures show one dot:

>>> check_parameters(accum_steps="1 2 4 8", batch_size=16)
Traceback (most recent call last):
...
ValueError: accum_steps and batch_size must give every k at least 3 optimizer steps, ceil(micro-batches / k) >= 3: task 'mlp-digits' has 110 examples, which batch_size=16 splits into 7 micro-batches, so k = 4, 8 give 2, 1 steps (got accum_steps='1 2 4 8', batch_size=16); use k <= 3, or batch_size <= 6
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .. import LOOPS, TASKS, Task, amp, get_task, ragged, verify
from .._batch import resolve_device
from ..harness import classify, trace_loop
from ..memory import activation_bytes
from ..models import SmallCNN
from .._batch import expected_steps
from ..tasks import classification_losses
from ..tolerances import FLOAT32_RTOL
from . import _style
from ._common import Table, check_choice, check_int, check_ints
from ._common import digits_subset, fmt_error

PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
NORMS = ("batch", "group", "none")
TASK_NAMES = ("cnn", *sorted(TASKS))
LR = 0.05  # plain SGD, as accumlib.harness.trace_loop and verify use: every gradient error shows 1:1 in the update
N_IMAGES = 128  # digit images for the norm-layer section: 128 / (3 x 8) windows, enough to see BatchNorm drift
# Three steps at every k: a per-step figure then draws a line, not a dot, and the largest k
# still has a full window before its tail.
MIN_STEPS = 3
# The defaults of run(), of the notebook's parameters cell and of the Makefile (tests keep them equal).
# Micro-batches of 3 give every built-in task at least 3 steps at k = 8: mlp-digits' 110 items make
# 37 micro-batches (the last holds 2, so the tail window is ragged), lm-tokens' 64 sequences make 22.
DEFAULTS: dict[str, Any] = dict(task="mlp-digits", accum_steps=(1, 2, 4, 8), batch_size=3, norm="group",
                                precision="float32", device="auto", seed=0, results_path="")
# A bit-exact 0 on a log axis is drawn here and labelled "0": float32 rounding (~1e-7) stays visibly above it.
ZERO = 1e-10
ROLES = {"naive": "buggy", "normalized": "other", "ragged": "correct", "large_batch": "oracle"}  # amp: "alternative"


def parse_accum(accum_steps: Any) -> tuple[int, ...]:
    """``[1, 2, 4]``, ``"1 2 4"``, ``"1,2,4"`` or ``4`` -> sorted distinct k, each an integer >= 1.

    >>> parse_accum("1 2 4 8"), parse_accum([4, 2]), parse_accum(8)
    ((1, 2, 4, 8), (2, 4), (8,))
    """
    rule = "accum_steps must be integers >= 1, as a list, one integer or a string like '1 2 4 8'"
    if isinstance(accum_steps, str):
        try:
            items: Any = [int(k) for k in accum_steps.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{rule} (got {accum_steps!r})") from None
    elif isinstance(accum_steps, int) and not isinstance(accum_steps, bool):
        items = [accum_steps]  # papermill turns -p accum_steps 4 into an int
    else:
        items = accum_steps
    try:  # check_ints refuses an empty list, a bool, a float and k < 1; the message here shows the value as given
        return check_ints("accum_steps", items, low=1)
    except ValueError:
        raise ValueError(f"{rule} (got {accum_steps!r})") from None


def cnn_task(norm: str, seed: int = 0) -> Task:
    """SmallCNN with ``norm`` on ``N_IMAGES`` digit images (the built-in CNN tasks, any norm)."""
    check_choice("norm", norm, NORMS)

    def make_model(s: int = 0) -> torch.nn.Module:
        torch.manual_seed(s)
        return SmallCNN(norm=norm)

    def images() -> Any:
        x, y = digits_subset(N_IMAGES, seed)[:]
        return torch.utils.data.TensorDataset(x.view(-1, 1, 8, 8), y)

    return Task(f"cnn-{norm}", f"SmallCNN(norm={norm!r}) on {N_IMAGES} digit images", make_model, images,
                classification_losses, batch_size=4, accum_steps=4, tags=("batchnorm",) if norm == "batch" else ())


def resolve_task(task: str, norm: str, seed: int = 0) -> Task:
    """A built-in task by name, or ``"cnn"``: the CNN with the report's ``norm``."""
    check_choice("task", task, TASK_NAMES)
    return cnn_task(norm, seed) if task == "cnn" else get_task(task)


@dataclass(frozen=True)
class Parameters:
    """The report's parameters, checked: what ``run`` works with."""

    task: Task
    ks: tuple[int, ...]
    batch_size: int
    norm: str
    precision: str
    device: torch.device
    seed: int
    results_path: str


def _check_steps(data: str, n_examples: int, n_batches: int, ks: tuple[int, ...], accum_steps: Any, batch_size: int) -> None:
    """Every k must give ``MIN_STEPS`` optimizer steps: ceil(n_batches / k) >= 3, i.e. n_batches > 2k."""
    short = [k for k in ks if expected_steps(n_batches, k) < MIN_STEPS]
    if not short:
        return
    k_max = (n_batches - 1) // (MIN_STEPS - 1)  # the largest k with ceil(n_batches / k) >= MIN_STEPS
    b_max = max((b for b in range(1, batch_size) if expected_steps(math.ceil(n_examples / b), max(ks)) >= MIN_STEPS), default=0)
    fixes = ([f"k <= {k_max}"] if k_max >= 1 else []) + ([f"batch_size <= {b_max}"] if b_max else [])
    raise ValueError(
        f"accum_steps and batch_size must give every k at least {MIN_STEPS} optimizer steps, ceil(micro-batches / k) >= {MIN_STEPS}: "
        f"{data} has {n_examples} examples, which batch_size={batch_size} splits into {n_batches} micro-batches, "
        f"so k = {', '.join(map(str, short))} {'give' if len(short) > 1 else 'gives'} "
        f"{', '.join(str(expected_steps(n_batches, k)) for k in short)} steps "
        f"(got accum_steps={accum_steps!r}, batch_size={batch_size!r})" + (f"; use {', or '.join(fixes)}" if fixes else "")
    )


def check_parameters(
    task: str = DEFAULTS["task"], accum_steps: Any = DEFAULTS["accum_steps"], batch_size: int = DEFAULTS["batch_size"],
    norm: str = DEFAULTS["norm"], precision: str = DEFAULTS["precision"], device: Any = DEFAULTS["device"],
    seed: int = DEFAULTS["seed"], results_path: str = DEFAULTS["results_path"],
) -> Parameters:
    """Every parameter by name, rule and value, before any training: names and types, then the step rule."""
    check_choice("task", task, TASK_NAMES)
    ks = parse_accum(accum_steps)
    batch_size = check_int("batch_size", batch_size, low=1)
    check_choice("norm", norm, NORMS)
    check_choice("precision", precision, tuple(PRECISIONS))
    dev = resolve_device(device)
    seed = check_int("seed", seed, low=0)
    if not isinstance(results_path, (str, os.PathLike)):
        raise ValueError(f"results_path must be a path ending in .json, or '' to write no file (got {results_path!r})")
    path = os.fspath(results_path)
    if path and not path.endswith(".json"):
        raise ValueError(f"results_path must end in .json, or be '' to write no file (got {path!r})")
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"results_path must be in an existing folder (got {path!r}; "
                         f"{os.path.dirname(os.path.abspath(path))!r} does not exist)")
    t = resolve_task(task, norm, seed)
    cnn = cnn_task(norm, seed)
    for data, each in ((f"task {t.name!r}", t), (f"the norm section's {cnn.name!r}", cnn)):
        loader = each.loader(batch_size)
        _check_steps(data, len(loader.dataset), len(loader), ks, accum_steps, batch_size)  # type: ignore[arg-type]
    return Parameters(t, ks, batch_size, norm, precision, dev, seed, path)


@dataclass(frozen=True)
class Cell:
    """One loop at one k: every step against the oracle, and what the epoch covered."""

    loop: str
    k: int
    rel_errors: tuple[float, ...]  # per optimizer step, ||g - g*|| / ||g*||
    window_batches: tuple[int, ...]  # micro-batches per optimizer step (the tail window may hold fewer than k)
    min_cosine: float
    max_norm_ratio: float
    expected_steps: int
    items_used: int
    items: int
    verdict: str
    logged: tuple[float, ...]
    # amp only: each step against verify's replay in the loop's autocast dtype, what its verdict reads
    ref_errors: tuple[float, ...] = ()

    @property
    def max_rel_error(self) -> float:
        return max(self.rel_errors)

    @property
    def steps(self) -> int:
        return len(self.rel_errors)


@dataclass(frozen=True)
class ReportResult:
    task: str
    description: str
    ks: tuple[int, ...]
    batch_size: int
    norm: str
    precision: str
    device: str
    seed: int
    n_items: int
    n_batches: int
    cells: dict[tuple[str, int], Cell]
    memory: dict[int, tuple[int, int]]  # k -> (activation bytes of one micro-batch, of the k-fold large batch)
    norm_errors: dict[int, float]  # k -> worst relative error of ragged with the chosen norm layer

    @property
    def loops(self) -> list[str]:
        return list(dict.fromkeys(name for name, _ in self.cells))

    def settings(self) -> Table:
        return Table(("setting", "value"), [
            ("task", self.task),  # the task's own description states its default batch and k, not the report's
            ("accumulation steps k", " ".join(map(str, self.ks))),
            ("micro-batch size", self.batch_size),
            ("data", f"{self.n_items} items in {self.n_batches} micro-batches"),
            ("optimizer steps per epoch", ", ".join(f"{expected_steps(self.n_batches, k)} at k = {k}" for k in self.ks)),
            ("norm layer (CNN section)", self.norm),
            ("precision (amp loop)", self.precision),
            ("device", self.device),
            ("seed", self.seed),
        ], caption="The report's parameters")

    def loop_table(self) -> Table:
        rows = [
            (c.loop, c.k, fmt_error(c.max_rel_error), round(c.min_cosine, 4), round(c.max_norm_ratio, 3),
             f"{c.steps}/{c.expected_steps}", f"{c.items_used}/{c.items}", c.verdict)
            for c in self.cells.values()
        ]
        return Table(("loop", "k", "max rel. error", "min cosine", "max norm ratio", "steps", "items stepped", "verdict"), rows,
                     caption="Every loop at every k, its worst step against the large batch")

    def memory_table(self) -> Table:
        return Table(("k", "items per step", "micro-batch KiB", "large batch KiB", "saved"), [
            (k, k * self.batch_size, round(m / 1024, 1), round(big / 1024, 1), f"{big / m:.2f}x")
            for k, (m, big) in self.memory.items()
        ], caption="Activation memory of one forward pass")

    def norm_table(self) -> Table:
        return Table(("k", "max rel. error vs large batch"), [(k, fmt_error(e)) for k, e in self.norm_errors.items()],
                     caption=f"accumlib.ragged on SmallCNN with {self.norm} norm")

    def findings(self) -> list[str]:
        """The report's conclusions, each sentence computed from the numbers above it."""
        out = []
        for name in self.loops:
            by_verdict: dict[str, list[int]] = {}
            for k in self.ks:
                by_verdict.setdefault(self.cells[(name, k)].verdict, []).append(k)
            parts = [f"{verdict} at k = {', '.join(map(str, ks))}" for verdict, ks in by_verdict.items()]
            worst = max(self.ks, key=lambda k: self.cells[(name, k)].max_rel_error)
            cell = self.cells[(name, worst)]
            replay = [e for k in self.ks for e in self.cells[(name, k)].ref_errors]
            judged = f"; against the {self.precision} replay that verify judges by: {max(replay):.2g}" if replay else ""
            out.append(f"{name}: {'; '.join(parts)} (worst step: relative error {fmt_error(cell.max_rel_error)} at k = {worst}{judged}, "
                       f"{cell.items_used}/{cell.items} items stepped).")
        dropped = [c for c in self.cells.values() if c.items_used < c.items]
        if dropped:
            out.append("Items that reached no optimizer step: " + ", ".join(f"{c.loop} at k = {c.k}: {c.items - c.items_used}" for c in dropped) + ".")
        k_max = max(self.ks)
        m, big = self.memory[k_max]
        out.append(f"Activation memory: one micro-batch of {self.batch_size} needs {m / 1024:.1f} KiB; "
                   f"the large batch of k = {k_max} micro-batches would need {big / 1024:.1f} KiB ({big / m:.2f}x).")
        norm_worst = max(self.norm_errors.values())
        out.append(f"SmallCNN with {self.norm} norm, accumulated exactly (accumlib.ragged): worst relative error "
                   f"{fmt_error(norm_worst)} over k = {', '.join(map(str, self.ks))}"
                   + (" (exact: per-sample normalization does not see the micro-batching)." if norm_worst <= FLOAT32_RTOL
                      else " (not exact: the layer's batch statistics differ between micro-batches and the large batch)."))
        return out

    def summary(self) -> dict[str, Any]:
        """Everything the report states, as plain JSON: what ``make report`` writes and ``tests/test_report.py`` checks."""
        return {
            "task": self.task, "accum_steps": list(self.ks), "batch_size": self.batch_size, "norm": self.norm,
            "precision": self.precision, "device": self.device, "seed": self.seed,
            "n_items": self.n_items, "n_batches": self.n_batches, "min_steps": MIN_STEPS,
            "loops": [
                {"loop": c.loop, "k": c.k, "max_rel_error": c.max_rel_error, "min_cosine": c.min_cosine,
                 "max_norm_ratio": c.max_norm_ratio, "steps": c.steps, "expected_steps": c.expected_steps,
                 "items_used": c.items_used, "items": c.items, "verdict": c.verdict,
                 "rel_errors": list(c.rel_errors), "window_batches": list(c.window_batches), "logged": list(c.logged),
                 **({"replay_rel_errors": list(c.ref_errors)} if c.ref_errors else {})}
                for c in self.cells.values()
            ],
            "memory": {str(k): {"micro_batch_bytes": m, "large_batch_bytes": big} for k, (m, big) in self.memory.items()},
            "norm_max_rel_error": {str(k): e for k, e in self.norm_errors.items()},
            "findings": self.findings(),
        }


def _loops(precision: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    loops: dict[str, tuple[Any, dict[str, Any]]] = {name: (LOOPS[name], {}) for name in ("naive", "normalized", "ragged", "large_batch")}
    dtype = PRECISIONS[precision]
    if dtype is not None:
        loops[f"amp ({precision})"] = (amp, {"dtype": dtype})
    return loops


def _autocast_verdict(t: Task, k: int, batch_size: int, precision: str, seed: int, dev: torch.device) -> tuple[str, tuple[float, ...]]:
    """The amp loop judged as ``accumlib.verify`` judges it: each step against a replay of its window in the
    loop's own autocast dtype, not the float32 gradient, which bf16 rounding alone misses by 1e-2 to 1e-1."""
    dtype = PRECISIONS[precision]

    def train_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> Any:
        return amp(model, optimizer, loader, t.item_losses, accum_steps=k, dtype=dtype, count_items=t.count_items, device=dev)

    rep = verify(train_fn, model=t.make_model(seed).to(dev), dataset=t.make_dataset(), item_losses=t.item_losses,
                 accum_steps=k, batch_size=batch_size, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR), collate_fn=t.collate_fn)
    return (f"close ({precision})" if rep.ok else "not exact"), tuple(s.ref_error for s in rep.steps)


def run(
    task: str = DEFAULTS["task"], accum_steps: Any = DEFAULTS["accum_steps"], batch_size: int = DEFAULTS["batch_size"],
    norm: str = DEFAULTS["norm"], precision: str = DEFAULTS["precision"], device: Any = DEFAULTS["device"],
    seed: int = DEFAULTS["seed"], results_path: str = DEFAULTS["results_path"],
) -> ReportResult:
    """Every reference loop at every k on ``task``, judged step by step against the oracle.

    ``precision`` other than float32 adds ``accumlib.amp`` with that autocast dtype. The norm
    section runs ``accumlib.ragged`` on the CNN with ``norm`` at every k. ``results_path``
    (``""``: none) receives ``summary()`` as JSON. Every parameter is checked before any work.
    """
    p = check_parameters(task, accum_steps, batch_size, norm, precision, device, seed, results_path)
    t, dev = p.task, p.device
    cells = {}
    for k in p.ks:
        for name, (loop, kwargs) in _loops(p.precision).items():
            trace = trace_loop(loop, t, accum_steps=k, batch_size=p.batch_size, lr=LR, seed=p.seed, device=dev, **kwargs)
            verdict, ref_errors = classify(trace), ()
            if "dtype" in kwargs:
                verdict, ref_errors = _autocast_verdict(t, k, p.batch_size, p.precision, p.seed, dev)
            cells[(name, k)] = Cell(
                name, k, tuple(c.rel_error for c in trace.comparisons), tuple(trace.window_batches),
                min(c.cosine for c in trace.comparisons), max(c.norm_ratio for c in trace.comparisons),
                expected_steps(trace.n_batches, k), sum(trace.window_items), trace.n_items,
                verdict, tuple(trace.logged), ref_errors,
            )
    n_items, n_batches = trace.n_items, trace.n_batches

    model = t.make_model(p.seed).to(dev)
    first = next(iter(t.loader(p.batch_size)))
    memory = {}
    for k in p.ks:
        window = [first] * k  # activation memory depends on the batch's size, not its content
        memory[k] = (activation_bytes(model, first, t.item_losses, dev), activation_bytes(model, t.merge(window), t.item_losses, dev))

    cnn = cnn_task(p.norm, p.seed)
    norm_errors = {
        k: max(c.rel_error for c in trace_loop(ragged, cnn, accum_steps=k, batch_size=p.batch_size, seed=p.seed, device=dev).comparisons)
        for k in p.ks
    }
    result = ReportResult(t.name, t.description, p.ks, p.batch_size, p.norm, p.precision, str(dev), p.seed, n_items, n_batches,
                          cells, memory, norm_errors)
    if p.results_path:
        with open(p.results_path, "w") as f:
            json.dump(result.summary(), f, indent=1)
    return result


def results_note(results_path: str) -> str:
    """Where the machine-readable results went (the notebook's last line)."""
    return (f"Every number of this report, as JSON: {results_path}" if results_path
            else "results_path is '' (the default): no JSON file written; make report writes reports/report.json")


# --- figures ----------------------------------------------------------------------------------------


def _role(name: str) -> dict[str, Any]:
    return _style.ROLE[ROLES.get(name, "alternative")]


def _zero(value: float) -> float:
    return max(value, ZERO)


def _log_axis_with_zero(ax: Any, values: list[float]) -> None:
    """Log y axis in whole decades, with a bit-exact 0 drawn at ``ZERO`` and labelled "0"."""
    top = math.ceil(math.log10(max([*values, 1.0])))
    decades = list(range(-8, top + 1, 2 if top + 8 > 6 else 1))
    ax.set_yscale("log")
    ax.set_ylim(ZERO / 3, 10.0 ** top * 3)
    ax.set_yticks([ZERO] + [10.0 ** d for d in decades], ["0 (bit-exact)"] + [f"{10.0 ** d:g}" for d in decades])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.axhline(ZERO * 10, color="white", linewidth=3, zorder=1)  # a gap in the axis: 0 is not a decade below 1e-8


def _tolerance_band(ax: Any) -> None:
    """Grey below the float32 bound: a point inside the band is exact, one above it is a wrong gradient."""
    ax.axhspan(ZERO / 3, FLOAT32_RTOL, color="0.88", zorder=0, label=f"exact: within float32 rounding (<= {FLOAT32_RTOL:g})")


def _k_axis(ax: Any, ks: tuple[int, ...]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("accumulation steps k")


@_style.styled
def plot_errors(result: ReportResult) -> Figure:
    """Each loop's worst step: relative gradient error against the large batch vs k (log axis, 0 drawn as "0")."""
    fig, ax = _style.figure(width=8.5, height=5.5,
                            title=f"Worst optimizer step's gradient error against the large batch, by k ({result.task})")
    values = []
    for name in result.loops:
        ys = [result.cells[(name, k)].max_rel_error for k in result.ks]
        values += ys
        ax.plot(result.ks, [_zero(y) for y in ys], label=name, **_role(name))
    _tolerance_band(ax)
    _log_axis_with_zero(ax, values)
    _k_axis(ax, result.ks)
    ax.set_ylabel("worst step's relative error ||g - g*|| / ||g*||")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    return fig


def alt_errors(result: ReportResult) -> str:
    """Alt text of ``plot_errors``: what it shows, with its numbers."""
    lines = "; ".join(
        f"{name}: " + ", ".join(f"{_alt_number(result.cells[(name, k)].max_rel_error)} at k = {k}" for k in result.ks)
        for name in result.loops)
    return (f"Line chart, log scale: the worst optimizer step's relative gradient error against the large batch, "
            f"for k = {', '.join(map(str, result.ks))} on {result.task} with micro-batches of {result.batch_size}. {lines}.")


def _alt_number(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def _tail_label(steps: int, cell: Cell) -> list[str]:
    labels = [str(i) for i in range(1, steps + 1)]
    if cell.window_batches and cell.window_batches[-1] < cell.k:
        labels[-1] += f"\ntail: {cell.window_batches[-1]} of {cell.k}"
    return labels


@_style.styled
def plot_steps(result: ReportResult, k: int | None = None) -> Figure:
    """Step by step at ``k`` (default: the largest): the gradient error of each step, and each loop's
    logged loss minus the large-batch run's, so the effect is on the axis rather than hidden in an offset."""
    k = k or max(result.ks)
    ref = result.cells[("large_batch", k)]
    fig, (ax, bx) = _style.figure(2, width=12, height=5,
                                  title=f"Step by step at k = {k} ({result.task}, micro-batches of {result.batch_size}, "
                                        f"{ref.steps} optimizer steps)")
    steps = list(range(1, ref.steps + 1))
    values = []
    for name in result.loops:
        cell = result.cells[(name, k)]
        values += cell.rel_errors
        ax.plot(steps, [_zero(e) for e in cell.rel_errors], label=name, **_role(name))
        bx.plot(steps, [a - b for a, b in zip(cell.logged, ref.logged)], label=name, **_role(name))
    _tolerance_band(ax)
    _log_axis_with_zero(ax, values)
    ax.set_title("Gradient error of each step")
    ax.set_ylabel("relative error vs large batch")
    bx.set_title("Logged loss minus the large-batch run's")
    bx.set_ylabel("loss difference (nats)")
    bx.ticklabel_format(axis="y", useOffset=False)
    for a in (ax, bx):
        a.set_xticks(steps, _tail_label(len(steps), ref))
        a.xaxis.set_minor_locator(NullLocator())
        a.set_xlabel("optimizer step")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels))
    return fig


def alt_steps(result: ReportResult, k: int | None = None) -> str:
    """Alt text of ``plot_steps``."""
    k = k or max(result.ks)
    ref = result.cells[("large_batch", k)]
    errors = "; ".join(f"{name}: " + ", ".join(_alt_number(e) for e in result.cells[(name, k)].rel_errors) for name in result.loops)
    gaps = "; ".join(
        f"{name}: " + ", ".join(f"{a - b:+.2g}" if a != b else "0" for a, b in zip(result.cells[(name, k)].logged, ref.logged))
        for name in result.loops)
    return (f"Two line charts over the {ref.steps} optimizer steps at k = {k} (the last window holds "
            f"{ref.window_batches[-1]} of {k} micro-batches). Left, log scale: each step's relative gradient error "
            f"against the large batch, {errors}. Right: each loop's logged loss minus the large-batch run's, {gaps}.")


@_style.styled
def plot_memory_and_norm(result: ReportResult) -> Figure:
    """Left: activation memory vs k. Right: ragged's error with the chosen norm layer vs k."""
    fig, (ax, bx) = _style.figure(2, width=12, height=4.5,
                                  title=f"What accumulation saves (activation memory) and what it cannot fix ({result.norm} norm)")
    ax.plot(result.ks, [big / 1024 for _, big in result.memory.values()], label="one large batch of k micro-batches",
            **_style.ROLE["other"])
    ax.plot(result.ks, [m / 1024 for m, _ in result.memory.values()], label="one micro-batch (accumulation)",
            **_style.ROLE["correct"])
    _k_axis(ax, result.ks)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("activations saved for backward (KiB)")
    ax.set_title(f"Activation memory, micro-batches of {result.batch_size}")
    ax.legend(loc="upper left")
    errors = list(result.norm_errors.values())
    bx.plot(result.ks, [_zero(e) for e in errors], label=f"accumlib.ragged, {result.norm} norm", **_style.ROLE["correct"])
    _tolerance_band(bx)
    _log_axis_with_zero(bx, errors)
    _k_axis(bx, result.ks)
    bx.set_ylabel("relative error vs large batch")
    bx.set_title(f"Exact loop on SmallCNN with {result.norm} norm")
    bx.legend(loc="best")
    return fig


def alt_memory_and_norm(result: ReportResult) -> str:
    """Alt text of ``plot_memory_and_norm``."""
    memory = ", ".join(f"k = {k}: {m / 1024:.1f} against {big / 1024:.1f} KiB" for k, (m, big) in result.memory.items())
    norm = ", ".join(f"{_alt_number(e)} at k = {k}" for k, e in result.norm_errors.items())
    return (f"Two line charts against k. Left: activation memory of one micro-batch against one large batch, {memory}. "
            f"Right, log scale: worst relative gradient error of accumlib.ragged on SmallCNN with {result.norm} norm, {norm}.")


def show(fig: Figure, alt: str) -> None:
    """Display ``fig`` as an ``<img>`` with ``alt`` text (the report's HTML keeps it)."""
    _style.show(fig, alt=alt)


__all__ = [
    "DEFAULTS", "MIN_STEPS", "NORMS", "PRECISIONS", "Parameters", "ReportResult", "alt_errors", "alt_memory_and_norm",
    "alt_steps", "check_parameters", "cnn_task", "parse_accum", "plot_errors", "plot_memory_and_norm", "plot_steps",
    "resolve_task", "results_note", "run", "show",
]
