"""Lesson 10, part: what accumulation costs at real size, measured on this machine for the lesson's GPT.

The identity is the same for every k; only the cost of computing it changes. Per window of 32 sentences
cut into k micro-batches b_j, with N the window's tokens:

    grad (1/N) sum_{i in window} l_i  =  sum_j grad (sum_{i in b_j} l_i) / N

``accumulation_cost`` measures three prices:

1. One process, the cost of k. A window cut as (32/k) x k runs k forwards and backwards, then one clip
   and one AdamW step; timed as the best of ``repeats`` windows after a warm-up. Each backward frees
   its micro-batch's graph, so the window's activation peak is one micro-batch's: what autograd saves
   for backward (``accumlib_course.memory.activation_bytes``, exact on any device), about 1/k of the large
   batch's. The gradient is one full copy of the parameters whatever k: accumulation trades activation
   memory for per-micro-batch overhead (k smaller matrix products, k passes through Python).
2. Two gloo ranks, the cost of ``no_sync``. DDP over the GPT, k = 4 micro-batches of 8 sentences per
   rank per window: ``no_sync()`` around the first k - 1 forward+backward passes against an all-reduce
   after every micro-batch, all-reduce calls and bytes counted by a DDP communication hook. ``no_sync``
   saves k - 1 rounds of all-reduce by holding the gradient unreduced until the last micro-batch; under
   DDP that costs nothing, since every rank holds a full gradient (and DDP's full-size buckets) anyway.
3. FSDP's price, computed. Under FSDP2 with ``set_requires_gradient_sync(False)`` (FSDP's ``no_sync``
   likewise) each rank holds the whole unsharded gradient until the window's last backward: parameter
   bytes per rank, against 1/R of them when gradients are reduce-scattered after every micro-batch.

Timings depend on the machine and its load; the memory figures and the all-reduce counts do not.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from accumlib.checks import check_choice, check_float, check_int, check_ints
from accumlib.data import IGNORE_INDEX, TextLines
from accumlib.text import Table
from accumlib_course.memory import activation_bytes

from .. import _style
from ._your_own_project_gpt import PRESETS, WINDOW, adamw, gpt_for, micro_batches, token_loss_sum

RANK_K = 4  # micro-batches per rank per window in the two-rank measurement
RANK_MICRO = WINDOW // RANK_K  # 8 sentences each: every rank holds a window of 32
SYNCS = ("no_sync", "every micro-batch")
FLOAT_BYTES = 4  # float32 parameters and gradients
MIB = 2**20
THREADS = 1  # torch threads of the one-process measurement, as in each rank (the launcher sets one)


@dataclass(frozen=True)
class KCost:
    """One cut of the window: k micro-batches of ``micro_batch`` sentences."""

    k: int
    micro_batch: int
    seconds: float  # best optimizer step: k forward+backward passes, clip, AdamW step
    activation_bytes: int  # the window's peak: its largest micro-batch's saved activations
    positions: int  # token positions computed, padding included (each micro-batch pads to its longest)

    @property
    def seconds_per_sentence(self) -> float:
        return self.seconds / WINDOW


@dataclass(frozen=True)
class SyncCost:
    """One DDP variant on every rank: its best window (slowest rank) and its all-reduces per window."""

    variant: str
    seconds: float
    calls: int  # all-reduce calls per window on one rank, one per bucket per synchronised backward
    bytes: int  # their payload per window on one rank


@dataclass(frozen=True)
class CostResult:
    """Every figure of ``accumulation_cost``: the cost of k, of ``no_sync`` on R ranks, and FSDP's."""

    preset_name: str
    n_parameters: int
    threads: int  # torch threads of the one-process measurement
    costs: tuple[KCost, ...]
    large_activation_bytes: int  # 32 x 1, whether or not k = 1 is in ks
    world_size: int
    syncs: tuple[SyncCost, ...]
    ranks: tuple[tuple[int, int], ...]  # (rank, process id) as each rank reported it

    @property
    def parameter_bytes(self) -> int:
        """One full float32 gradient: what every k holds between backward and step."""
        return self.n_parameters * FLOAT_BYTES

    @property
    def fsdp_unsharded_bytes(self) -> int:
        """Per rank under FSDP2 with gradient sync off until the last micro-batch: the whole gradient."""
        return self.parameter_bytes

    @property
    def fsdp_sharded_bytes(self) -> float:
        """Per rank when every micro-batch reduce-scatters: 1/R of it (FSDP2 pads each parameter's dim 0
        to a multiple of R, a few rows more)."""
        return self.parameter_bytes / self.world_size

    def sync(self, variant: str) -> SyncCost:
        return next(s for s in self.syncs if s.variant == variant)

    def table_k(self) -> Table:
        rows = [
            (
                f"{c.micro_batch} x {c.k}",
                f"{c.seconds * 1e3:.1f}",
                f"{c.seconds_per_sentence * 1e3:.2f}",
                f"{c.activation_bytes / MIB:.2f}",
                f"{c.activation_bytes / self.large_activation_bytes:.3f}",
                c.positions,
            )
            for c in self.costs
        ]
        head = (
            "micro-batch x k",
            "ms per step",
            "ms per sentence",
            "activations, peak (MiB)",
            "x large batch",
        )
        return Table(
            (*head, "positions computed"),
            rows,
            caption=(
                f"{self.preset_name} GPT ({self.n_parameters:,} parameters), windows of {WINDOW} sentences, "
                f"one process, torch threads: {self.threads}; large batch's activations "
                f"{self.large_activation_bytes / MIB:.2f} MiB; gradient {self.parameter_bytes / MIB:.2f} MiB "
                "for every k"
            ),
        )

    def table_ranks(self) -> Table:
        p, r = self.parameter_bytes / MIB, self.world_size
        rows = [
            (f"DDP, {s.variant}", f"{s.seconds * 1e3:.1f}", s.calls, f"{s.bytes / MIB:.3f}", f"{p:.3f}")
            for s in self.syncs
        ]
        rows += [
            ("FSDP2, reduce-scatter every micro-batch (computed)", "-", "-", "-", f"{p / r:.3f}"),
            ("FSDP2, gradient sync off until the last (computed)", "-", "-", "-", f"{p:.3f}"),
        ]
        return Table(
            ("run", "ms per window", "all-reduce calls", "MiB sent", "gradient held per rank (MiB)"),
            rows,
            caption=(
                f"{r} gloo ranks on this machine, one thread each, {RANK_K} micro-batches of {RANK_MICRO} "
                f"sentences per rank per window; counts per window and rank"
            ),
        )


def _cut(lines: TextLines, first: int, size: int, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sentences first..first+size-1 as k micro-batches, collated before any timing (data loading is not
    the cost measured here)."""
    return micro_batches(lines, list(range(first, first + size)), size // k)


def _k_cost(preset_name: str, lines: TextLines, k: int, repeats: int, seed: int) -> KCost:
    """The window's activation peak at k, and the best of ``repeats`` optimizer steps after one warm-up
    window (the allocator, AdamW's state)."""
    model = gpt_for(PRESETS[preset_name], seed)
    optimizer = adamw(model, 1e-3)
    first = _cut(lines, 0, WINDOW, k)
    # the peak of a window is its largest micro-batch's activations: each backward frees its graph
    peak = max(activation_bytes(model, b, token_loss_sum) for b in first)
    best = float("inf")
    for w in range(repeats + 1):
        micro = _cut(lines, w * WINDOW, WINDOW, k)
        n_tokens = sum(int((t != IGNORE_INDEX).sum()) for _, t in micro)  # N: known before any backward
        start = time.perf_counter()
        for batch in micro:
            (token_loss_sum(model, batch) / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if w:  # window 0 warms up
            best = min(best, time.perf_counter() - start)
    return KCost(k, WINDOW // k, best, peak, sum(x.numel() for x, _ in first))


def _rank_worker(rank: int, world_size: int, preset_name: str, repeats: int, seed: int, out: str) -> None:
    """Launch target: both DDP variants on this rank, windows interleaved so that both see the same load;
    writes this rank's record to ``out/rank<r>.json``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumlib_course.distributed.comm import count_allreduce

    per_window = WINDOW * world_size
    lines = TextLines(per_window * (repeats + 1), seed)
    models = {v: DDP(gpt_for(PRESETS[preset_name], seed)) for v in SYNCS}
    counters = {v: count_allreduce(m) for v, m in models.items()}
    optimizers = {v: adamw(m, 1e-3) for v, m in models.items()}
    record: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "seconds": {}, "calls": {}, "bytes": {}}
    for w in range(repeats + 1):
        micro = _cut(lines, w * per_window + rank * WINDOW, WINDOW, RANK_K)
        n = torch.tensor(sum(int((t != IGNORE_INDEX).sum()) for _, t in micro))
        dist.all_reduce(n)  # N over every rank's window, before any backward (8 bytes, not a DDP bucket)
        for v in SYNCS:
            model, optimizer = models[v], optimizers[v]
            dist.barrier()  # both ranks start the window together
            start = time.perf_counter()
            for j, batch in enumerate(micro):
                defer = v == "no_sync" and j < RANK_K - 1
                # forward and backward inside no_sync: DDP arms its all-reduce during the forward
                with model.no_sync() if defer else contextlib.nullcontext():
                    # DDP averages over the R ranks, so R / N makes every token weigh 1 / N
                    (token_loss_sum(model, batch) * world_size / int(n)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            calls, nbytes = counters[v].take()
            if w:  # window 0 warms up, and DDP rebuilds its buckets after its first backward
                for key, value in (("seconds", seconds), ("calls", calls), ("bytes", nbytes)):
                    record[key].setdefault(v, []).append(value)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def _run_ranks(preset_name: str, world_size: int, repeats: int, seed: int, timeout: float) -> list[dict]:
    from accumlib.distributed.launch import launch

    with tempfile.TemporaryDirectory(prefix="accumlib-cost-") as out:
        try:
            launch(_rank_worker, (preset_name, repeats, seed, out), world_size=world_size, timeout=timeout)
        except Exception as err:  # the launcher's TimeoutError or a rank's traceback, with this run named
            raise RuntimeError(
                f"the {world_size}-rank no_sync measurement ({preset_name} GPT, timeout={timeout} s) failed: "
                f"{type(err).__name__}: {err}"
            ) from err
        paths = [Path(out, f"rank{rank}.json") for rank in range(world_size)]
        if missing := [p.name for p in paths if not p.exists()]:
            raise RuntimeError(f"the no_sync measurement's ranks finished without their records: {missing}")
        return [json.loads(p.read_text()) for p in paths]


def accumulation_cost(
    preset: str = "tiny",
    *,
    ks: Any = (1, 2, 4, 8),
    world_size: int = 2,
    repeats: int = 3,
    seed: int = 0,
    timeout: float = 120.0,
) -> CostResult:
    """Measure, on this machine, the cost of k in one process, of ``no_sync`` on ``world_size`` gloo ranks,
    and compute FSDP's gradient memory; every argument is checked before any work starts.

    >>> accumulation_cost(ks=(1, 3))
    Traceback (most recent call last):
    ...
    ValueError: ks must hold divisors of 32; k equal micro-batches cut each window (got (1, 3))
    >>> accumulation_cost(world_size=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: world_size must be an integer between 2 and ...; two ranks at least, ... (got 1)
    """
    from accumlib.distributed.launch import max_world_size

    preset = check_choice("preset", preset, sorted(PRESETS))
    ks = check_ints("ks", ks, low=1, high=WINDOW, why=f"micro-batches of a window of {WINDOW} sentences")
    if any(WINDOW % k for k in ks):
        raise ValueError(
            f"ks must hold divisors of {WINDOW}; k equal micro-batches cut each window (got {ks})"
        )
    world_size = check_int(
        "world_size",
        world_size,
        low=2,
        high=max_world_size(),
        why="two ranks at least, at most what this machine holds (8 per core, 512 MiB each)",
    )
    repeats = check_int("repeats", repeats, low=1, high=20)
    seed = check_int("seed", seed, low=0)
    timeout = check_float("timeout", timeout, low=0, low_open=True)

    lines = TextLines(WINDOW * (repeats + 1), seed)
    before = torch.get_num_threads()
    # one thread, as each rank runs: with torch's default (one per core) this shared 2-core machine's
    # threads waited on each other, 40x slower (1 s a tiny step against 23 ms)
    torch.set_num_threads(THREADS)
    try:
        costs = tuple(_k_cost(preset, lines, k, repeats, seed) for k in ks)
    finally:
        torch.set_num_threads(before)
    model = gpt_for(PRESETS[preset], seed)
    large = activation_bytes(model, _cut(lines, 0, WINDOW, 1)[0], token_loss_sum)
    records = _run_ranks(preset, world_size, repeats, seed, timeout)
    syncs = tuple(
        SyncCost(
            v,
            # a window ends when its slowest rank does: the max over ranks, then the best window
            min(max(r["seconds"][v][w] for r in records) for w in range(repeats)),
            _same(records, v, "calls"),
            _same(records, v, "bytes"),
        )
        for v in SYNCS
    )
    n_parameters = sum(p.numel() for p in model.parameters())
    ranks = tuple((r["rank"], r["pid"]) for r in records)
    return CostResult(preset, n_parameters, THREADS, costs, large, world_size, syncs, ranks)


def _same(records: list[dict], variant: str, key: str) -> int:
    """The count every rank saw in every window; DDP's buckets are fixed after its first backward."""
    seen = {c for r in records for c in r[key][variant]}
    if len(seen) != 1:
        raise RuntimeError(f"{variant}: all-reduce {key} per window differ between windows or ranks ({seen})")
    return seen.pop()


@_style.styled
def plot_cost(result: CostResult) -> Figure:
    """Left: time per sentence against k. Right: the peak activation memory against k, beside the gradient
    (the same for every k)."""
    fig, (ax, bx) = _style.figure(
        2,
        width=10.0,
        height=5.5,
        title=(
            f"The cost of k on this machine: {result.preset_name} GPT ({result.n_parameters:,} parameters), "
            f"windows of {WINDOW} sentences"
        ),
    )
    ks = [c.k for c in result.costs]
    ax.plot(ks, [c.seconds_per_sentence * 1e3 for c in result.costs], **_style.ROLE["correct"])
    bx.plot(
        ks,
        [c.activation_bytes / MIB for c in result.costs],
        label="activations saved for backward (peak)",
        **_style.ROLE["correct"],
    )
    bx.axhline(
        result.parameter_bytes / MIB, label="gradient (every k)", **{**_style.ROLE["oracle"], "marker": ""}
    )
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks(ks, [str(k) for k in ks])  # the k measured, nothing between
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlabel("k (micro-batches per window)")
        axis.set_ylim(bottom=0)
    ax.set_ylabel("ms per sentence (best step, 1 thread)")
    ax.set_title("Time")
    bx.set_ylabel("MiB")
    bx.set_title("Memory")
    fig.legend(*bx.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    fig.get_layout_engine().set(h_pad=0.1)  # the default pad lets the legend's frame touch the x labels
    return fig


def cost_alt_text(result: CostResult) -> str:
    """The figure's alt text, built from its numbers."""
    per_k = "; ".join(
        f"k = {c.k}: {c.seconds_per_sentence * 1e3:.2f} ms per sentence, {c.activation_bytes / MIB:.2f} MiB"
        for c in result.costs
    )
    return (
        f"Two panels against k for the {result.preset_name} GPT, windows of {WINDOW} sentences. Left, time "
        f"per sentence; right, peak activation memory beside the gradient, "
        f"{result.parameter_bytes / MIB:.2f} MiB for every k. {per_k}."
    )


__all__ = ["CostResult", "KCost", "SyncCost", "accumulation_cost", "cost_alt_text", "plot_cost"]
