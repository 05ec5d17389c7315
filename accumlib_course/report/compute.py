"""The report's computation: every reference loop at every k, each step against the oracle, plus
activation memory and the CNN's norm layer, into the ``ReportResult`` that the tables and figures read
(``_compute_result.py``: the result, its tables, findings and JSON summary).
"""

from __future__ import annotations

import json
from typing import Any

from accumlib import ragged
from accumlib.batches import expected_steps
from accumlib.harness import trace_loop, verdict_text
from accumlib.loops import CONTRACTS, LOOPS
from accumlib_course.memory import activation_bytes

from ._compute_result import Cell, Findings, ReportResult
from .params import DEFAULTS, LR, PRECISIONS, check_parameters, cnn_task


def _loops(precision: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Every reference loop of the registry, in its contract's order; a loop judged at low precision
    (autocast) runs only when the report's precision asks for one, with that dtype."""
    loops: dict[str, tuple[Any, dict[str, Any]]] = {}
    dtype = PRECISIONS[precision]
    for name, loop in LOOPS.items():
        if not CONTRACTS[name].low_precision:
            loops[name] = (loop, {})
        elif dtype is not None:
            loops[f"{name} ({precision})"] = (loop, {"dtype": dtype})
    return loops


def run(
    task: str = DEFAULTS["task"],
    accum_steps: Any = DEFAULTS["accum_steps"],
    batch_size: int = DEFAULTS["batch_size"],
    norm: str = DEFAULTS["norm"],
    precision: str = DEFAULTS["precision"],
    device: Any = DEFAULTS["device"],
    seed: int = DEFAULTS["seed"],
    results_path: str = DEFAULTS["results_path"],
) -> ReportResult:
    """Every reference loop at every k on ``task``, judged step by step against the oracle.

    ``precision`` other than float32 adds ``accumlib.amp`` with that autocast dtype. The norm
    section runs ``accumlib.ragged`` on the CNN with ``norm`` at every k. ``results_path``
    (``""``: none) receives ``summary()`` as JSON. Every parameter is checked before any work.
    """
    p = check_parameters(task, accum_steps, batch_size, norm, precision, device, seed, results_path)
    t, dev = p.task, p.device
    cells = {}
    for k in p.ks:
        for name, (loop, kwargs) in _loops(p.precision).items():
            trace = trace_loop(
                loop, t, accum_steps=k, batch_size=p.batch_size, lr=LR, seed=p.seed, device=dev, **kwargs
            )
            # verify judged the run: an autocast loop against a replay in its own dtype, whose errors
            # (ref_error) its verdict read, the rest against the float32 large-batch gradient
            ref_errors = tuple(c.ref_error for c in trace.comparisons) if "dtype" in kwargs else ()
            cells[(name, k)] = Cell(
                name,
                k,
                tuple(c.rel_error for c in trace.comparisons),
                tuple(trace.window_batches),
                min(c.cosine for c in trace.comparisons),
                max(c.norm_ratio for c in trace.comparisons),
                expected_steps(trace.n_batches, k),
                sum(trace.window_items),
                trace.n_items,
                verdict_text(trace.verdict),
                tuple(trace.logged),
                ref_errors,
            )
    n_items, n_batches = trace.n_items, trace.n_batches

    model = t.make_model(p.seed).to(dev)
    first = next(iter(t.loader(p.batch_size)))
    memory = {}
    for k in p.ks:
        window = [first] * k  # activation memory depends on the batch's size, not its content
        memory[k] = (
            activation_bytes(model, first, t.item_losses, device=dev),
            activation_bytes(model, t.merge(window), t.item_losses, device=dev),
        )

    cnn = cnn_task(p.norm, p.seed)
    norm_errors = {
        k: max(
            c.rel_error
            for c in trace_loop(
                ragged, cnn, accum_steps=k, batch_size=p.batch_size, seed=p.seed, device=dev
            ).comparisons
        )
        for k in p.ks
    }
    result = ReportResult(
        t.name,
        t.description,
        p.ks,
        p.batch_size,
        p.norm,
        p.precision,
        str(dev),
        p.seed,
        n_items,
        n_batches,
        cells,
        memory,
        norm_errors,
    )
    if p.results_path:
        with open(p.results_path, "w") as f:
            json.dump(result.summary(), f, indent=1)
    return result


def results_note(results_path: str) -> str:
    """Where the machine-readable results went (the notebook's last line)."""
    return (
        f"Every number of this report, as JSON: {results_path}"
        if results_path
        else "results_path is '' (the default): no JSON file written; make report writes reports/report.json"
    )


# the result's classes live in _compute_result.py; figures and the package import them from here
__all__ = ["Cell", "Findings", "ReportResult", "results_note", "run"]
