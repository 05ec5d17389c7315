"""Notebook 8, "Distributed accumulation": ``compute(...) -> DistributedLesson``, ``plot(result) -> Figure``.

One spawned group of ``world_size`` ranks runs everything: the three communication
variants at every k in ``ks`` (counting only), and at ``accum_steps`` the reference
loop and the per-rank-count mistake, each checked against the oracle at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..tasks import get_task
from .experiment import COMM_VARIANTS, FLOAT32_RTOL, RunResult, RunSpec, run_specs, shard_loader

DEFAULT_KS = (1, 2, 4, 8)  # lm-tokens on 2 ranks: 8 micro-batches each, so k=8 is one step


@dataclass
class DistributedLesson:
    world_size: int
    task: str
    accum_steps: int
    ks: tuple[int, ...]
    comm: dict[str, dict[int, RunResult]]  # variant -> k -> counts per step
    reference: RunResult  # no_sync + global counts at accum_steps, checked against the oracle
    per_rank: RunResult  # no_sync + per-rank counts at accum_steps, checked against the oracle

    def bytes_per_step(self, variant: str) -> list[int]:
        """All-reduce payload of the first optimizer step (a full window of k micro-batches), per k."""
        return [self.comm[variant][k].bytes_per_step for k in self.ks]

    def calls_per_step(self, variant: str) -> list[int]:
        return [self.comm[variant][k].calls_per_step for k in self.ks]

    def table(self) -> str:
        head = f"{'k':>3}  " + "  ".join(f"{v:>26}" for v in COMM_VARIANTS)
        rows = [
            f"{k:>3}  " + "  ".join(f"{self.comm[v][k].calls_per_step:>4} calls {self.comm[v][k].bytes_per_step:>10,} B" for v in COMM_VARIANTS)
            for k in self.ks
        ]
        return "\n".join([f"all-reduce per optimizer step, world size {self.world_size}, task {self.task}", head, *rows])


def compute(
    world_size: int = 2, accum_steps: int = 4, ks: Sequence[int] = DEFAULT_KS, task: str = "lm-tokens", timeout: float = 300.0
) -> DistributedLesson:
    """Run the lesson's experiments in one spawned group; every number the notebook states comes from here."""
    per_rank = len(shard_loader(get_task(task), 0, world_size))  # micro-batches per rank: no window can be longer
    ks = tuple(k for k in sorted(set(ks)) if k <= per_rank)
    if not ks:
        raise ValueError(f"ks must hold a k <= {per_rank}, the micro-batches per rank at world_size={world_size} (got none)")
    specs = [RunSpec(v, task, k, oracle=False) for k in ks for v in COMM_VARIANTS]
    specs += [RunSpec("no_sync", task, accum_steps), RunSpec("per-rank counts", task, accum_steps)]
    results = run_specs(specs, world_size=world_size, timeout=timeout)
    comm: dict[str, dict[int, RunResult]] = {v: {} for v in COMM_VARIANTS}
    for r in results[: len(ks) * len(COMM_VARIANTS)]:
        comm[r.spec.variant][r.spec.accum_steps] = r
    return DistributedLesson(world_size, task, accum_steps, ks, comm, results[-2], results[-1])


def plot(result: DistributedLesson):
    """Left: all-reduce bytes per optimizer step against k. Right: error per step, global vs per-rank counts."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"no_sync": "o-", "every micro-batch": "s--", "no_sync on backward only": "x:"}
    for v in COMM_VARIANTS:
        left.plot(result.ks, [b / 1024 for b in result.bytes_per_step(v)], styles[v], label=v, markersize=7)
    left.set_xscale("log", base=2)
    left.set_xticks(result.ks, [str(k) for k in result.ks])
    left.set_xlabel("accumulation steps k")
    left.set_ylabel("all-reduce KiB per optimizer step (per rank)")
    left.set_title(f"Communication, measured by a DDP hook ({result.world_size} ranks)")
    left.legend()

    steps = range(1, len(result.reference.rel_errors) + 1)
    ref = [max(s) for s in result.reference.rel_errors]
    bad = [max(s) for s in result.per_rank.rel_errors]
    width = 0.38
    right.bar([s - width / 2 for s in steps], ref, width, label="global count (all-reduced)")
    right.bar([s + width / 2 for s in steps], bad, width, label="per-rank count (local mean)")
    right.axhline(FLOAT32_RTOL, color="k", ls="--", lw=1, label=f"float32 tolerance {FLOAT32_RTOL:.0e}")
    right.set_yscale("log")
    right.set_xticks(list(steps))
    right.set_xlabel(f"optimizer step (k={result.accum_steps})")
    right.set_ylabel("relative error vs large-batch gradient")
    right.set_title("Token normalization across ranks")
    right.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    return fig


def widget():
    """Pick k and the world size, press Run: spawns the ranks again and redraws (about 10 s or more)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    k = w.Dropdown(options=[1, 2, 3, 4, 8], value=4, description="k")
    ranks = w.Dropdown(options=[1, 2, 3], value=2, description="world size")
    run = w.Button(description="Run", button_style="primary")
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            result = compute(world_size=ranks.value, accum_steps=k.value)
            print(result.table())
            print(f"per-rank counts, worst relative error: {result.per_rank.max_rel_error:.1e}; "
                  f"global counts: {result.reference.max_rel_error:.1e}")
            fig = plot(result)
            plt.show(fig)

    run.on_click(redraw)
    box = w.VBox([w.HBox([k, ranks, run]), out])
    display(box)
    return box
