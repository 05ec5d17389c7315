"""Lesson 9: real bugs in real libraries, under ``accumlib.verify``.

``compute(reports)`` gathers the fitted factor ``c`` of the true gradient (G = c g*) of every
optimizer step of the libraries' own loops: Accelerate's ``accumulate()``, Lightning's
``accumulate_grad_batches`` and the Transformers ``Trainer`` (``RUNS``; a run the notebook has not
made is made here). ``plot(result)`` draws c per step per library, ``alt(result)`` says the same
in words. ``update_ratios(report)`` says what GPT-2's c does to the parameter updates: each step's
||Δθ_bug|| / ||Δθ_fixed||, the Trainer as configured over ``loss_type = "ForCausalLM"``, under SGD
(c itself) and under the Trainer's default AdamW (about 1). ``widget()`` builds a tiny causal LM of
a class the learner picks and runs the Trainer under ``accumlib.hf.verify_trainer`` live;
``EXERCISE`` grades a Trainer configuration (``train_fn(model, train_dataset, data_collator,
output_dir)`` returns the Trainer) by ``verify_trainer``. The parts are in ``_real_bugs_runs.py``
(the runs), ``_real_bugs_widget.py`` (the widget and the exercise) and ``_real_bugs_updates.py``
(the update sizes per optimizer).

>>> sorted(RUNS)
['accelerate', 'accelerate-clm', 'lightning', 'trainer-gpt2', 'trainer-gpt2-fixed']
>>> compute({"deepspeed": None})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: reports must be keyed by run names 'accelerate', ..., 'trainer-gpt2-fixed' (got 'deepspeed')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from accumlib.text import Table

from .. import _style
from ._real_bugs_runs import RUNS, make_trainer, run
from ._real_bugs_updates import ADAMW_RTOL, OPTIMIZERS, UpdateRatios, update_ratios
from ._real_bugs_widget import EXERCISE, MODEL_TYPES, TrainerRun, trainer_run, widget

__all__ = [
    "ADAMW_RTOL",
    "EXERCISE",
    "MODEL_TYPES",
    "OPTIMIZERS",
    "RUNS",
    "LibraryRuns",
    "TrainerRun",
    "UpdateRatios",
    "alt",
    "compute",
    "make_trainer",
    "plot",
    "run",
    "show",
    "trainer_run",
    "update_ratios",
    "widget",
]


@dataclass
class LibraryRuns:
    """verify's reports of the libraries' own loops, by run name (``RUNS``), in ``RUNS`` order."""

    reports: dict[str, Any]

    def factors(self, name: str) -> list[float]:
        """c of every optimizer step of run ``name``."""
        return [r.factor for r in self.reports[name].steps]

    def table(self) -> Table:
        """One row per run: library, c per step, codes, verdict."""
        rows = [
            (
                RUNS[n].label,
                ", ".join(f"{c:.3f}" for c in self.factors(n)),
                ", ".join(sorted(rep.codes)) or "-",
                "ok" if rep.ok else "NOT OK",
            )
            for n, rep in self.reports.items()
        ]
        return Table(
            ("library's own loop", "c per optimizer step", "codes", "verdict"),
            rows,
            caption="c: the fitted factor of the true gradient at each optimizer step (1 is right)",
        )


def compute(reports: Mapping[str, Any] | None = None) -> LibraryRuns:
    """The reports of every run in ``RUNS``: those given (by run name), the others run here."""
    given = dict(reports or {})
    for name in given:
        if name not in RUNS:
            raise ValueError(
                f"reports must be keyed by run names {', '.join(repr(n) for n in RUNS)} (got {name!r})"
            )
    for name, report in given.items():
        if not hasattr(report, "steps") or not hasattr(report, "codes"):
            raise TypeError(f"reports[{name!r}] must be an accumlib.Report (got {type(report).__name__})")
    return LibraryRuns({name: given[name] if name in given else run(name) for name in RUNS})


@_style.styled
def plot(result: LibraryRuns) -> Figure:
    """c per optimizer step, one line per library's loop; the true gradient at c = 1."""
    fig, ax = _style.figure(
        width=10.0, height=6.4, title="c per optimizer step, per library (c = 1: the true gradient)"
    )
    names = list(result.reports)
    longest = max(len(result.factors(n)) for n in names)
    ax.axhline(1.0, label="true gradient (c = 1)", **_style.ROLE["oracle"])
    for i, name in enumerate(names):
        cs = result.factors(name)
        # runs with equal c (Accelerate and Lightning) stay visible side by side
        dodge = (i - (len(names) - 1) / 2) * 0.06
        ax.plot(
            [s + dodge for s in range(len(cs))],
            cs,
            label=RUNS[name].label,
            color=_style.PALETTE[i % len(_style.PALETTE)],
            marker=_style.MARKERS[i % len(_style.MARKERS)],
            linestyle=_style.LINESTYLES[i % len(_style.LINESTYLES)],
            markersize=8,
        )
    ax.set_xticks(range(longest), [str(s) for s in range(longest)])
    ax.set_xlabel("optimizer step (the last holds the short last window)")
    ax.set_ylabel("c  (G = c g*)")
    fig.legend(loc="outside lower center", ncols=2)
    return fig


def show(result: LibraryRuns) -> None:
    """Display ``plot(result)`` with ``alt(result)`` as its alt text."""
    _style.show(plot(result), alt=alt(result))


def alt(result: LibraryRuns) -> str:
    """The figure in words, from its numbers."""
    parts = [
        f"{RUNS[n].label}: c = {', '.join(f'{c:.3f}' for c in result.factors(n))}" for n in result.reports
    ]
    return (
        "Line chart of c, the fitted factor of the true gradient, at each optimizer step of each library's "
        "own loop "
        "(c = 1 is the true gradient). " + "; ".join(parts) + "."
    )
