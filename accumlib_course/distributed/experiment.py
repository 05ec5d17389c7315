"""The distributed comparisons behind ``python -m accumlib_course.distributed``, notebook 8 and the tests.

One spawned run (or one torchrun job) trains a fresh model per ``RunSpec`` with
``ddp_accumulate`` and, at every optimizer step on every rank, records:

- the relative error of the rank's gradient against the oracle: ``true_gradient`` in
  float64 over the UNION of every rank's window (gathered from all ranks), at the
  parameters the window started from;
- the all-reduce calls and bytes the counting communication hook saw in that step;
- after the step, the largest difference between any rank's parameters and rank 0's.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumlib.batches import Recording, to_device
from accumlib.checks import check_choice, check_int
from accumlib.compare import compare
from accumlib.distributed import ddp_accumulate, launch, shard_loader
from accumlib.oracle import grads_of, true_gradient
from accumlib.tasks import Task, get_task

from .comm import count_allreduce

# What each variant passes to ddp_accumulate: the reference, then the three public mistakes.
VARIANTS = {
    "no_sync": dict(no_sync="forward+backward", global_counts=True),
    "every micro-batch": dict(no_sync="never", global_counts=True),
    "no_sync on backward only": dict(no_sync="backward", global_counts=True),
    "per-rank counts": dict(no_sync="forward+backward", global_counts=False),
}
COMM_VARIANTS = ("no_sync", "every micro-batch", "no_sync on backward only")

# float32 against a float64 oracle: each rank sums its items' gradients in float32, the
# all-reduce adds R partial sums (~1e-7 measured); the one tolerance, with its reason, is
# accumlib.tolerances.FLOAT32_RTOL, 100x below the per-rank-count error (> 1e-2).
from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402

# The per-rank-count mistake must sit far above rounding: 10x FLOAT32_RTOL. On lm-tokens
# (4 to 40 tokens per sequence) we measure 1e-2 to 1e-1 depending on k.
PER_RANK_MIN_ERROR = 10 * FLOAT32_RTOL


@dataclass(frozen=True)
class RunSpec:
    """One training epoch to run on every rank."""

    variant: str = "no_sync"
    task: str = "lm-tokens"
    accum_steps: int = 4
    batch_size: int | None = None
    lr: float = 0.05
    seed: int = 0
    oracle: bool = True  # False: count communication only (no per-step oracle; rel_errors stay empty)

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, tuple(VARIANTS))
        get_task(self.task)
        check_int("accum_steps", self.accum_steps, low=1)
        check_int("batch_size", self.batch_size, low=1, optional=True)


@dataclass
class RunResult:
    """Per optimizer step; ``rel_errors[step][rank]`` is rank's gradient against the oracle.

    ``rel_to_rank_means`` compares it instead with the MEAN over ranks of each rank's own
    window gradient: what the per-rank-count mistake computes (so ~0 for that variant).
    """

    spec: RunSpec
    world_size: int
    rel_errors: list[list[float]] = field(default_factory=list)
    rel_to_rank_means: list[list[float]] = field(default_factory=list)
    param_spread: list[float] = field(default_factory=list)
    calls: list[list[int]] = field(default_factory=list)
    bytes: list[list[int]] = field(default_factory=list)
    window_batches: list[int] = field(default_factory=list)
    window_items: list[list[int]] = field(default_factory=list)
    logged: list[float] = field(default_factory=list)
    oracle_loss: list[float] = field(default_factory=list)

    @property
    def max_rel_error(self) -> float:
        return max((max(step) for step in self.rel_errors), default=math.nan)

    @property
    def calls_per_step(self) -> int:
        """All-reduce calls of the first step (a full window unless the epoch is one short window)."""
        return self.calls[0][0]

    @property
    def bytes_per_step(self) -> int:
        return self.bytes[0][0]

    @classmethod
    def from_dict(cls, d: dict) -> RunResult:
        d = dict(d)
        d["spec"] = RunSpec(**d["spec"])
        return cls(**d)


def _against_oracle(
    model: torch.nn.Module, window: list, task: Task, device: torch.device
) -> tuple[float, float, float]:
    """This rank's ``.grad`` against the oracle over every rank's window, and against the mean of rank
    means."""
    world = dist.get_world_size()
    union: list[list] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(union, window)  # every rank's window: the large batch of this step
    batches = [b for w in union for b in w]
    oracle = true_gradient(
        model, batches, task.item_losses, merge=task.merge, dtype=torch.float64, device=device
    )
    own = true_gradient(model, window, task.item_losses, merge=task.merge, dtype=torch.float64, device=device)
    flat = torch.cat([g.reshape(-1) for g in own.values()])
    dist.all_reduce(flat)  # (1/R) sum_r grad of rank r's own window mean: what per-rank counts compute
    rank_means = {
        k: v.view_as(own[k]) for k, v in zip(own, (flat / world).split([g.numel() for g in own.values()]))
    }
    with torch.no_grad():
        loss = torch.cat([task.item_losses(model, to_device(b, device)) for b in batches]).double().mean()
    grads = grads_of(model)
    return compare(grads, oracle).rel_error, compare(grads, rank_means).rel_error, float(loss)


def run_one(spec: RunSpec, device: torch.device | None = None, datasets: dict | None = None) -> RunResult:
    """Train one epoch of ``spec`` on this rank (inside a process group); return what rank 0 gathered.

    ``datasets`` caches each task's dataset across runs (building token sequences is the slow part).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = device or torch.device("cpu")
    task = get_task(spec.task)
    torch.manual_seed(spec.seed)
    model = task.make_model(spec.seed).to(device)
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)  # broadcasts rank 0's parameters
    counter = count_allreduce(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=spec.lr)
    datasets = {} if datasets is None else datasets
    if spec.task not in datasets:
        datasets[spec.task] = task.make_dataset()
    loader = Recording(shard_loader(task, rank, world, spec.batch_size, datasets[spec.task]))
    mine: dict[str, list] = {
        "rel": [],
        "rel_means": [],
        "calls": [],
        "bytes": [],
        "batches": [],
        "items": [],
        "spread": [],
        "loss": [],
    }

    def before_step(opt, args, kwargs):
        window = loader.take()
        calls, nbytes = counter.take()
        mine["calls"].append(calls)
        mine["bytes"].append(nbytes)
        mine["batches"].append(len(window))
        mine["items"].append(sum(task.count_items(b) for b in window))
        if spec.oracle:
            rel, rel_means, loss = _against_oracle(model, window, task, device)
            mine["rel"].append(rel)
            mine["rel_means"].append(rel_means)
            mine["loss"].append(loss)

    def after_step(opt, args, kwargs):
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        mine["spread"].append(max(float((p - every[0]).abs().max()) for p in every))

    pre = optimizer.register_step_pre_hook(before_step)
    post = optimizer.register_step_post_hook(after_step)
    try:
        logged = ddp_accumulate(
            ddp,
            optimizer,
            loader,
            task.item_losses,
            accum_steps=spec.accum_steps,
            device=device,
            count_items=task.count_items,
            **VARIANTS[spec.variant],
        )
    finally:
        pre.remove()
        post.remove()
    gathered: list[dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    steps, checked = range(len(mine["calls"])), range(len(mine["rel"]))
    return RunResult(
        spec=spec,
        world_size=world,
        rel_errors=[[g["rel"][s] for g in gathered] for s in checked],
        rel_to_rank_means=[[g["rel_means"][s] for g in gathered] for s in checked],
        param_spread=mine["spread"],
        calls=[[g["calls"][s] for g in gathered] for s in steps],
        bytes=[[g["bytes"][s] for g in gathered] for s in steps],
        window_batches=mine["batches"],
        window_items=[[g["items"][s] for g in gathered] for s in steps],
        logged=logged,
        oracle_loss=mine["loss"],
    )


def worker(rank: int, world_size: int, specs: Sequence[dict], out: str | None = None) -> list[RunResult]:
    """Spawn/torchrun target: run every spec in order; rank 0 writes the results to ``out`` as JSON."""
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    datasets: dict = {}  # read-only after construction, so runs may share it
    results = [run_one(RunSpec(**s), device, datasets) for s in specs]
    if rank == 0 and out is not None:
        with open(out, "w") as f:
            json.dump([asdict(r) for r in results], f)
    return results


def run_specs(
    specs: Sequence[RunSpec], *, world_size: int = 2, timeout: float = 120.0, port: int | None = None
) -> list[RunResult]:
    """Run ``specs`` in ONE spawned group of ``world_size`` processes on loopback; return rank 0's records."""
    world_size = check_int("world_size", world_size, low=1)
    with tempfile.TemporaryDirectory(prefix="accumlib-ddp-") as tmp:
        out = os.path.join(tmp, "results.json")
        launch(worker, ([asdict(s) for s in specs], out), world_size=world_size, timeout=timeout, port=port)
        with open(out) as f:
            return [RunResult.from_dict(d) for d in json.load(f)]


@dataclass
class DDPReport:
    """The figures ``python -m accumlib_course.distributed`` prints: one result per variant at one
    ``accum_steps``."""

    world_size: int
    accum_steps: int
    task: str
    results: dict[str, RunResult]

    @property
    def ok(self) -> bool:
        ref = self.results["no_sync"]
        exact = all(self.results[v].max_rel_error <= FLOAT32_RTOL for v in COMM_VARIANTS)
        in_step = all(max(r.param_spread) == 0.0 for r in self.results.values())
        k_rounds = all(
            c[0] == m * ref_c[0]
            for c, m, ref_c in zip(self.results["every micro-batch"].calls, ref.window_batches, ref.calls)
        )
        wrong = self.world_size == 1 or self.results["per-rank counts"].max_rel_error > PER_RANK_MIN_ERROR
        return exact and in_step and k_rounds and wrong

    def summary(self) -> dict:
        r = self.results
        return {
            "world_size": self.world_size,
            "accum_steps": self.accum_steps,
            "task": self.task,
            "rel_error_vs_large_batch": r["no_sync"].max_rel_error,
            "max_param_spread_across_ranks": max(max(x.param_spread) for x in r.values()),
            "allreduce_per_step": {
                v: {"calls": r[v].calls_per_step, "bytes": r[v].bytes_per_step} for v in COMM_VARIANTS
            },
            "per_rank_counts_rel_error": r["per-rank counts"].max_rel_error,
            "tolerance": FLOAT32_RTOL,
            "ok": self.ok,
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), indent=2)

    def __str__(self) -> str:
        s = self.summary()
        ref = self.results["no_sync"]
        same = "yes" if s["max_param_spread_across_ranks"] == 0 else "NO"
        lines = [
            f"DDP accumulation: task {self.task}, world size {self.world_size}, "
            f"accum_steps {self.accum_steps}, {len(ref.window_batches)} optimizer steps",
            f"  relative error vs large batch (max over steps and ranks)  {s['rel_error_vs_large_batch']:.1e}"
            f"  (tolerance {FLOAT32_RTOL:.0e})",
            f"  parameters identical on every rank after every step      {same}",
            "  all-reduce per optimizer step (first window), from the DDP comm hook:",
        ]
        for v in COMM_VARIANTS:
            c = s["allreduce_per_step"][v]
            lines.append(f"    {v:<26} {c['calls']:>3} calls  {c['bytes']:>9,} bytes")
        lines.append(
            "    (plus, in every variant, one all-reduce of the window's item count: 1 int64, 8 bytes)"
        )
        per_rank = s["per_rank_counts_rel_error"]
        lines.append(f"  per-rank counts (local mean, then DDP's average) rel error  {per_rank:.1e}")
        lines.append(f"verdict: {'ok' if s['ok'] else 'FAILED'}")
        return "\n".join(lines)


def ddp_experiment(
    *,
    world_size: int = 2,
    accum_steps: int = 4,
    task: str = "lm-tokens",
    timeout: float = 120.0,
    port: int | None = None,
) -> DDPReport:
    """Every variant at one ``accum_steps``, in one spawned run (or in the current group under torchrun).

    >>> report = ddp_experiment(world_size=2, accum_steps=4)  # doctest: +SKIP
    >>> report.ok                                               # doctest: +SKIP
    True
    """
    specs = [RunSpec(v, task, accum_steps) for v in VARIANTS]
    if dist.is_initialized():  # under torchrun: run in this process group, every rank gets the report
        results = worker(dist.get_rank(), dist.get_world_size(), [asdict(s) for s in specs])
        world_size = dist.get_world_size()
    else:
        results = run_specs(specs, world_size=world_size, timeout=timeout, port=port)
    return DDPReport(world_size, accum_steps, task, {r.spec.variant: r for r in results})
