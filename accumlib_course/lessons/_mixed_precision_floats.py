"""Lesson 4's number formats: what autocast computes in, what float16 flushes to zero and how the
scale keeps it, and autocast's error against the oracle over one epoch.

A part of ``mixed_precision.py``, which re-exports every name here.
"""

from __future__ import annotations

import torch

from accumlib import amp, get_task, ragged, resolve_device
from accumlib.harness import trace_loop

from ._mixed_precision_inf import TASK, InfRun, inf_run, inf_table, plot_inf_run  # noqa: F401 (the notebook reads them here)


def autocast_dtype(device: str | torch.device = "auto") -> torch.dtype:
    """What ``accumlib.amp`` computes in: float16 on CUDA, bfloat16 elsewhere."""
    return torch.float16 if resolve_device(device).type == "cuda" else torch.bfloat16


def underflow(value: float = 1e-8, scale: float = 2.0**16) -> dict[str, float]:
    """A small gradient value stored in float16, in bfloat16, and in float16 after scaling by ``scale``.

    float16 flushes values below ~6e-8 to zero; bfloat16 keeps float32's exponent range;
    the scaler multiplies the loss (hence every gradient) by ``scale`` so float16 keeps them.
    """
    x = torch.tensor(value, dtype=torch.float32)
    return {
        "float16 smallest subnormal": float(torch.finfo(torch.float16).smallest_normal) * 2.0**-10,
        "float32": float(x),
        "float16": float(x.half()),
        "bfloat16": float(x.bfloat16()),
        "float16, scaled then unscaled": float((x * scale).half().float() / scale),
    }


def amp_vs_oracle(device: str | torch.device = "auto", task: str = TASK) -> dict[str, float]:
    """Worst relative error against the oracle over one epoch, per loop: exact float32 vs autocast."""
    dev = resolve_device(device)
    t = get_task(task)
    worst = lambda tr: max(c.rel_error for c in tr.comparisons)  # noqa: E731
    return {
        "ragged (float32)": worst(trace_loop(ragged, t, device=dev)),
        "amp, autocast off (float32 + scaler)": worst(trace_loop(amp, t, device=dev, enabled=False)),
        f"amp ({str(autocast_dtype(dev)).removeprefix('torch.')} autocast)": worst(
            trace_loop(amp, t, device=dev)
        ),
    }
