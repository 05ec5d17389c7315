"""The record stage's patches of torch, each undone on exit: gradient clipping (which window
clipped, to what; ``clips.py``), ``GradScaler`` (the scale a window's losses carried, the windows it skipped)
``LRScheduler.step`` (a rate changed inside a window) and ``DataLoader.__iter__`` (where a pass
over the data ends).

Patched at the class or module level, because frameworks call them from their own code
(Accelerate's and Lightning's clipping, the Trainer's scheduler); a call for another model's
parameters (a GAN's other half) is ignored. Each patch writes what it sees into the ``Watcher``
it is given (``patched(rec)``): clips, scale, skipped steps, ``lr_changed``, where a pass began.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from .clips import on_clip
from .sites import user_site
from .step_numbers import Clip, StepNumbers


class Watcher(Protocol):
    """What the patches record into: verify's ``Recorder`` and the in-place engine (``InPlace``) alike."""

    window: list[Any]
    clips: list[Clip]
    scale: float
    lr_changed: bool
    sites: dict[str, str]
    steps: list[StepNumbers]

    @property
    def param_ids(self) -> set[int]: ...

    def finish_step(self, numbers: StepNumbers) -> None: ...


class LoaderWatcher(Watcher, Protocol):
    """verify's ``Recorder``, which hands the loop its dataset and follows every pass over it."""

    dataset: Any
    data_passes: Any

    def iteration_began(self, loader: Any) -> None: ...


def lrs(opt: Any) -> tuple[float, ...]:
    return tuple(float(g["lr"]) for g in opt.param_groups) if opt is not None else ()


def current_lr(opt: torch.optim.Optimizer) -> float:
    """The learning rate of the optimizer's first parameter group (NaN without groups)."""
    return float(opt.param_groups[0]["lr"]) if opt.param_groups else float("nan")


@contextlib.contextmanager
def patched(rec: LoaderWatcher) -> Iterator[None]:
    """Every patch, recording into ``rec``, for as long as the loop runs."""
    with clipping(rec), scaler(rec), schedulers(rec), _loaders(rec):
        yield


@contextlib.contextmanager
def _loaders(rec: LoaderWatcher) -> Iterator[None]:
    """Every DataLoader iteration over verify's dataset (its own loader, the loop's, a framework's
    re-created one): where a pass ends, drop_last and the sampler included."""
    from torch.utils.data import DataLoader

    original = DataLoader.__iter__

    def iterate(loader: Any) -> Any:
        it = original(loader)
        if loader.dataset is rec.dataset:
            rec.iteration_began(loader)
        return it

    DataLoader.__iter__ = iterate  # type: ignore[method-assign]  # patched on torch's class for the run
    try:
        yield
    finally:
        DataLoader.__iter__ = original  # type: ignore[method-assign]  # torch's own again
        rec.data_passes.run_ended()


@contextlib.contextmanager
def clipping(rec: Watcher) -> Iterator[None]:
    """Every clip by norm torch performs (``clips.on_clip``: any import style, a framework's own call,
    torch's ``get_total_norm`` + ``clip_grads_with_norm_`` pair)."""

    def seen(params: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
        if any(id(p) in rec.param_ids for p in params):  # not another model's clip (a GAN's other half)
            clip = Clip(len(rec.window), max_norm, float(total_norm), user_site(), frozenset(map(id, params)))
            rec.clips.append(clip)

    with on_clip(seen):
        yield


@contextlib.contextmanager
def scaler(rec: Watcher) -> Iterator[None]:
    """GradScaler: the scale a window's losses were multiplied by (the replay uses it, so float16
    underflows alike), and windows it skipped on inf/nan, closed so they are not merged into the next."""
    step, scale = torch.amp.GradScaler.step, torch.amp.GradScaler.scale

    def scaled(scaler: Any, outputs: Any) -> Any:
        # first, so the scale exists (GradScaler makes it lazily, on its first call)
        out = scale(scaler, outputs)
        if scaler.is_enabled() and getattr(scaler, "_scale", None) is not None:
            rec.scale = (
                float(scaler._scale.item())
                if isinstance(scaler._scale, torch.Tensor)
                else float(scaler._scale)
            )
        return out

    def stepped(scaler: Any, optimizer: Any, *a: Any, **kw: Any) -> Any:
        before = len(rec.steps)
        out = step(scaler, optimizer, *a, **kw)
        if (
            len(rec.steps) == before
            and rec.window
            and any(id(p) in rec.param_ids for g in optimizer.param_groups for p in g["params"])
        ):
            rec.finish_step(StepNumbers(len(rec.window), current_lr(optimizer), skipped=True))
        return out

    torch.amp.GradScaler.step, torch.amp.GradScaler.scale = stepped, scaled  # type: ignore[method-assign, assignment]  # patched on torch's class for the run; wrappers take any arguments
    try:
        yield
    finally:
        torch.amp.GradScaler.step, torch.amp.GradScaler.scale = step, scale  # type: ignore[method-assign]  # torch's own again


@contextlib.contextmanager
def schedulers(rec: Watcher) -> Iterator[None]:
    """A scheduler that changes the rate while a window is open changed it between micro-batches."""
    original = torch.optim.lr_scheduler.LRScheduler.step

    def step(sched: Any, *a: Any, **kw: Any) -> Any:
        opt = getattr(sched, "optimizer", None)
        before = lrs(opt)
        out = original(sched, *a, **kw)
        ours = opt is not None and any(id(p) in rec.param_ids for g in opt.param_groups for p in g["params"])
        if ours and rec.window and lrs(opt) != before:
            rec.lr_changed = True
            rec.sites["scheduler"] = rec.sites.get("scheduler") or user_site() or ""
        return out

    torch.optim.lr_scheduler.LRScheduler.step = step  # type: ignore[method-assign, assignment]  # patched on torch's class for the run; the wrapper takes any arguments
    try:
        yield
    finally:
        torch.optim.lr_scheduler.LRScheduler.step = original  # type: ignore[method-assign]  # torch's own again


def capture_at_step(args: Any, kwargs: Any, capture: Callable[[], None]) -> Any:
    """What an optimizer step pre-hook returns: ``capture()`` now, or, where the step takes a closure
    (Lightning runs the window's last micro-batch inside it), right after the closure has run."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None:
        capture()
        return None

    def then_capture() -> Any:
        out = closure()
        capture()
        return out

    return args[:1], {k: v for k, v in kwargs.items() if k != "closure"} | {"closure": then_capture}


__all__ = ["capture_at_step", "clipping", "current_lr", "lrs", "patched", "scaler", "schedulers"]
