"""The report stage: what ``verify`` hands back, one row per optimizer step and the named findings.

``Report.ok`` is True only when no finding is a bug or a limit; a ``note`` (dropout handled
by the comparison, a clip verify assumed, a run ended by ``max_steps``) does not make a loop wrong.
``Report.status`` tells the three outcomes apart, as the command line's exit status does:
``ok`` (0), ``bug`` (1: a finding of kind bug), ``cannot-judge`` (4: no bug in what was judged,
but a limit kept verify from judging all of it). Exit 2 (usage) and 3 (the user's code raised)
have no Report: nothing was judged.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..text import text_table
from .codes import CODES, PASSING, Kind

if TYPE_CHECKING:
    from .diagnose import Fit


def _finite(v: Any) -> Any:
    """JSON has no NaN: a step without a reference (no items, inf/nan) reports null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


# what `accumlib verify` exits with, one CI can act on
EXIT_STATUS = {"ok": 0, "bug": 1, "usage": 2, "raised": 3, "cannot-judge": 4}


@dataclass(frozen=True)
class Finding:
    """One named problem: ``code`` (a key of ``CODES``), what was seen, how to fix it, and where.

    Built with ``Finding.of``, which words it from the codes table; the constructor takes the text as it is
    (a report read back, a test).

    >>> f = Finding.of("tail-misscaled", steps=(3,), k=4)
    >>> f.code in CODES, f.steps, f.message
    (True, (3,), 'the last, partial window was divided as if it held all 4 micro-batches')"""

    code: str
    message: str
    fix: str
    steps: tuple[int, ...] = ()
    where: tuple[str, ...] = ()  # file:line of the user's calls that made it (``CODES[code].at``)

    @classmethod
    def of(
        cls,
        code: str,
        *,
        form: str = "",
        steps: Iterable[int] = (),
        details: Iterable[str] = (),
        fix: str = "",
        where: Iterable[str] = (),
        **fields: Any,
    ) -> Finding:
        """The finding of ``code`` worded by ``CODES``: its message (or its ``said[form]``) filled from
        ``fields``, the first two ``details`` of the run in parentheses, its fix (``fix``: a known cause's
        own, from ``diagnose.CAUSES``).

        >>> Finding.of("clip-assumed", form="norm", max_norm=0.1).message.endswith("(max_norm ~= 0.1)")
        True
        """
        entry = CODES[code]
        template = entry.said[form] if form else "{message}"
        message = template.format(
            message=entry.message.format(**fields) if "{message}" in template else "", **fields
        )
        details = list(details)
        if details:
            more = f" | ... ({len(details) - 2} more)" if len(details) > 2 else ""
            message += f" ({' | '.join(details[:2])}{more})"
        return cls(code, message, fix or entry.fix, tuple(steps), tuple(where))

    @property
    def severity(self) -> Kind:
        """``bug``, ``limit``, ``note`` or ``cost`` (the code's kind in ``CODES``)."""
        return CODES[self.code].kind

    def __str__(self) -> str:
        steps = f" (steps {', '.join(map(str, self.steps))})" if self.steps else ""
        at = f"\n    at: {', '.join(self.where)}" if self.where else ""
        return f"[{self.code}]{steps} {self.message}{at}\n    fix: {self.fix}"


@dataclass(frozen=True)
class StepRow:
    """One optimizer step: its window, how its gradient compares with the oracle, its codes.

    ``norm_ratio`` and ``rel_error`` compare like with like: the gradient the optimizer saw with
    the float32 large-batch gradient, clipped as the loop clipped (recorded or assumed).
    ``factor`` is c of the best fit G ~= c g* (1 for a correct step; clipping undone),
    ``judged_against`` names what the verdict was judged against (``ref_error``: how far off), and ``clip``
    is the factor the loop's clip scaled the window's gradient by (1.0 when no clip acted). An
    ``unexplained`` step says as data what its finding's detail says in words: ``fit``, what the fits of
    G found (``diagnose.Fit``: ``micro-batch-weights`` reproduce it but are no known bug's,
    ``weights-unmet``, ``no-weights``, ``no-rank-factor`` in a job), and a job's every step its
    ``items_per_rank`` (each rank's window item count N_r). A ``misscaled`` step names the known cause its c
    matches as ``cause`` (the key in ``diagnose.CAUSES`` its finding's words come from).
    """

    step: int
    micro_batches: int
    items: int
    lr: float
    norm_ratio: float  # ||captured|| / ||true large-batch gradient||
    rel_error: float  # ||captured - true|| / ||true||
    codes: tuple[str, ...]
    factor: float = math.nan
    judged_against: str = "float32"
    clip: float = 1.0  # the coefficient the loop's clip applied (recorded, or assumed), 1.0 when none acted
    ref_error: float = math.nan  # ||G (clip undone) - reference|| / ||reference||: what the verdict read
    fit: Fit | None = None  # unexplained: what the fits of G found (None at any other step)
    items_per_rank: tuple[int, ...] = ()  # a job's N_r, rank by rank (empty for one process)
    cause: str = (
        ""  # misscaled: the known cause its c matches (a key of diagnose.CAUSES, e.g. "shift"), or ""
    )
    # each micro-batch's effective weight (1 is right): what its items' loss gradients were multiplied by
    # on the way to the optimizer, over 1/N, every factor .grad took included but a clip; () in a job
    weights: tuple[float, ...] = ()

    @property
    def cosine(self) -> float:
        """cos(G, g*), from the two figures above: ||G - g*||^2 = ||G||^2 + ||g*||^2 - 2 G.g*, divided by
        ||g*||^2, gives G.g* / ||g*||^2 = (1 + r^2 - e^2) / 2 with r the norm ratio and e the relative error.

        >>> StepRow(0, 4, 32, 0.1, norm_ratio=4.0, rel_error=3.0, codes=()).cosine  # naive: 4 g*
        1.0
        >>> StepRow(0, 4, 32, 0.1, norm_ratio=1.0, rel_error=1.0, codes=()).cosine  # 60 degrees apart
        0.5
        """
        r, e = self.norm_ratio, self.rel_error
        if not (r > 0 and math.isfinite(r) and math.isfinite(e)):
            return math.nan  # a zero or non-finite gradient has no direction
        return max(-1.0, min(1.0, (1 + r * r - e * e) / (2 * r)))


@dataclass(frozen=True)
class Report:
    """The verdict of ``verify``: per-step rows, findings, and the run's totals. Immutable: an adapter
    that knows more (``accumlib.hf``) adds it with ``with_finding``, which returns a new report.

    >>> r = Report(steps=[], findings=[], accum_steps=4, items_stepped=0, items_total=0)
    >>> r.ok, r.findings
    (True, ())
    >>> r.with_finding(Finding.of("dropout")).codes
    {'dropout'}
    """

    steps: tuple[StepRow, ...]
    findings: tuple[Finding, ...]
    accum_steps: int
    items_stepped: int
    items_total: int | None
    logged_loss: float | None = None
    true_loss: float | None = None
    # which oracle judged the run: "in-place" (the loop's own backward), "recompute" (every micro-batch
    # replayed), "recompute (why)" where verify ran the loop again because the engine could not judge a step
    oracle: str = "recompute"

    # the dataclass's own __init__ as its callers see it: any sequence of rows and findings (__post_init__)
    if TYPE_CHECKING:

        def __init__(
            self,
            steps: Sequence[StepRow],
            findings: Sequence[Finding],
            accum_steps: int,
            items_stepped: int,
            items_total: int | None,
            logged_loss: float | None = None,
            true_loss: float | None = None,
            oracle: str = "recompute",
        ) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))  # lists are taken, tuples kept
        object.__setattr__(self, "findings", tuple(self.findings))

    def with_finding(self, finding: Finding) -> Report:
        """This report with ``finding`` added; where a finding of its code is there already, one finding
        says both (its message, then the new one after "; ", the steps of both).

        >>> r = Report([], [Finding.of("dropout", form="layers", layers=1, ps=[0.1])], 4, 0, 0)
        >>> more = r.with_finding(Finding.of("dropout", form="randomness-too", names="attn_pdrop=0.1"))
        >>> len(more.findings), more.findings[0].message.endswith("(attn_pdrop=0.1) were set to 0 too")
        (1, True)
        """
        at = next((i for i, f in enumerate(self.findings) if f.code == finding.code), None)
        if at is None:
            return replace(self, findings=self.findings + (finding,))
        old = self.findings[at]
        steps = tuple(sorted(set(old.steps) | set(finding.steps)))
        merged = replace(old, message=f"{old.message}; {finding.message}", steps=steps)
        return replace(self, findings=self.findings[:at] + (merged,) + self.findings[at + 1 :])

    @property
    def ok(self) -> bool:
        return all(f.severity in PASSING for f in self.findings)

    @property
    def status(self) -> Literal["ok", "bug", "cannot-judge"]:
        """``ok``, ``bug`` or ``cannot-judge`` (see ``EXIT_STATUS`` for the command line's codes)."""
        kinds = {f.severity for f in self.findings}
        return "bug" if "bug" in kinds else "cannot-judge" if "limit" in kinds else "ok"

    @property
    def exit_status(self) -> int:
        """The command line's exit status for this report: 0, 1 or 4."""
        return EXIT_STATUS[self.status]

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "accum_steps": self.accum_steps,
            "items_stepped": self.items_stepped,
            "items_total": self.items_total,
            "logged_loss": _finite(self.logged_loss),
            "true_loss": _finite(self.true_loss),
            "oracle": self.oracle,
            "findings": [asdict(f) | {"severity": f.severity} for f in self.findings],
            "steps": [{k: _finite(v) for k, v in asdict(s).items()} for s in self.steps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    _HEAD = (
        "step",
        "micro-batches",
        "items",
        "lr",
        "clip",
        "|g|/|g*|",
        "rel err",
        "c",
        "judged against",
        "codes",
    )

    def _columns(self) -> tuple[list[str], list[tuple[str, ...]]]:
        clipped = any(s.clip < 1 for s in self.steps)  # the clip column only when some step was clipped
        head = [h for h in self._HEAD if clipped or h != "clip"]
        rows = [
            (str(s.step), str(s.micro_batches), str(s.items), f"{s.lr:.4g}")
            + ((f"{s.clip:.3g}" if s.clip < 1 else "-",) if clipped else ())
            + (
                f"{s.norm_ratio:.4f}",
                f"{s.rel_error:.2e}",
                f"{s.factor:.4f}",
                f"{s.judged_against} ({s.ref_error:.1e})",
                ", ".join(s.codes) or "ok",
            )
            for s in self.steps
        ]
        return head, rows

    def _verdict(self) -> str:
        if self.status == "cannot-judge":
            limits = sorted({f.code for f in self.findings if f.severity == "limit"})
            return (
                f"CANNOT JUDGE ({', '.join(limits)}): no bug found, but the run could not be judged in full "
                "(see below)"
            )
        if not self.ok:
            return "NOT OK"
        return "OK, every judged step saw the true large-batch gradient" + (
            " (within the rounding of its reference)"
            if any(s.judged_against != "float32" for s in self.steps)
            else ""
        )

    def __str__(self) -> str:
        head, body = self._columns()
        lines = text_table(head, body)
        total = "?" if self.items_total is None else str(self.items_total)
        lines.append(f"\nitems that reached an optimizer step: {self.items_stepped}/{total}")
        if self.logged_loss is not None and self.true_loss is not None:
            lines.append(
                f"loss the loop reported: {self.logged_loss:.4f}   true mean item loss: {self.true_loss:.4f}"
            )
        lines.append("verdict: " + self._verdict())
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head, body = self._columns()
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in body
        )
        found = "".join(
            f"<li><code>{html.escape(f.code)}</code> ({f.severity}) {html.escape(f.message)}"
            + (f"<br><i>at:</i> {html.escape(', '.join(f.where))}" if f.where else "")
            + "<br><i>fix:</i> "
            f"{html.escape(f.fix)}</li>"
            for f in self.findings
        )
        verdict = ("✓ " if self.ok else "✗ ") + self._verdict()
        total = "?" if self.items_total is None else str(self.items_total)
        return (
            f"<p><b>{html.escape(verdict)}</b>: {self.items_stepped}/{total} items reached an optimizer "
            "step</p>"
            f"<table><tr>{''.join(f'<th>{html.escape(c)}</th>' for c in head)}</tr>{rows}</table>"
            f"<ul>{found}</ul>"
        )


__all__ = ["EXIT_STATUS", "Finding", "Report", "StepRow"]
