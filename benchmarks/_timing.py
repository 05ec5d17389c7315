"""Timing shared by the sections: interleaved runs, pair ratios and their quartiles, and what the machine
was doing meanwhile (its description, the cores other processes kept busy).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(
    prepare: dict[str, Callable[[], Callable[[], Any]]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per run of each candidate, interleaved A B, B A, A B, ... so drift hits every candidate alike.

    The order flips every round: on a busy machine the first of a pair is measurably
    favoured (an accumlib loop against itself read 0.91 in a fixed order). ``prepare[name]()``
    builds fresh state (a model copy, an optimizer) outside the timing and returns the
    zero-argument call that is timed.
    """
    times: dict[str, list[float]] = {name: [] for name in prepare}
    names = list(prepare)
    for r in range(warmup + repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            run = prepare[name]()
            _sync()
            t0 = time.perf_counter()
            run()
            _sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def pair_ratios(a: list[float], b: list[float]) -> float:
    """Median over repeats of a_i / b_i: each pair ran back to back, so load drift cancels in the ratio."""
    return statistics.median(x / y for x, y in zip(a, b))


def ratio_quartiles(a: list[float], b: list[float]) -> list[float]:
    """First and third quartile of the pair ratios: how far one repeat strays, so a reader can judge the
    median."""
    r = [x / y for x, y in zip(a, b)]
    if len(r) < 2:
        return [r[0], r[0]]
    q = statistics.quantiles(r, n=4)
    return [q[0], q[2]]


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def machine(threads: int) -> dict:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")
            ),
            cpu,
        )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "accumlib", "notebooks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
        commit += " + uncommitted changes in accumlib/ or notebooks/" if dirty.strip() else ""
    except OSError:
        commit = ""
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "commit": commit,
        "load_average_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def cpu_now() -> tuple[float, float, float] | None:
    """(wall s, CPU-seconds the whole machine was busy, CPU-seconds of this process and its finished
    children)."""
    try:
        with open("/proc/stat") as f:
            # user nice system idle iowait irq softirq steal
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    t = os.times()
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), busy, t.user + t.system + t.children_user + t.children_system


def other_cores(a: tuple | None, b: tuple | None) -> float | None:
    """Cores kept busy by OTHER processes between two ``cpu_now`` snapshots: the contamination of a timing."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0])


# other processes using a fifth of a core on average already move ratios by more than the 3% goal
BUSY_CORES = 0.2


def devices() -> list[str]:
    """Where the timed sections run: the CPU, and CUDA when present (untested here: no GPU in CI)."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
