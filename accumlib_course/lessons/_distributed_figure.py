"""Lesson 8's result and its figure: DistributedResult (the all-reduce and error tables) and ``plot``.

A part of ``distributed.py``, which re-exports every name here; nothing here imports the lesson back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from accumlib.text import Table
from accumlib_course.distributed.experiment import COMM_VARIANTS, FLOAT32_RTOL, RunResult

from .. import _style

# Each variant drawn in the lesson's roles: the reference, the costly mistake, and the
# backward-only mistake (same bytes as the costly one, drawn with hollow markers on top of it).
_COMM_STYLE: dict[str, dict[str, Any]] = {
    "no_sync": dict(_style.ROLE["correct"]),
    "every micro-batch": dict(_style.ROLE["buggy"]),
    "no_sync on backward only": dict(_style.ROLE["other"], markerfacecolor="none", markersize=11),
}


@dataclass
class DistributedResult:
    """Everything notebook 8 states: all-reduce counts per k, and both counts' errors per step."""

    world_size: int
    task: str
    accum_steps: int
    ks: tuple[int, ...]
    comm: dict[str, dict[int, RunResult]]  # variant -> k -> what the DDP hook counted per step
    reference: RunResult  # no_sync + global counts at accum_steps, checked against the oracle
    per_rank: RunResult  # no_sync + per-rank counts at accum_steps, checked against the oracle
    seconds: float = 0.0  # wall time of the spawned run

    def bytes_per_step(self, variant: str) -> list[int]:
        """All-reduce payload of the first optimizer step (a full window of k micro-batches), per k."""
        return [self.comm[variant][k].bytes_per_step for k in self.ks]

    def calls_per_step(self, variant: str) -> list[int]:
        return [self.comm[variant][k].calls_per_step for k in self.ks]

    def table(self) -> Table:
        """All-reduce calls and bytes of one optimizer step, per k and variant."""
        rows = [
            (
                k,
                *(
                    f"{self.comm[v][k].calls_per_step} calls, {self.comm[v][k].bytes_per_step:,} B"
                    for v in COMM_VARIANTS
                ),
            )
            for k in self.ks
        ]
        return Table(
            ("k", *COMM_VARIANTS),
            rows,
            caption=(
                f"all-reduce per optimizer step, per rank: world size {self.world_size}, task {self.task}"
            ),
        )

    def error_table(self) -> Table:
        """Worst relative error over the ranks against the large-batch gradient, per optimizer step."""
        rows = [
            (s, f"{max(good):.1e}", f"{max(bad):.1e}")
            for s, (good, bad) in enumerate(zip(self.reference.rel_errors, self.per_rank.rel_errors), 1)
        ]
        return Table(
            ("step", "global count", "per-rank count"),
            rows,
            caption=f"relative error vs the large-batch gradient (float32 tolerance {FLOAT32_RTOL:.0e}), k = "
            f"{self.accum_steps}",
        )

    def token_table(self) -> Table:
        """Tokens per rank in each window, and the weight one token gets with each count."""
        r = self.world_size
        rows = [
            (
                s,
                " + ".join(map(str, items)),
                sum(items),
                f"1/{sum(items)}",
                ", ".join(f"1/{r * n}" for n in items),
            )
            for s, items in enumerate(self.reference.window_items, 1)
        ]
        return Table(
            ("step", "tokens per rank", "N", "weight: global count", "weight per rank: per-rank count"),
            rows,
            caption=f"one token's weight in the averaged gradient, k = {self.accum_steps}, {r} ranks",
        )


def _plain_log_axis(axis: Any) -> None:
    """Log ticks as plain text ('1e-05'): LogFormatterSciNotation would lay out '10^-5' as mathtext."""
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
    axis.set_minor_formatter(NullFormatter())


@_style.styled
def plot(result: DistributedResult) -> Figure:
    """Left: all-reduce KiB per optimizer step against k. Right: error per step, global vs per-rank counts.

    Pyplot-free and mathtext-free: every text on it is plain, so drawing it needs none of
    matplotlib's process-wide mathtext parser (see ``widget`` for why that matters).
    """
    fig, (left, right) = _style.figure(
        2,
        width=12,
        height=4.6,
        title=f"DDP on {result.world_size} rank{'s' if result.world_size > 1 else ''} ({result.task}): "
        f"no_sync keeps one all-reduce per step, "
        "and only the global token count gives the large-batch gradient",
    )
    for v in COMM_VARIANTS:
        left.plot(result.ks, [b / 1024 for b in result.bytes_per_step(v)], label=v, **_COMM_STYLE[v])
    left.set_xticks(result.ks, [str(k) for k in result.ks])
    left.set_ylim(bottom=0)
    left.set_xlabel("accumulation steps k (micro-batches per rank per step)")
    left.set_ylabel("all-reduce KiB per step, per rank")
    left.set_title("Communication per optimizer step (DDP comm hook)")
    left.legend(loc="upper left")

    steps = list(range(1, len(result.reference.rel_errors) + 1))
    ref = [max(s) for s in result.reference.rel_errors]
    bad = [max(s) for s in result.per_rank.rel_errors]
    width = 0.38
    for offset, values, role, label in (
        (-width / 2, ref, "correct", "global count (all-reduced)"),
        (width / 2, bad, "buggy", "per-rank count (local)"),
    ):
        right.bar(
            [s + offset for s in steps],
            values,
            width,
            label=label,
            color=_style.ROLE[role]["color"],
            hatch=_style.HATCH[role],
            edgecolor="white" if role == "correct" else _style.BLACK,
        )
    right.axhline(FLOAT32_RTOL, label=f"float32 tolerance {FLOAT32_RTOL:.0e}", **_style.ROLE["oracle"])
    right.set_yscale("log")
    _plain_log_axis(right.yaxis)
    # room for the legend above the bars
    right.set_ylim(min(ref + [FLOAT32_RTOL]) / 10, max(bad + [FLOAT32_RTOL]) * 3000)
    right.set_xticks(steps, [str(s) for s in steps])
    right.set_xlabel(f"optimizer step (k = {result.accum_steps})")
    right.set_ylabel("relative error vs large batch")
    right.set_title("Gradient error per step: global vs per-rank count")
    right.legend(loc="upper left", ncols=2, fontsize=10)
    return fig
