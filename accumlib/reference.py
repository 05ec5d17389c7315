"""The reference table: every reference loop on every built-in task, observed verdict beside the
verdict its contract promises. This is what ``accumlib selfcheck`` prints.

The promises are read from each loop's ``CONTRACT`` (``accumlib.loops``); the observations come
from ``accumlib.harness``. A row that disagrees is a loop, a task or an oracle gone wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from .batches import expected_steps
from .harness import classify, trace_loop
from .loops import ALL, CONTRACTS, LOOPS
from .tasks import TASKS, get_task
from .text import html_table, text_table

__all__ = ["CheckTable", "Row", "check_reference_loops"]


@dataclass
class Row:
    """One loop on one task: what the oracle saw (``verdict``) beside what its contract promised
    (``expected``).

    >>> row = check_reference_loops(tasks=["mlp-digits"], loops=["normalized"]).rows[0]
    >>> row.verdict, row.expected, row.holds, row.cells()[5:7]
    ('not exact', 'not exact', True, ('4/4', '110/110'))
    """

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

    def cells(self) -> tuple[str, ...]:
        return (
            self.loop,
            self.task,
            str(self.accum_steps),
            f"{self.max_rel_error:.2e}",
            f"{self.min_cosine:.4f}",
            f"{self.steps}/{self.expected_steps}",
            f"{self.items_used}/{self.items_available}",
            self.verdict,
            self.expected,
        )


_HEAD = ("loop", "task", "k", "max rel err", "cosine", "steps", "items", "verdict", "expected")


@dataclass
class CheckTable:
    """The reference table: text for terminals (``accumlib selfcheck``), HTML for notebooks, JSON for tools.

    >>> table = check_reference_loops(tasks=["lm-tokens"], loops=["ragged"])
    >>> table.ok, str(table).splitlines()[-1]
    (True, '1/1 verdicts hold')
    """

    rows: list[Row]

    @property
    def ok(self) -> bool:
        return all(r.holds for r in self.rows)

    def to_json(self) -> str:
        return json.dumps(
            {"ok": self.ok, "rows": [asdict(r) | {"holds": r.holds} for r in self.rows]}, indent=2
        )

    def __str__(self) -> str:
        lines = text_table((*_HEAD, ""), [(*r.cells(), "ok" if r.holds else "FAIL") for r in self.rows])
        held = sum(r.holds for r in self.rows)
        lines.append(f"\n{held}/{len(self.rows)} verdicts hold" + ("" if self.ok else "  <-- FAILED"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return html_table((*_HEAD, ""), [(*r.cells(), "✓" if r.holds else "✗") for r in self.rows])


def check_reference_loops(
    *,
    tasks: Iterable[str] | None = None,
    loops: Iterable[str] | None = None,
    device: str | torch.device | None = None,
) -> CheckTable:
    """Every reference loop on every built-in task, with observed and promised verdicts.

    >>> table = check_reference_loops(tasks=["mlp-digits"], loops=["naive", "ragged"])
    >>> [(r.loop, r.verdict, r.holds) for r in table.rows]
    [('naive', 'off by ~k', True), ('ragged', 'exact', True)]
    """
    tasks, loops = list(tasks or TASKS), list(loops or LOOPS)
    for name in loops:
        if name not in CONTRACTS:
            raise ValueError(f"loops must name reference loops {sorted(CONTRACTS)} (got {name!r})")
    task_objs = [get_task(t) for t in tasks]  # an unknown task is refused before any work
    rows = []
    for task in task_objs:
        for name in loops:
            contract = CONTRACTS[name]
            # the harness passes the contract's task fields
            trace = trace_loop(ALL[name], task, device=device)
            rows.append(
                Row(
                    loop=name,
                    task=task.name,
                    accum_steps=task.accum_steps,
                    max_rel_error=max(c.rel_error for c in trace.comparisons),
                    min_cosine=min(c.cosine for c in trace.comparisons),
                    steps=len(trace.comparisons),
                    expected_steps=expected_steps(trace.n_batches, task.accum_steps),
                    items_used=sum(trace.window_items),
                    items_available=trace.n_items,
                    verdict=classify(trace, low_precision=contract.low_precision),
                    expected=contract.expected(task.tags),
                )
            )
    return CheckTable(rows)
