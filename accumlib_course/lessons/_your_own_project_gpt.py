"""Lesson 10, part: the effect at a size you recognise. A small GPT trained for a few hundred steps.

The identity every correct run implements, per optimizer step over a window of micro-batches b_j:

    grad (1/N) sum_{i in window} l_i  =  sum_j grad (sum_{i in b_j} l_i) / N,   N = the window's tokens

``small_gpt`` trains ``accumlib.models.GPT`` (nanoGPT's layout) on ``accumlib.data.TextLines`` (generated
sentences of 20 to 95 characters) with what a nanoGPT user writes: AdamW with betas (0.9, 0.95) and
weight decay 0.1, a linear warm-up then a cosine decay counted in optimizer steps, the gradient clipped
at norm 1. Every run starts from the same model and sees the same sentences in the same order, windows of
32 sentences (the last window of each epoch shorter), cut as 32 x 1 (the large batch: the reference),
8 x 4 and 4 x 8. The runs, all in lock step so that each step's parameters can be compared:

- ``sum / N``: token losses summed, divided by the window's token count (the loop to copy);
- ``mean / k``: each micro-batch's mean divided by k (the short last window by k too);
- ``naive sum``: each micro-batch's mean, summed (k times the gradient);
- ``counted before the shift``: the sum divided by the tokens counted before the labels' shift (N + S);
- ``scheduler per micro-batch``: the right gradient, ``scheduler.step()`` once per micro-batch.

What is recorded at every optimizer step: the window's true mean token loss (what a log should show)
and the distance of the parameters from the large batch's after the step, relative to how far the large
batch has moved from the start. Presets: ``tiny`` (seconds: the notebook under nbval and the tests),
``small`` (0.8M parameters, 300 steps: minutes on a CPU; the notebook's committed figures).
"""

from __future__ import annotations

import functools
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from accumlib.checks import check_choice, check_int
from accumlib.data import IGNORE_INDEX, TextLines, pad_collate
from accumlib.models import GPT
from accumlib.text import Table
from accumlib.tolerances import FLOAT32_RTOL

WINDOW = 32  # sentences per optimizer step, in every run


@dataclass(frozen=True)
class Preset:
    """A model size, a data set and a run length."""

    n_layers: int
    d_model: int
    n_heads: int
    n_sequences: int  # not a multiple of WINDOW: every epoch ends with a short window
    steps: int
    lr: float
    warmup: int


PRESETS = {
    "tiny": Preset(n_layers=2, d_model=32, n_heads=2, n_sequences=136, steps=20, lr=3e-3, warmup=3),
    "small": Preset(n_layers=4, d_model=128, n_heads=4, n_sequences=1000, steps=300, lr=2e-3, warmup=30),
}

# (loop, micro-batch, k); the first is the reference, the next two must land on it
RUNS = (
    ("sum / N", 32, 1),
    ("sum / N", 8, 4),
    ("sum / N", 4, 8),
    ("mean / k", 4, 8),
    ("naive sum", 4, 8),
    ("counted before the shift", 4, 8),
    ("scheduler per micro-batch", 4, 8),
)
CORRECT = "sum / N"
MIN_LR = 0.1  # the cosine decays to 10 % of the peak, as nanoGPT's does


def _lr_factor(step: int, preset: Preset) -> float:
    """Linear warm-up over ``preset.warmup`` steps, a cosine to MIN_LR at ``preset.steps``, flat after."""
    if step < preset.warmup:
        return (step + 1) / preset.warmup
    done = min(1.0, (step - preset.warmup) / max(1, preset.steps - preset.warmup))
    return MIN_LR + (1 - MIN_LR) * 0.5 * (1 + math.cos(math.pi * done))


def _windows(preset: Preset, seed: int):
    """The window order every run shares: a new permutation each epoch, cut into windows of WINDOW."""
    order = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(preset.n_sequences, generator=order).tolist()
        yield from (perm[i : i + WINDOW] for i in range(0, len(perm), WINDOW))


def gpt_for(preset: Preset, seed: int) -> GPT:
    """The preset's GPT, seeded: the same initial model in every run, at every k and on every rank."""
    torch.manual_seed(seed)
    return GPT(TextLines(1).vocab, preset.n_layers, preset.d_model, preset.n_heads)


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """nanoGPT's AdamW: betas (0.9, 0.95), weight decay 0.1."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def micro_batches(lines: TextLines, window: list[int], batch_size: int) -> list[Any]:
    """The window's sentences cut into micro-batches of ``batch_size``, each collated (padded, shifted)."""
    return [
        pad_collate([lines[i] for i in window[j : j + batch_size]]) for j in range(0, len(window), batch_size)
    ]


def token_loss_sum(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The sum of a micro-batch's token losses, padding ignored: what every loop here divides."""
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(
        model(inputs).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


class _Run:
    """One model, its AdamW and its schedule, trained one window at a time."""

    def __init__(self, loop: str, batch_size: int, accum_steps: int, preset: Preset, seed: int):
        self.loop, self.batch_size, self.accum_steps = loop, batch_size, accum_steps
        self.model = gpt_for(preset, seed)
        self.start = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()
        self.optimizer = adamw(self.model, preset.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, functools.partial(_lr_factor, preset=preset)
        )
        self.losses: list[float] = []
        self.seconds = 0.0

    def window(self, lines: TextLines, window: list[int]) -> None:
        """One optimizer step over ``window``: accumulate, clip, step."""
        t0 = time.perf_counter()
        self.losses.append(self.accumulate(lines, window))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        if self.loop != "scheduler per micro-batch":
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.seconds += time.perf_counter() - t0

    def accumulate(self, lines: TextLines, window: list[int]) -> float:
        """The window's backwards, written out with each run's one difference; returns the window's true
        mean token loss (what a log should show, whatever the loop)."""
        micro = micro_batches(lines, window, self.batch_size)
        n_tokens = sum(int((t != IGNORE_INDEX).sum()) for _, t in micro)  # counted before any backward
        n_before_shift = n_tokens + len(window)  # each sentence's tokens before the shift drops one
        loss_sum = 0.0
        for inputs, targets in micro:
            token_loss = token_loss_sum(self.model, (inputs, targets))
            loss_sum += token_loss.item()
            n_micro = int((targets != IGNORE_INDEX).sum())
            if self.loop == "mean / k":  # Accelerate's and Lightning's division, the short window's too
                loss = token_loss / n_micro / self.accum_steps
            elif self.loop == "naive sum":
                loss = token_loss / n_micro
            elif self.loop == "counted before the shift":
                loss = token_loss / n_before_shift
            else:  # sum / N, and the scheduler's run, whose gradient is right
                loss = token_loss / n_tokens
            loss.backward()
            if self.loop == "scheduler per micro-batch":
                with warnings.catch_warnings():  # torch warns once that it ran before optimizer.step()
                    warnings.simplefilter("ignore", UserWarning)
                    self.scheduler.step()  # the slip: at the end of the loop body, outside the `if`
        return loss_sum / n_tokens

    def params(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.model.parameters()).detach()


@dataclass(frozen=True)
class GPTRun:
    """One run's record: its window's true mean token loss and its distance from the large batch, per step."""

    loop: str
    batch_size: int
    accum_steps: int
    losses: tuple[float, ...]
    distances: tuple[float, ...]  # |theta - theta_large| / |theta_large - theta_0| after each step
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.batch_size} x {self.accum_steps}, {self.loop}"

    @property
    def correct(self) -> bool:
        """Whether the loop is the right one (by construction, not by its numbers)."""
        return self.loop == CORRECT


@dataclass(frozen=True)
class GPTResult:
    """Every run of ``RUNS`` on one preset; ``runs[0]`` is the large batch (32 x 1)."""

    preset_name: str
    preset: Preset
    n_parameters: int
    runs: tuple[GPTRun, ...]
    recorded: str = ""  # where and when a recorded run was made ("": computed in this process)

    @property
    def reference(self) -> GPTRun:
        return self.runs[0]

    def find(self, loop: str, batch_size: int = 4, accum_steps: int = 8) -> GPTRun:
        for r in self.runs:
            if (r.loop, r.batch_size, r.accum_steps) == (loop, batch_size, accum_steps):
                return r
        raise ValueError(f"run must be one computed (got {loop!r} at {batch_size} x {accum_steps})")

    def loss_gap(self, run: GPTRun) -> float:
        """The largest relative difference of the run's logged losses from the large batch's."""
        return max(abs(a - b) / b for a, b in zip(run.losses, self.reference.losses))

    def steps_within(self, run: GPTRun, bound: float = FLOAT32_RTOL) -> int:
        """How many optimizer steps, from the first, leave ``run`` within ``bound`` of the large batch."""
        return next((i for i, d in enumerate(run.distances) if d > bound), len(run.distances))

    def summary(self) -> str:
        """One line per run: how far from the large batch's parameters, and when."""
        lines = []
        for r in self.runs[1:]:
            d, within = r.distances, self.steps_within(r)
            line = f"{r.label}: {d[0]:.1e} after step 1, "
            if within == len(d):
                line += f"within {FLOAT32_RTOL:.0e} for all {within} steps"
            elif self.steps_within(r, 1e-2) == 0:
                line += f"beyond {1e-2:.0e} from the first step"
            else:
                line += f"within {FLOAT32_RTOL:.0e} for the first {within} steps"
                if max(d) > 1e-2:
                    line += f", beyond {1e-2:.0e} from step {self.steps_within(r, 1e-2) + 1}"
            gap = f"{r.losses[-1] - self.reference.losses[-1]:+.3f}".replace("-0.000", "+0.000")
            lines.append(f"{line}; {d[-1]:.2g} at the end, last loss {gap} against 32 x 1")
        return "\n".join(lines)

    def rows(self) -> list[tuple[Any, ...]]:
        return [
            (
                r.label,
                f"{r.losses[-1]:.4f}",
                f"{self.loss_gap(r):.1e}",
                f"{max(r.distances):.1e}",
                f"{r.distances[-1]:.1e}",
                f"{r.seconds / len(r.losses) * 1e3:.0f}",
            )
            for r in self.runs[1:]
        ]

    def table(self) -> Table:
        p = self.preset
        return Table(
            (
                "run",
                "last loss",
                "largest loss gap",
                "largest distance",
                "distance at the end",
                "ms per step",
            ),
            self.rows(),
            caption=(
                f"GPT, {p.n_layers} layers x {p.d_model} wide ({self.n_parameters:,} parameters), "
                f"{p.steps} optimizer steps of {WINDOW} sentences; large batch 32 x 1: last loss "
                f"{self.reference.losses[-1]:.4f}, {self.reference.seconds / p.steps * 1e3:.0f} ms per step"
            ),
        )


def small_gpt(preset: str = "tiny", *, seed: int = 0, recorded: bool = False) -> GPTResult:
    """Train every run of ``RUNS`` on ``preset`` in lock step; return each one's losses and distances.

    ``recorded=True`` returns instead the run of ``preset`` committed with the package (``RECORDED``,
    made by ``python -m accumlib_course.lessons._your_own_project_gpt``, ``make lesson-data``): the small
    preset takes minutes on a CPU. The tests check it against a fresh computation of its first steps.

    >>> small_gpt("huge")
    Traceback (most recent call last):
    ...
    ValueError: preset must be one of 'small', 'tiny' (got 'huge')
    >>> small_gpt("tiny", recorded=True)
    Traceback (most recent call last):
    ...
    ValueError: preset must be one of 'small' with recorded=True: the presets recorded (got 'tiny')
    """
    seed = check_int("seed", seed, low=0)
    if recorded:
        if preset not in RECORDED:
            names = ", ".join(repr(n) for n in sorted(RECORDED))
            raise ValueError(
                f"preset must be one of {names} with recorded=True: the presets recorded (got {preset!r})"
            )
        return load(RECORDED[preset], seed)
    preset = check_choice("preset", preset, sorted(PRESETS))
    return _train(PRESETS[preset], preset, seed)


@functools.lru_cache(maxsize=4)
def _train(preset: Preset, name: str, seed: int) -> GPTResult:
    lines = TextLines(preset.n_sequences, seed=seed)
    runs = [_Run(loop, b, k, preset, seed) for loop, b, k in RUNS]
    distances: list[list[float]] = [[] for _ in runs]
    windows = _windows(preset, seed)
    for _ in range(preset.steps):
        window = next(windows)
        for run in runs:
            run.window(lines, window)
        large = runs[0].params()
        moved = float((large - runs[0].start).norm())
        for run, d in zip(runs, distances):
            d.append(float((run.params() - large).norm()) / moved)
    n_parameters = sum(p.numel() for p in runs[0].model.parameters())
    records = tuple(
        GPTRun(r.loop, r.batch_size, r.accum_steps, tuple(r.losses), tuple(d), r.seconds)
        for r, d in zip(runs, distances)
    )
    return GPTResult(name, preset, n_parameters, records)


# --- the recorded run ------------------------------------------------------------------------------
RECORDED = {"small": Path(__file__).with_name("small_gpt.json")}


def load(path: Path, seed: int = 0) -> GPTResult:
    """A run written by ``record``; its preset must be the one this code defines (else it is stale)."""
    data = json.loads(Path(path).read_text())
    preset = Preset(**data["preset"])
    if preset != PRESETS[data["preset_name"]] or data["seed"] != seed:
        raise ValueError(
            f"{path.name} must be a run of this code's {data['preset_name']!r} preset at seed {seed} "
            f"(got {preset} at seed {data['seed']}): run `make lesson-data` to record it again"
        )
    runs = tuple(
        GPTRun(**{**r, "losses": tuple(r["losses"]), "distances": tuple(r["distances"])})
        for r in data["runs"]
    )
    return GPTResult(data["preset_name"], preset, data["n_parameters"], runs, data["recorded"])


def record(name: str = "small", seed: int = 0) -> Path:
    """Compute ``name``'s run and write it where ``small_gpt(name, recorded=True)`` reads it."""
    result = small_gpt(name, seed=seed)
    cpu = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), "a CPU")
    where = (
        f"recorded {time.strftime('%Y-%m-%d', time.gmtime())} on {cpu}, {torch.get_num_threads()} torch "
        f"thread(s), torch {torch.__version__.split('+')[0]}"
    )
    data = {**asdict(result), "recorded": where, "seed": seed}
    path = RECORDED[name]
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux
        return []


if __name__ == "__main__":  # make lesson-data
    torch.set_num_threads(1)  # as the notebook runs it
    print("wrote", record("small"))
