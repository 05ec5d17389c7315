"""Run the reference loops on the built-in tasks and check each verdict against the oracle.

At every ``optimizer.step()`` a step pre-hook compares the gradient the optimizer is
about to use with the true large-batch gradient of the micro-batches drawn since the
previous step, at the current parameters (the ones that window started from; a
GradScaler has already unscaled ``.grad`` by then). This is what ``accumlib verify``
prints without arguments.
"""

from __future__ import annotations

import html
import json

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ._batch import expected_steps
from .compare import Comparison, compare
from .loops import LOOPS
from .oracle import grads_of, true_gradient
from .tasks import TASKS, Task, get_task

from .tolerances import BF16_RTOL, FLOAT32_RTOL, OFF_BY_K_TOL  # noqa: F401  (re-exported: notebooks read them here)

EXACT, CLOSE, OFF_BY_K, WRONG = "exact", "close (bf16)", "off by ~k", "not exact"


class _Recording:
    """An iterable over a loader that remembers every micro-batch it handed out."""

    def __init__(self, loader: Iterable[Any]):
        self.loader, self.drawn = loader, []  # type: ignore[var-annotated]

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.drawn.append(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


@dataclass
class Trace:
    """Per optimizer step: the comparison with the oracle and the window's micro-batch count."""

    comparisons: list[Comparison] = field(default_factory=list)
    window_batches: list[int] = field(default_factory=list)
    window_items: list[int] = field(default_factory=list)
    logged: list[float] = field(default_factory=list)
    n_batches: int = 0
    n_items: int = 0


def trace_loop(
    loop: Callable[..., list[float]],
    task: Task,
    *,
    accum_steps: int | None = None,
    batch_size: int | None = None,
    lr: float = 0.05,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **loop_kwargs: Any,
) -> Trace:
    """Train a fresh model of ``task`` for one epoch with ``loop``; compare every step with the oracle."""
    k = accum_steps or task.accum_steps
    model = task.make_model(seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = _Recording(task.loader(batch_size))
    trace, start = Trace(), 0

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        nonlocal start
        window = loader.drawn[start:]
        start = len(loader.drawn)
        oracle = true_gradient(model, window, task.item_losses, merge=task.merge, device=device)
        trace.comparisons.append(compare(grads_of(model), oracle))
        trace.window_batches.append(len(window))
        trace.window_items.append(sum(task.count_items(b) for b in window))

    if loop in (LOOPS["ragged"], LOOPS["amp"]):
        loop_kwargs.setdefault("count_items", task.count_items)
    if loop is LOOPS["large_batch"]:
        loop_kwargs.setdefault("merge", task.merge)
    handle = optimizer.register_step_pre_hook(before_step)
    try:
        trace.logged = loop(model, optimizer, loader, task.item_losses, accum_steps=k, device=device, **loop_kwargs)
    finally:
        handle.remove()
    trace.n_batches = len(loader.drawn)
    trace.n_items = sum(task.count_items(b) for b in loader.drawn)
    return trace


def classify(trace: Trace, *, low_precision: bool = False) -> str:
    """Name what a trace shows: exact, close (bf16), off by ~k, or not exact."""
    worst = max(c.rel_error for c in trace.comparisons)
    if worst <= FLOAT32_RTOL:
        return EXACT
    if low_precision and worst <= BF16_RTOL:
        return CLOSE
    if all(abs(c.norm_ratio - m) <= OFF_BY_K_TOL * m for c, m in zip(trace.comparisons, trace.window_batches)):
        return OFF_BY_K
    return WRONG


def expected_verdict(loop: str, task: Task) -> str:
    """What each loop's docstring promises on each built-in task."""
    if loop == "large_batch":
        return EXACT  # one forward over the window is the oracle itself, BatchNorm included
    if loop == "naive":
        return OFF_BY_K
    if "batchnorm" in task.tags:
        return WRONG  # per-micro-batch statistics: no accumulation loop matches
    if loop == "normalized":
        return WRONG if {"ragged-tail", "token-counts"} & set(task.tags) else EXACT
    if loop == "amp":
        return CLOSE
    return EXACT  # ragged


@dataclass
class Row:
    loop: str
    task: str
    accum_steps: int
    max_rel_error: float
    min_cosine: float
    steps: int
    expected_steps: int
    items_used: int
    items_available: int
    verdict: str
    expected: str

    @property
    def holds(self) -> bool:
        return self.verdict == self.expected


@dataclass
class CheckTable:
    rows: list[Row]

    @property
    def ok(self) -> bool:
        return all(r.holds for r in self.rows)

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, "rows": [asdict(r) | {"holds": r.holds} for r in self.rows]}, indent=2)

    def __str__(self) -> str:
        head = ("loop", "task", "k", "max rel err", "cosine", "steps", "items", "verdict", "expected", "")
        body = [
            (
                r.loop, r.task, str(r.accum_steps), f"{r.max_rel_error:.2e}", f"{r.min_cosine:.4f}",
                f"{r.steps}/{r.expected_steps}", f"{r.items_used}/{r.items_available}",
                r.verdict, r.expected, "ok" if r.holds else "FAIL",
            )
            for r in self.rows
        ]
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines = [fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(b) for b in body]
        held = sum(r.holds for r in self.rows)
        lines.append(f"\n{held}/{len(self.rows)} verdicts hold" + ("" if self.ok else "  <-- FAILED"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = ["loop", "task", "k", "max rel err", "cosine", "steps", "items", "verdict", "expected"]
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                r.loop, r.task, r.accum_steps, f"{r.max_rel_error:.2e}", f"{r.min_cosine:.4f}",
                f"{r.steps}/{r.expected_steps}", f"{r.items_used}/{r.items_available}", r.verdict, r.expected,
            )) + f"<td>{'✓' if r.holds else '✗'}</td></tr>"
            for r in self.rows
        )
        return "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + f"<th></th></tr>{rows}</table>"


def check_reference_loops(
    tasks: Iterable[str] | None = None, loops: Iterable[str] | None = None, device: str | torch.device = "cpu"
) -> CheckTable:
    """Every reference loop on every built-in task, with observed and expected verdicts."""
    rows = []
    for task_name in tasks or TASKS:
        task = get_task(task_name)
        for loop_name in loops or LOOPS:
            if loop_name not in LOOPS:
                raise ValueError(f"loops must name reference loops {sorted(LOOPS)} (got {loop_name!r})")
            trace = trace_loop(LOOPS[loop_name], task, device=device)
            rows.append(Row(
                loop=loop_name,
                task=task.name,
                accum_steps=task.accum_steps,
                max_rel_error=max(c.rel_error for c in trace.comparisons),
                min_cosine=min(c.cosine for c in trace.comparisons),
                steps=len(trace.comparisons),
                expected_steps=expected_steps(trace.n_batches, task.accum_steps),
                items_used=sum(trace.window_items),
                items_available=trace.n_items,
                verdict=classify(trace, low_precision=loop_name == "amp"),
                expected=expected_verdict(loop_name, task),
            ))
    return CheckTable(rows)


