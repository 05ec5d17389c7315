"""The papermill report (``notebooks/report.ipynb``, ``make report``): every reference loop at every k.

``run(...)`` takes the report's parameters and returns a ``ReportResult``; the notebook shows
its tables and figures, and records ``summary()`` as JSON so a test can check the numbers.

    make report ACCUM="1 2 4 8" TASK=mlp-digits BATCH=16 NORM=group PRECISION=float32 DEVICE=auto SEED=0
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from .. import (
    LOOPS, SmallCNN, TASKS, Task, activation_bytes, amp, classify, get_task, ragged, resolve_device, trace_loop,
)
from .._batch import expected_steps
from ..tolerances import FLOAT32_RTOL
from ..tasks import classification_losses
from .why import digits_subset, fmt_error, table

PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
NORMS = ("batch", "group", "none")
LR = 0.05  # plain SGD, as accumlib.trace_loop and verify use: every gradient error shows 1:1 in the update
N_IMAGES = 128  # digit images for the norm-layer section: 128 / (16 x 8) windows, enough to see BatchNorm drift


class Table:
    """Rows with a header: a text table for ``print`` and nbval, an HTML table in the report."""

    def __init__(self, header: tuple[str, ...], rows: list[tuple[Any, ...]]):
        self.header, self.rows = header, rows

    def __repr__(self) -> str:
        return table(self.header, self.rows)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def parse_accum(accum_steps: Any) -> tuple[int, ...]:
    """``[1, 2, 4]``, ``"1 2 4"`` or ``"1,2,4"`` -> ``(1, 2, 4)``; every k an integer >= 1.

    >>> parse_accum("1 2 4 8"), parse_accum([2, 4])
    ((1, 2, 4, 8), (2, 4))
    """
    items = accum_steps.replace(",", " ").split() if isinstance(accum_steps, str) else list(accum_steps)
    try:
        ks = tuple(int(k) for k in items)
    except (TypeError, ValueError):
        raise ValueError(f"accum_steps must be integers >= 1, as a list or a string like '1 2 4 8' (got {accum_steps!r})") from None
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"accum_steps must be a non-empty list of integers >= 1 (got {accum_steps!r})")
    return ks


def cnn_task(norm: str, seed: int = 0) -> Task:
    """SmallCNN with ``norm`` on ``N_IMAGES`` digit images (the built-in CNN tasks, any norm)."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS} (got {norm!r})")

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
    if task == "cnn":
        return cnn_task(norm, seed)
    if task not in TASKS:
        raise ValueError(f"task must be 'cnn' or one of {sorted(TASKS)} (got {task!r})")
    return get_task(task)


@dataclass(frozen=True)
class Cell:
    """One loop at one k: the worst step against the oracle, and what the epoch covered."""

    loop: str
    k: int
    max_rel_error: float
    min_cosine: float
    max_norm_ratio: float
    steps: int
    expected_steps: int
    items_used: int
    items: int
    verdict: str
    logged: tuple[float, ...]


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
            ("task", f"{self.task}: {self.description}"),
            ("accumulation steps k", " ".join(map(str, self.ks))),
            ("micro-batch size", self.batch_size),
            ("data", f"{self.n_items} items in {self.n_batches} micro-batches"),
            ("norm layer (CNN section)", self.norm),
            ("precision (amp loop)", self.precision),
            ("device", self.device),
            ("seed", self.seed),
        ])

    def loop_table(self) -> Table:
        rows = [
            (c.loop, c.k, fmt_error(c.max_rel_error), round(c.min_cosine, 4), round(c.max_norm_ratio, 3),
             f"{c.steps}/{c.expected_steps}", f"{c.items_used}/{c.items}", c.verdict)
            for c in self.cells.values()
        ]
        return Table(("loop", "k", "max rel. error", "min cosine", "max norm ratio", "steps", "items stepped", "verdict"), rows)

    def memory_table(self) -> Table:
        return Table(("k", "items per step", "micro-batch KiB", "large batch KiB", "saved"), [
            (k, k * self.batch_size, round(m / 1024, 1), round(big / 1024, 1), f"{big / m:.2f}x")
            for k, (m, big) in self.memory.items()
        ])

    def norm_table(self) -> Table:
        return Table(("k", f"ragged with {self.norm} norm: max rel. error vs large batch"),
                     [(k, fmt_error(e)) for k, e in self.norm_errors.items()])

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
            out.append(f"{name}: {'; '.join(parts)} (worst step: relative error {fmt_error(cell.max_rel_error)} at k = {worst}, "
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
        """Everything the report states, as plain JSON: what ``tests/test_report.py`` checks."""
        return {
            "task": self.task, "accum_steps": list(self.ks), "batch_size": self.batch_size, "norm": self.norm,
            "precision": self.precision, "device": self.device, "seed": self.seed,
            "n_items": self.n_items, "n_batches": self.n_batches,
            "loops": [
                {"loop": c.loop, "k": c.k, "max_rel_error": c.max_rel_error, "min_cosine": c.min_cosine,
                 "max_norm_ratio": c.max_norm_ratio, "steps": c.steps, "expected_steps": c.expected_steps,
                 "items_used": c.items_used, "items": c.items, "verdict": c.verdict}
                for c in self.cells.values()
            ],
            "memory": {str(k): {"micro_batch_bytes": m, "large_batch_bytes": big} for k, (m, big) in self.memory.items()},
            "norm_max_rel_error": {str(k): e for k, e in self.norm_errors.items()},
        }


def _loops(precision: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    loops: dict[str, tuple[Any, dict[str, Any]]] = {name: (LOOPS[name], {}) for name in ("naive", "normalized", "ragged", "large_batch")}
    dtype = PRECISIONS[precision]
    if dtype is not None:
        loops[f"amp ({precision})"] = (amp, {"dtype": dtype})
    return loops


def run(
    task: str = "mlp-digits", accum_steps: Any = (1, 2, 4, 8), batch_size: int = 16, norm: str = "group",
    precision: str = "float32", device: Any = "auto", seed: int = 0,
) -> ReportResult:
    """Every reference loop at every k on ``task``, judged step by step against the oracle.

    ``precision`` other than float32 adds ``accumlib.amp`` with that autocast dtype. The norm
    section runs ``accumlib.ragged`` on the CNN with ``norm`` at every k.
    """
    ks = parse_accum(accum_steps)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)} (got {precision!r})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    dev = resolve_device(device)
    t = resolve_task(task, norm, seed)
    cells = {}
    for k in ks:
        for name, (loop, kwargs) in _loops(precision).items():
            trace = trace_loop(loop, t, accum_steps=k, batch_size=batch_size, lr=LR, seed=seed, device=dev, **kwargs)
            cells[(name, k)] = Cell(
                name, k, max(c.rel_error for c in trace.comparisons), min(c.cosine for c in trace.comparisons),
                max(c.norm_ratio for c in trace.comparisons), len(trace.comparisons),
                expected_steps(trace.n_batches, k), sum(trace.window_items), trace.n_items,
                classify(trace, low_precision=name.startswith("amp")), tuple(trace.logged),
            )
    n_items, n_batches = trace.n_items, trace.n_batches

    model = t.make_model(seed).to(dev)
    first = next(iter(t.loader(batch_size)))
    memory = {}
    for k in ks:
        window = [first] * k  # activation memory depends on the batch's size, not its content
        memory[k] = (activation_bytes(model, first, t.item_losses, dev), activation_bytes(model, t.merge(window), t.item_losses, dev))

    cnn = cnn_task(norm, seed)
    norm_errors = {
        k: max(c.rel_error for c in trace_loop(ragged, cnn, accum_steps=k, batch_size=batch_size, seed=seed, device=dev).comparisons)
        for k in ks
    }
    return ReportResult(t.name, t.description, ks, batch_size, norm, precision, str(dev), seed, n_items, n_batches,
                        cells, memory, norm_errors)


def plot_errors(result: ReportResult) -> Figure:
    """Worst relative error against the large batch vs k, one line per loop (log scale)."""
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    floor = 1e-8
    for name in result.loops:
        ax.plot(result.ks, [max(result.cells[(name, k)].max_rel_error, floor) for k in result.ks], "o-", label=name)
    ax.axhline(FLOAT32_RTOL, color="black", ls=":", lw=1)
    ax.text(result.ks[0], FLOAT32_RTOL * 1.5, " float32 tolerance", fontsize=8)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xticks(result.ks, [str(k) for k in result.ks])
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("worst step: relative error vs large batch")
    ax.set_title(f"{result.task}, micro-batch {result.batch_size}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_curves(result: ReportResult, k: int | None = None) -> Figure:
    """The loss each loop logged per optimizer step over one epoch, at ``k`` (default: the largest)."""
    k = k or max(result.ks)
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    for name in result.loops:
        logged = result.cells[(name, k)].logged
        ax.plot(range(1, len(logged) + 1), logged, "o-", ms=3, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("logged loss of the step's window")
    ax.set_title(f"one epoch of SGD (lr {LR:g}) at k = {k}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_memory_and_norm(result: ReportResult) -> Figure:
    """Left: activation memory vs k. Right: ragged's error with the chosen norm layer vs k."""
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2)
    ax.plot(result.ks, [big / 1024 for _, big in result.memory.values()], "o-", color="tab:red", label="one large batch")
    ax.plot(result.ks, [m / 1024 for m, _ in result.memory.values()], "o-", color="tab:green", label="accumulated micro-batch")
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("activation memory (KiB)")
    ax.set_title("activations saved for backward")
    ax.legend(fontsize=8)
    bx.plot(result.ks, [max(e, 1e-8) for e in result.norm_errors.values()], "o-", color="tab:blue")
    bx.axhline(FLOAT32_RTOL, color="black", ls=":", lw=1)
    bx.set_yscale("log")
    bx.set_xlabel("accumulation steps k")
    bx.set_ylabel("max rel. error vs large batch")
    bx.set_title(f"SmallCNN, {result.norm} norm, accumlib.ragged")
    fig.tight_layout()
    return fig


__all__ = [
    "NORMS", "PRECISIONS", "ReportResult", "Table", "cnn_task", "parse_accum", "plot_curves", "plot_errors",
    "plot_memory_and_norm", "resolve_task", "run",
]
