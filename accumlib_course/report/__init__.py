"""The papermill report (``notebooks/report.ipynb``, ``make report``): every reference loop at every k.

``run(...)`` checks the report's parameters, runs every reference loop at every k, and returns a
``ReportResult``; with ``results_path`` it also writes every number as JSON (``reports/report.json``
under ``make report``), so the HTML carries tables and figures, never raw JSON.

    make report ACCUM="1 2 4 8" TASK=mlp-digits BATCH=3 NORM=group PRECISION=float32 DEVICE=auto SEED=0

One module per stage: ``params`` (defaults and checks), ``compute`` (the computation, ``run``; its
result's classes in ``_compute_result``), ``figures`` (plots with titles computed from the findings, and alt
text), ``render`` (``make report``: papermill, then the HTML page without code). Every k must give at least
``MIN_STEPS`` optimizer steps, or the per-step figures show one dot, and the refusal says which k and
batch sizes would:

>>> check_parameters(accum_steps="1 2 4 8", batch_size=16)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: accum_steps and batch_size must give every k at least 3 optimizer steps, ... so k = 4, 8 \
give 2, 1 steps (got accum_steps='1 2 4 8', batch_size=16); use k <= 3, or batch_size <= 6
"""

from .compute import Cell, Findings, ReportResult, results_note, run
from .figures import (
    ZERO,
    alt_errors,
    alt_memory_and_norm,
    alt_steps,
    plot_errors,
    plot_memory_and_norm,
    plot_steps,
    show,
    title_errors,
    title_memory_and_norm,
)
from .params import (
    DEFAULTS,
    MIN_STEPS,
    NORMS,
    PRECISIONS,
    TASK_NAMES,
    Parameters,
    check_parameters,
    cnn_task,
    parse_accum,
    resolve_task,
)

__all__ = [
    "DEFAULTS",
    "MIN_STEPS",
    "NORMS",
    "PRECISIONS",
    "TASK_NAMES",
    "ZERO",
    "Cell",
    "Findings",
    "Parameters",
    "ReportResult",
    "alt_errors",
    "alt_memory_and_norm",
    "alt_steps",
    "check_parameters",
    "cnn_task",
    "parse_accum",
    "plot_errors",
    "plot_memory_and_norm",
    "plot_steps",
    "resolve_task",
    "results_note",
    "run",
    "show",
    "title_errors",
    "title_memory_and_norm",
]
