"""What the record stage hands forward: a few floats per micro-batch and per optimizer step.

``StepNumbers`` is everything the diagnose stage reads (a pure function of it); nothing here is
parameter-sized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .window_oracle import Fit


@dataclass
class Clip:
    seen: int  # micro-batches in the window when clipping ran
    max_norm: float
    total_norm: float
    site: str | None = None  # file:line of the user's clip call (``sites.py``)
    params: frozenset[int] = frozenset()  # ids of the parameters it clipped together


@dataclass
class MicroBatch:
    batch: Any
    indices: list[int] | None
    rows: int
    epoch_end: bool = False
    position: int = 0  # 1-based place in its pass over the data
    pass_id: int = 0


@dataclass
class StepNumbers:
    """Everything the diagnosis and the report need about one optimizer step: numbers only."""

    micro_batches: int
    lr: float
    lrs: list[tuple[float, ...]] = field(default_factory=list)  # per micro-batch, of the stepping optimizer
    lr_changed: bool = False  # a scheduler changed the rate inside the window
    frozen_changed: bool = False  # a parameter was frozen or unfrozen between micro-batches of the window
    epoch_end: bool = False  # the window's last micro-batch ended a pass over the data
    pass_length: int = 0  # micro-batches in that pass (its legitimate tail holds pass_length % k)
    clips: list[Clip] = field(default_factory=list)
    # file:line of each function hooked on a parameter's gradient (Tensor.register_hook) at the step
    grad_hooks: list[str] = field(default_factory=list)
    # file:line in the user's code of the window's calls: "step", "backward" (its last), "scheduler"
    sites: dict[str, str] = field(default_factory=dict)
    optimizer: str = ""  # which optimizer stepped, where several did (the in-place engine's)
    # the one factor .grad was multiplied by between the window's last backward and the step, clips and
    # GradScaler's unscale_ included (1.0: untouched; nan: not one factor, or not measured)
    rescaled: float = 1.0
    # GradScaler's scale at each backward of the window (1.0 without one): unequal, the micro-batches weigh
    # their scale over the one unscale_ divided the sum by
    scales: list[float] = field(default_factory=list)
    untracked: int = 0  # forwards on data that came from no loader verify knows
    # the items are the run's own loss calls' (judged in place; in verify, checked against item_losses'
    # once): a whole-number c is then a divisor of the script's own, never item_losses' other reduction
    own_items: bool = False
    skipped: bool = False
    finite: bool = True
    items: int = 0
    sequences: int = 0
    loss_sum: float = 0.0
    fits: list[Fit] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    leak: bool = False
    leak_coef: float = 0.0
    precision: str = "float32"  # the replay the verdict used: float32, or the loop's autocast dtype
    unclip: float = 1.0  # product of the recorded complete-window clip coefficients
    rel: float = math.nan  # ||G / unclip - r|| / ||r||, r the verdict's reference
    factor: float = math.nan  # c fitted in G / unclip ~= c r
    factor_resid: float = math.nan
    gg: float = 0.0  # |G|^2, G as the optimizer saw it
    gt: float = 0.0  # G . t, t the float32 truth the user reads (merged window under BatchNorm)
    tt: float = 0.0  # |t|^2
    batchnorm: bool = False
    bn_gap: float | None = None  # ||accumulated - merged|| / ||merged||: BatchNorm's own error
    rel_merged: float = math.nan  # ||G / unclip - merged|| / ||merged||: a loop that merges its window
    # a multi-rank job (``accumlib._verify.ranks``): items, loss sum and the reference above are the job's,
    # over every rank's window; these say how the ranks relate
    ranks: int = 1
    rank_items: list[int] = field(default_factory=list)  # each rank's window item count N_r
    diverged: float = 0.0  # max over ranks ||G_r - G_0|| / ||G_0||: the ranks applied different gradients
    # max over ranks ||p_r - p_0|| / ||p_0|| at the step: they hold different parameters
    params_diverged: float = 0.0
    syncs: int = 0  # micro-batch boundaries at which .grad was the same on every rank (a gradient sync)
    # c in G ~= c H, H = (1/R) sum_r O_r / N_r: each rank divided by its own count
    per_rank_factor: float = math.nan
    per_rank_resid: float = math.nan  # ||G - c H|| / ||G||
    # every rank stepped here (False: some had ended its run; judged on this rank alone)
    all_ranks: bool = True


@dataclass(frozen=True)
class Coverage:
    """What the run's data came to at its end, counted at the last parameters: the items no step used,
    and how the loop's loader drew (a job's: over every rank; ``left_out``, ``duplicates``: one process)."""

    missing: (
        int  # items in no stepped window: never drawn in a pass trained on, or forwarded after the last step
    )
    total: int | None  # items in all (None: an IterableDataset in a job, no length to say)
    seen_items: int = 0  # forwarded after the last step: the loop saw them, no step used them
    seen_loss: float = 0.0  # their loss sum, for the true mean item loss of the epoch
    left_out: tuple[
        int, ...
    ] = ()  # per complete pass: dataset items its loader left out by design (drop_last, sampler)
    held: int = 0  # items a pass holds
    left_out_by: str = ""  # what left them out
    duplicates: int = 0  # draws that repeated an item already drawn in the same pass
    mid_pass: int = 0  # an iteration-based run ended inside its first pass: dataset items it never drew


__all__ = ["Clip", "Coverage", "MicroBatch", "StepNumbers"]
