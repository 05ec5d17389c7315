"""Lesson 2: normalizing the loss. Naive vs ``loss / k`` vs dividing the gradients afterwards.

For k micro-batches of equal size, two forms give the true large-batch gradient
(the seed post "Gradient Accumulation in PyTorch, GANs and other Nightmares"):

    sum_j grad( mean_j / k )          divide each micro-batch loss   (accumlib.normalized)
    (1/k) * sum_j grad( mean_j )      divide .grad once, after the window   (accumlib.grad_divided)

and the naive loop (accumlib.naive) computes k times the true gradient. The BERT-style
loop of another seed ("How Gradient accumulation is implemented") divides correctly but
then logs the *divided* loss, so its reported epoch loss is off by k; ``bert_train_one_epoch``
is that loop, ported to the digits MLP, and ``bert_train_one_epoch_fixed`` the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import get_task, grad_divided, naive, normalized, resolve_device, trace_loop
from ..gallery import bert_train_one_epoch  # the seed's loop, ported once

from ._explorer import Explorer
from .why import digits_subset

TASK = "mlp-digits"
N_WINDOWS = 2  # two full windows per run: the division is the only thing that differs between the loops


LOOPS: dict[str, Callable[..., list[float]]] = {
    "naive (accumlib.naive)": naive,
    "loss / k (accumlib.normalized)": normalized,
    "grad / k after the window": grad_divided,  # accumlib.grad_divided
}


# --- error vs k ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorResult:
    """Worst relative error and norm ratio against the oracle, per loop, for every k."""

    ks: tuple[int, ...]
    micro_batch_size: int
    rel_error: dict[str, tuple[float, ...]]
    norm_ratio: dict[str, tuple[float, ...]]
    reported_ratio: tuple[float, ...]  # the BERT loop's reported epoch loss / the true one, per k

    def rows(self) -> list[tuple[Any, ...]]:
        """(k, then per loop the rounded norm ratio, then the BERT loop's reported/true loss)."""
        return [
            (k, *(round(self.norm_ratio[name][i], 3) for name in LOOPS), round(self.reported_ratio[i], 3))
            for i, k in enumerate(self.ks)
        ]


def _task(accum_steps: int, micro_batch_size: int, seed: int):
    n = N_WINDOWS * accum_steps * micro_batch_size
    return dataclasses.replace(
        get_task(TASK), make_dataset=functools.partial(digits_subset, n, seed), batch_size=micro_batch_size, accum_steps=accum_steps
    )


def compute(max_k: int = 8, micro_batch_size: int = 8, *, seed: int = 0, device: Any = "auto") -> ErrorResult:
    """For k = 1..``max_k``: each loop over two full windows, every step compared with the oracle."""
    dev = resolve_device(device)
    ks = tuple(range(1, max_k + 1))
    rel: dict[str, list[float]] = {name: [] for name in LOOPS}
    ratio: dict[str, list[float]] = {name: [] for name in LOOPS}
    reported = []
    for k in ks:
        task = _task(k, micro_batch_size, seed)
        for name, loop in LOOPS.items():
            trace = trace_loop(loop, task, seed=seed, device=dev)
            rel[name].append(max(c.rel_error for c in trace.comparisons))
            ratio[name].append(max(c.norm_ratio for c in trace.comparisons))
        run = bert_epoch(accum_steps=k, micro_batch_size=micro_batch_size, seed=seed, device=dev)
        reported.append(run.reported / run.true)
    return ErrorResult(
        ks, micro_batch_size, {n: tuple(v) for n, v in rel.items()}, {n: tuple(v) for n, v in ratio.items()}, tuple(reported)
    )


def plot(result: ErrorResult, highlight: int | None = None) -> Figure:
    """Left: |grad| / |true grad| vs k per loop. Right: the BERT loop's reported epoch loss / true."""
    fig = Figure(figsize=(10, 3.6))
    ax, bx = fig.subplots(1, 2)
    styles = {"naive (accumlib.naive)": ("tab:red", "o-"), "loss / k (accumlib.normalized)": ("tab:green", "s-"),
              "grad / k after the window": ("tab:blue", "x--")}
    for name, (color, style) in styles.items():
        ax.plot(result.ks, result.norm_ratio[name], style, color=color, label=name)
    ax.set_xlabel("accumulation steps k")
    ax.set_ylabel("|stepped grad| / |large-batch grad|")
    ax.set_title(f"gradient at optimizer.step(), micro-batch {result.micro_batch_size}")
    ax.legend(fontsize=8)
    bx.plot(result.ks, result.reported_ratio, "o-", color="tab:purple", label="seed loop: logs loss / k")
    bx.plot(result.ks, [1.0 / k for k in result.ks], ":", color="gray", label="1 / k")
    bx.axhline(1.0, color="tab:green", lw=1, label="fixed: logs the undivided loss")
    bx.set_xlabel("accumulation steps k")
    bx.set_ylabel("reported epoch loss / true epoch loss")
    bx.set_title("the BERT-style loop's progress-bar loss")
    bx.legend(fontsize=8)
    if highlight is not None:
        for a in (ax, bx):
            a.axvline(highlight, color="gray", ls="--", lw=1)
    fig.tight_layout()
    return fig


# --- the seed's BERT-style loop (ported once, in accumlib.gallery) and its fix -------------------------


def bert_train_one_epoch_fixed(model, optimizer, scheduler, dataloader, device, epoch, *, n_accumulate, criterion, progress=False, collect=True):
    """The same loop, fixed: divide a copy for ``backward``, log the undivided micro-batch loss."""
    model.train()
    dataset_size = 0
    running_loss = 0.0
    bar = tqdm(enumerate(dataloader), total=len(dataloader), disable=not progress)
    for step, data in bar:
        inputs = data[0].to(device)
        targets = data[1].to(device, dtype=torch.long)
        batch_size = inputs.size(0)
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        (loss / n_accumulate).backward()  # the gradient wants the division ...
        if (step + 1) % n_accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
        running_loss += loss.item() * batch_size  # ... the log does not
        dataset_size += batch_size
        epoch_loss = running_loss / dataset_size
        bar.set_postfix(Epoch=epoch, Train_Loss=epoch_loss, LR=optimizer.param_groups[0]["lr"])
    if collect:  # the seed's gc.collect(); it frees nothing here and costs ~0.5 s, so compute() skips it
        gc.collect()
    return epoch_loss


def make_optimizer(params) -> torch.optim.Optimizer:
    """AdamW, as in BERT fine-tuning."""
    return torch.optim.AdamW(params, lr=1e-3)


def make_scheduler(optimizer: torch.optim.Optimizer, total_steps: int = 64) -> Any:
    """A linear decay over ``total_steps`` optimizer steps, stepped once per window."""
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=total_steps)


def bert_train_fn(fixed: bool = False, accum_steps: int = 4, progress: bool = False) -> Callable[..., float]:
    """``train_fn(model, optimizer, loader)`` for ``accumlib.verify``: the seed loop (or the fix) with a scheduler."""
    loop = bert_train_one_epoch_fixed if fixed else bert_train_one_epoch

    def train_fn(model, optimizer, loader):
        device = next(model.parameters()).device
        return loop(model, optimizer, make_scheduler(optimizer), loader, device, 0,
                    n_accumulate=accum_steps, criterion=torch.nn.functional.cross_entropy, progress=progress)

    return train_fn


@dataclass(frozen=True)
class BertRun:
    """The epoch loss each loop reports, and the true mean item loss of the epoch (recorded independently)."""

    accum_steps: int
    reported: float
    reported_fixed: float
    true: float


def bert_epoch(accum_steps: int = 4, micro_batch_size: int = 8, *, seed: int = 0, device: Any = "auto", progress: bool = False) -> BertRun:
    """One epoch of the seed loop and of the fix, from one initial model, on ``N_WINDOWS`` full windows.

    The true epoch loss is the mean of every item loss the criterion computed, recorded by a
    wrapper around the criterion, so it does not depend on how either loop logs.
    """
    dev = resolve_device(device)
    data = digits_subset(N_WINDOWS * accum_steps * micro_batch_size, seed)
    out, seen = {}, []
    for fixed in (False, True):
        model = get_task(TASK).make_model(seed).to(dev)
        optimizer = make_optimizer(model.parameters())
        items: list[torch.Tensor] = []

        def criterion(outputs: torch.Tensor, targets: torch.Tensor, items: list = items) -> torch.Tensor:
            losses = torch.nn.functional.cross_entropy(outputs, targets, reduction="none")
            items.append(losses.detach().cpu())
            return losses.mean()

        loop = bert_train_one_epoch_fixed if fixed else bert_train_one_epoch
        out[fixed] = loop(model, optimizer, make_scheduler(optimizer), DataLoader(data, batch_size=micro_batch_size), dev, 0,
                          n_accumulate=accum_steps, criterion=criterion, progress=progress, collect=False)
        seen.append(float(torch.cat(items).mean()))
    assert abs(seen[0] - seen[1]) <= 1e-5 * seen[0]  # both loops train identically; only the log differs
    return BertRun(accum_steps, out[False], out[True], seen[1])


def widget(device: Any = "auto", initial: ErrorResult | None = None) -> Explorer:
    """A slider for k (highlighted) and the micro-batch size; re-runs ``compute`` up to max(8, k).

    ``initial``: the notebook's ``compute(8, 8)`` result, shown first instead of recomputing it.
    """
    import ipywidgets as w

    # k up to 8 only moves the highlight over the same sweep: keep each sweep (per widget)
    sweeps: dict[tuple[int, int], ErrorResult] = {} if initial is None else {(initial.ks[-1], initial.micro_batch_size): initial}

    def run(accum_steps: int, micro_batch_size: int) -> tuple[int, ErrorResult]:
        key = (max(8, accum_steps), micro_batch_size)
        if key not in sweeps:
            sweeps[key] = compute(*key, device=device)
        return accum_steps, sweeps[key]

    return Explorer(
        run,
        lambda r: plot(r[1], highlight=r[0]),
        initial=None if initial is None else (4, initial),
        accum_steps=w.IntSlider(value=4, min=1, max=12, description="k"),
        micro_batch_size=w.IntSlider(value=8, min=1, max=32, description="micro-batch"),
    )


# --- the exercise: where does the gradient division go? ----------------------------------------------


def exercise_loop(divide: str, accum_steps: int = 4) -> Callable[..., None]:
    """The seed's grad-division form as people write it, with the division ``"inside"`` or ``"after"`` the micro-batch loop.

    The seed shows ``for p in model.parameters(): p.grad = p.grad / n`` without indentation;
    where it sits decides whether the loop is right. Returns ``train_fn(model, optimizer, loader)``.
    """
    if divide not in ("inside", "after"):
        raise ValueError(f"divide must be 'inside' or 'after' (got {divide!r})")

    def train_fn(model, optimizer, loader):
        device = next(model.parameters()).device
        batches = iter(loader)
        for window in range(len(loader) // accum_steps):
            for _ in range(accum_steps):
                x, y = next(batches)
                loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()
                if divide == "inside":
                    for p in model.parameters():
                        p.grad = p.grad / accum_steps
            if divide == "after":
                for p in model.parameters():
                    p.grad = p.grad / accum_steps
            optimizer.step()
            optimizer.zero_grad()

    return train_fn


def exercise_dataset(seed: int = 0) -> Any:
    """64 digits: two windows of 4 x 8, nothing left over."""
    return digits_subset(64, seed)


__all__ = [
    "BertRun", "ErrorResult", "LOOPS", "bert_epoch", "bert_train_fn", "bert_train_one_epoch", "bert_train_one_epoch_fixed",
    "compute", "exercise_dataset", "exercise_loop", "make_optimizer", "make_scheduler", "plot", "widget",
]
