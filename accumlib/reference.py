"""The reference table: every reference loop on every built-in task, verify's verdict beside the
verdict its contract promises. This is what ``accumlib selfcheck`` prints.

The promises are read from each loop's ``CONTRACT`` (``accumlib.loops``); the verdicts are
``accumlib.verify``'s codes for one epoch of the loop (``accumlib.harness.trace_loop``), the codes a
user's loop gets. A row that disagrees is a loop, a task or verify gone wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from .batches import expected_steps
from .harness import trace_loop, verdict_text
from .loops import ALL, CONTRACTS, LOOPS, Verdict
from .tasks import TASKS, get_task
from .text import html_table, text_table

__all__ = ["CheckTable", "Row", "check_reference_loops"]


@dataclass
class Row:
    """One loop on one task: what verify said (``verdict``: its codes) beside what the loop's contract
    promised (``expected``); the worst step's figures against the true large-batch gradient.

    >>> row = check_reference_loops(tasks=["mlp-digits"], loops=["normalized"]).rows[0]
    >>> row.verdict, row.holds, row.cells()[5:8]
    (('mean-of-means', 'tail-misscaled'), True, ('4/4', '110/110', 'float32'))
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
    verdict: Verdict
    expected: Verdict
    judged_against: (
        str  # what verify compared the steps with: "float32", "bfloat16 replay" (StepRow.judged_against)
    )
    oracle: str  # which of verify's oracles judged the run (Report.oracle)

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
            self.judged_against,
            verdict_text(self.verdict),
            verdict_text(self.expected),
        )


_HEAD = (
    "loop",
    "task",
    "k",
    "max rel err",
    "cosine",
    "steps",
    "items",
    "judged against",
    "verdict",
    "expected",
)


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
    [('naive', ('unscaled-sum',), True), ('ragged', (), True)]
    """
    tasks, loops = list(tasks or TASKS), list(loops or LOOPS)
    for name in loops:
        if name not in CONTRACTS:
            raise ValueError(f"loops must name reference loops {sorted(CONTRACTS)} (got {name!r})")
    task_objs = [get_task(t) for t in tasks]  # an unknown task is refused before any work
    rows = []
    for task in task_objs:
        for name in loops:
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
                    verdict=trace.verdict,
                    expected=CONTRACTS[name].expected(task.tags),
                    judged_against=", ".join(dict.fromkeys(s.judged_against for s in trace.comparisons)),
                    oracle=trace.report.oracle,
                )
            )
    return CheckTable(rows)
