"""What ``verify`` hands back: one row per optimizer step and the named findings.

``Report.ok`` is True only when no finding is a bug or a limit; a ``note`` (dropout
handled by the comparison) does not make a loop wrong.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

# The codes of issue 3, plus three for runs that fit none of them (kept apart so a
# reader of CODES sees which ones name an accumulation bug).
CODES: dict[str, str] = {
    "unscaled-sum": "bug",
    "mean-of-means": "bug",
    "tail-dropped": "bug",
    "tail-misscaled": "bug",
    "zero-grad-inside-window": "bug",
    "no-zero-grad": "bug",
    "early-step": "bug",
    "scheduler-per-micro-batch": "bug",
    "clip-per-micro-batch": "bug",
    "clip-before-unscale": "bug",
    "logged-loss-scaled": "bug",
    "batchnorm": "limit",
    "dropout": "note",
    # outside the list: a step that none of the codes above explains,
    # a gradient with inf/nan, and a step over a window without a single item
    "unexplained": "bug",
    "non-finite": "bug",
    "no-items": "bug",
}


def _finite(v: Any) -> Any:
    """JSON has no NaN: a step without a reference (no items, inf/nan) reports null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


@dataclass(frozen=True)
class Finding:
    """One named problem: ``code`` (a key of ``CODES``), what was seen, how to fix it, and where."""

    code: str
    message: str
    fix: str
    steps: tuple[int, ...] = ()

    @property
    def severity(self) -> str:
        return CODES[self.code]

    def __str__(self) -> str:
        where = f" (steps {', '.join(map(str, self.steps))})" if self.steps else ""
        return f"[{self.code}]{where} {self.message}\n    fix: {self.fix}"


@dataclass(frozen=True)
class StepRow:
    """One optimizer step: its window, how its gradient compares with the oracle, its codes."""

    step: int
    micro_batches: int
    items: int
    lr: float
    norm_ratio: float  # ||captured|| / ||true large-batch gradient||
    rel_error: float  # ||captured - true|| / ||true||
    codes: tuple[str, ...]


@dataclass
class Report:
    """The verdict of ``verify``: per-step rows, findings, and the run's totals.

    >>> r = Report(steps=[], findings=[], accum_steps=4, items_stepped=0, items_total=0)
    >>> r.ok
    True
    """

    steps: list[StepRow]
    findings: list[Finding]
    accum_steps: int
    items_stepped: int
    items_total: int
    logged_loss: float | None = None
    true_loss: float | None = None

    @property
    def ok(self) -> bool:
        return all(f.severity == "note" for f in self.findings)

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "accum_steps": self.accum_steps,
            "items_stepped": self.items_stepped,
            "items_total": self.items_total,
            "logged_loss": _finite(self.logged_loss),
            "true_loss": _finite(self.true_loss),
            "findings": [asdict(f) | {"severity": f.severity} for f in self.findings],
            "steps": [{k: _finite(v) for k, v in asdict(s).items()} for s in self.steps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def _cells(self) -> list[tuple[str, ...]]:
        return [
            (str(s.step), str(s.micro_batches), str(s.items), f"{s.lr:.4g}", f"{s.norm_ratio:.4f}",
             f"{s.rel_error:.2e}", ", ".join(s.codes) or "ok")
            for s in self.steps
        ]

    def __str__(self) -> str:
        head = ("step", "micro-batches", "items", "lr", "|g|/|g*|", "rel err", "codes")
        body = self._cells()
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines = [fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(b) for b in body]
        lines.append(f"\nitems that reached an optimizer step: {self.items_stepped}/{self.items_total}")
        if self.logged_loss is not None and self.true_loss is not None:
            lines.append(f"loss the loop reported: {self.logged_loss:.4f}   true mean item loss: {self.true_loss:.4f}")
        lines.append("verdict: " + ("OK, every step saw the true large-batch gradient" if self.ok else "NOT OK"))
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = ["step", "micro-batches", "items", "lr", "|g|/|g*|", "rel err", "codes"]
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in self._cells())
        found = "".join(
            f"<li><code>{html.escape(f.code)}</code> {html.escape(f.message)}<br><i>fix:</i> {html.escape(f.fix)}</li>"
            for f in self.findings
        )
        verdict = "✓ OK" if self.ok else "✗ NOT OK"
        return (
            f"<p><b>{verdict}</b>: {self.items_stepped}/{self.items_total} items reached an optimizer step</p>"
            f"<table><tr>{''.join(f'<th>{c}</th>' for c in cols)}</tr>{rows}</table><ul>{found}</ul>"
        )
