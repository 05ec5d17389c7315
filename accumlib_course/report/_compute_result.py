"""The report's result: each loop's ``Cell`` at each k, and the ``ReportResult`` that the tables, the
findings, the figures and the JSON summary read (``compute.run`` builds it).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from accumlib.batches import expected_steps
from accumlib.text import Table, fmt_error
from accumlib.tolerances import AUTOCAST_RTOL, FLOAT32_RTOL

from .params import MIN_STEPS


@dataclass(frozen=True)
class Cell:
    """One loop at one k: every step against the oracle, and what the epoch covered."""

    loop: str
    k: int
    rel_errors: tuple[float, ...]  # per optimizer step, ||g - g*|| / ||g*||
    # micro-batches per optimizer step (the tail window may hold fewer than k)
    window_batches: tuple[int, ...]
    min_cosine: float
    max_norm_ratio: float
    expected_steps: int
    items_used: int
    items: int
    verdict: str  # verify's codes for the run ("ok": none), as accumlib.harness.verdict_text writes them
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
class Findings:
    """The report's findings: a bulleted list in the HTML report, one ``- `` line each as text."""

    lines: tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join(f"- {line}" for line in self.lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in self.lines) + "</ul>"


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
    # k -> (activation bytes of one micro-batch, of the k-fold large batch)
    memory: dict[int, tuple[int, int]]
    norm_errors: dict[int, float]  # k -> worst relative error of ragged with the chosen norm layer

    @property
    def loops(self) -> list[str]:
        return list(dict.fromkeys(name for name, _ in self.cells))

    @property
    def exact_loops(self) -> list[str]:
        """The loops exact at every k (what the error figure's title names): verify passed every run against
        the float32 large-batch gradient (an autocast loop's ``ok`` is against its own dtype's replay, not
        exact), and every item was stepped (verify says ``tail-dropped`` too; the columns say it again)."""

        def exact(c: Cell) -> bool:
            return (
                c.verdict == "ok"
                and not c.ref_errors
                and c.items_used == c.items
                and c.steps == c.expected_steps
            )

        return [name for name in self.loops if all(exact(self.cells[(name, k)]) for k in self.ks)]

    @property
    def norm_inexact_ks(self) -> list[int]:
        """The k at which the exact loop on the CNN misses the large batch by more than float32 rounding:
        none for group norm or no norm (per-sample), every k >= 2 for batch norm. The norm finding and
        the figure titles read this one rule."""
        return [k for k, e in self.norm_errors.items() if e > FLOAT32_RTOL]

    def worst_k(self, loop: str) -> int:
        """The k of ``loop``'s worst step, the same on every CPU: the smallest k whose worst error is within
        float32 rounding of the largest. Errors of at most ``FLOAT32_RTOL`` are all rounding (an exact loop
        has no worst k: the smallest is named), and two larger errors closer than ``FLOAT32_RTOL`` relative
        are one error (normalized's 0.75 at k = 4 and at k = 8), so no choice rests on the last digits.
        """
        errors = {k: self.cells[(loop, k)].max_rel_error for k in self.ks}
        top = max(errors.values())

        def tied(e: float) -> bool:
            return top <= FLOAT32_RTOL or top - e <= FLOAT32_RTOL * top

        return min(k for k, e in errors.items() if tied(e))

    def settings(self) -> Table:
        return Table(
            ("setting", "value"),
            [
                # the task's own description states its default batch and k, not the report's
                ("task", self.task),
                ("accumulation steps k", " ".join(map(str, self.ks))),
                ("micro-batch size", self.batch_size),
                ("data", f"{self.n_items} items in {self.n_batches} micro-batches"),
                (
                    "optimizer steps per epoch",
                    ", ".join(f"{expected_steps(self.n_batches, k)} at k = {k}" for k in self.ks),
                ),
                ("norm layer (CNN section)", self.norm),
                ("precision (amp loop)", self.precision),
                ("device", self.device),
                ("seed", self.seed),
            ],
            caption="The report's parameters",
        )

    def loop_table(self) -> Table:
        rows = [
            (
                c.loop,
                c.k,
                fmt_error(c.max_rel_error),
                round(c.min_cosine, 4),
                round(c.max_norm_ratio, 3),
                f"{c.steps}/{c.expected_steps}",
                f"{c.items_used}/{c.items}",
                c.verdict,
            )
            for c in self.cells.values()
        ]
        return Table(
            (
                "loop",
                "k",
                "max rel. error",
                "min cosine",
                "max norm ratio",
                "steps",
                "items stepped",
                "verdict",
            ),
            rows,
            caption="Every loop at every k, its worst step against the large batch",
        )

    def memory_table(self) -> Table:
        return Table(
            ("k", "items per step", "micro-batch KiB", "large batch KiB", "saved"),
            [
                (k, k * self.batch_size, round(m / 1024, 1), round(big / 1024, 1), f"{big / m:.2f}x")
                for k, (m, big) in self.memory.items()
            ],
            caption="Activation memory of one forward pass",
        )

    def norm_table(self) -> Table:
        return Table(
            ("k", "max rel. error vs large batch"),
            [(k, fmt_error(e)) for k, e in self.norm_errors.items()],
            caption=f"accumlib.ragged on SmallCNN with {self.norm} norm",
        )

    def findings(self) -> list[str]:
        """The report's conclusions, each sentence computed from the numbers above it."""
        out = []
        for name in self.loops:
            by_verdict: dict[str, list[int]] = {}
            for k in self.ks:
                by_verdict.setdefault(self.cells[(name, k)].verdict, []).append(k)
            parts = [f"{verdict} at k = {', '.join(map(str, ks))}" for verdict, ks in by_verdict.items()]
            worst = self.worst_k(name)
            cell = self.cells[(name, worst)]
            replay = [e for k in self.ks for e in self.cells[(name, k)].ref_errors]
            judged = (
                f"; against the {self.precision} replay that verify judges by: "
                f"{fmt_error(max(replay), AUTOCAST_RTOL, 'autocast rounding')}"
                if replay
                else ""
            )
            out.append(
                f"{name}: {'; '.join(parts)} (worst step: relative error {fmt_error(cell.max_rel_error)} "
                f"at k = {worst}{judged}, {cell.items_used}/{cell.items} items stepped)."
            )
        dropped = [c for c in self.cells.values() if c.items_used < c.items]
        if dropped:
            out.append(
                "Items that reached no optimizer step: "
                + ", ".join(f"{c.loop} at k = {c.k}: {c.items - c.items_used}" for c in dropped)
                + "."
            )
        k_max = max(self.ks)
        m, big = self.memory[k_max]
        out.append(
            f"Activation memory: one micro-batch of {self.batch_size} needs {m / 1024:.1f} KiB; "
            f"the large batch of k = {k_max} micro-batches would need {big / 1024:.1f} KiB ({big / m:.2f}x)."
        )
        norm_worst = max(self.norm_errors.values())
        out.append(
            f"SmallCNN with {self.norm} norm, accumulated exactly (accumlib.ragged): worst relative error "
            f"{fmt_error(norm_worst)} over k = {', '.join(map(str, self.ks))}"
            + (
                " (exact: per-sample normalization does not see the micro-batching)."
                if not self.norm_inexact_ks
                else f" (not exact at k = {', '.join(map(str, self.norm_inexact_ks))}: the layer's batch "
                "statistics differ between micro-batches and the large batch)."
            )
        )
        return out

    def findings_list(self) -> Findings:
        """``findings()`` as the report shows them: a bulleted list."""
        return Findings(tuple(self.findings()))

    def summary(self) -> dict[str, Any]:
        """Everything the report states, as plain JSON: what ``make report`` writes and
        ``tests/test_report.py`` checks."""
        return {
            "task": self.task,
            "accum_steps": list(self.ks),
            "batch_size": self.batch_size,
            "norm": self.norm,
            "precision": self.precision,
            "device": self.device,
            "seed": self.seed,
            "n_items": self.n_items,
            "n_batches": self.n_batches,
            "min_steps": MIN_STEPS,
            "loops": [
                {
                    "loop": c.loop,
                    "k": c.k,
                    "max_rel_error": c.max_rel_error,
                    "min_cosine": c.min_cosine,
                    "max_norm_ratio": c.max_norm_ratio,
                    "steps": c.steps,
                    "expected_steps": c.expected_steps,
                    "items_used": c.items_used,
                    "items": c.items,
                    "verdict": c.verdict,
                    "rel_errors": list(c.rel_errors),
                    "window_batches": list(c.window_batches),
                    "logged": list(c.logged),
                    **({"replay_rel_errors": list(c.ref_errors)} if c.ref_errors else {}),
                }
                for c in self.cells.values()
            ],
            "memory": {
                str(k): {"micro_batch_bytes": m, "large_batch_bytes": big}
                for k, (m, big) in self.memory.items()
            },
            "norm_max_rel_error": {str(k): e for k, e in self.norm_errors.items()},
            "findings": self.findings(),
        }
