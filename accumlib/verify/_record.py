"""Instrument one run of the user's loop on verify's own copy of the model.

What is recorded, and why it is enough to judge a step:
- the dataset indices behind every collated micro-batch (a wrapped dataset plus a wrapped
  ``collate_fn``: both survive Accelerate's ``prepare``, which re-creates the DataLoader);
- every forward of the model, matched to the micro-batch it consumed by tensor address
  (else by leading size), so prefetching loaders (Accelerate, nanoGPT) do not shift windows;
  with the learning rates and autocast state at that moment;
- at every step of any optimizer over the model's parameters (a global hook: Lightning users
  build their own), the gradient it sees: before the step, or, when the step gets a closure
  (Lightning runs the last micro-batch inside it), right after the closure;
- every ``clip_grad_norm_`` call (micro-batches so far, the norm it saw), and every window
  GradScaler skipped on inf/nan, so it is not merged into the next.
At each step the oracle is computed on a shadow copy loaded with the live parameters, which
are still the parameters the window started from.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from .._batch import ItemLosses, checked_losses, to_device

BN_TYPES = (torch.nn.modules.batchnorm._BatchNorm,)


def flat(grads: list[torch.Tensor | None], like: list[torch.Tensor]) -> torch.Tensor:
    """One float64 vector of all gradients (zeros where a grad is None)."""
    return torch.cat([(g if g is not None else torch.zeros_like(p)).detach().reshape(-1).double().cpu() for g, p in zip(grads, like)])


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):  # dict, or a UserDict such as Hugging Face's BatchEncoding
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class Tracked(Dataset):
    """The user's dataset, read-only, noting which indices each micro-batch was built from."""

    def __init__(self, dataset: Dataset):
        self.dataset, self.pending = dataset, []  # type: ignore[var-annotated]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        self.pending.append(i)
        return self.dataset[i]


@dataclass
class Clip:
    seen: int  # micro-batches in the window when clipping ran
    max_norm: float
    total_norm: float


@dataclass
class Step:
    """Everything recorded for one optimizer step (flat float64 gradient vectors)."""

    batches: list[int]
    lrs: list[tuple[float, ...]]
    low_precision: bool
    grad: torch.Tensor
    leak: torch.Tensor | None
    clips: list[Clip]
    oracle: torch.Tensor | None = None
    items: int = 0
    loss_sum: float = 0.0
    parts: list[torch.Tensor] | None = None  # per micro-batch: grad of (its item-loss sum) / items
    part_items: list[int] | None = None
    batchnorm: bool = False
    skipped: bool = False  # GradScaler found inf/nan and did not step


@dataclass
class Recorder:
    net: torch.nn.Module
    shadow: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Tracked
    collate: Callable[[list], Any]
    item_losses: ItemLosses
    tol: Callable[[bool], float]
    batches: list[Any] = field(default_factory=list)
    indices: list[list[int]] = field(default_factory=list)
    address: dict[int, int] = field(default_factory=dict)
    storage: dict[int, int] = field(default_factory=dict)
    stepped: set[int] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    lrs: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)  # (optimizer id, lr per group)
    low_precision: bool = False
    leak: torch.Tensor | None = None
    clips: list[Clip] = field(default_factory=list)
    forwards: int = 0

    def __post_init__(self) -> None:
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.param_ids = {id(p) for p in self.params}
        self.shadow_params = [p for p in self.shadow.parameters() if p.requires_grad]

    # -- data -------------------------------------------------------------------------
    def collate_fn(self, samples: list) -> Any:
        batch = self.collate(samples)
        self.indices.append(self.dataset.pending)
        self.dataset.pending = []
        b = len(self.batches)
        for t in _tensors(batch):
            self.address[t.data_ptr()] = b
            s = t.untyped_storage().data_ptr()
            self.storage[s] = b if self.storage.get(s, b) == b else -1  # -1: batches share one storage
        self.batches.append(batch)  # kept alive, so no later batch can reuse its storage
        return batch

    def _identify(self, args: Any, kwargs: Any) -> list[int]:
        """The micro-batches a forward consumed: by tensor storage, else by leading size."""
        tensors = list(_tensors((args, kwargs)))
        for t in tensors:
            b = self.address.get(t.data_ptr(), self.storage.get(t.untyped_storage().data_ptr(), -1))
            if b >= 0:
                return [b]
        # inputs rebuilt by the loop (copied, cast, merged): the oldest fresh batches whose rows add up
        fresh = [b for b in range(len(self.batches)) if b not in self.stepped and b not in self.window]
        rows = tensors[0].shape[0] if tensors and tensors[0].dim() else None
        taken, total = [], 0
        for b in fresh:
            first = next(_tensors(self.batches[b]), None)
            taken.append(b)
            total += first.shape[0] if first is not None and first.dim() else 0
            if rows is None or total >= rows:
                break
        return taken if rows is None or total == rows else taken[:1]

    # -- hooks --------------------------------------------------------------------------
    def on_forward(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        new = [b for b in self._identify(args, kwargs) if b not in self.window and b not in self.stepped]
        if not new:
            return  # a forward on data that is not a new micro-batch (evaluation, a repeat)
        if not self.window and any(p.grad is not None for p in self.params):
            leak = flat([p.grad for p in self.params], self.params)  # .grad before the window's first backward
            self.leak = leak if bool(leak.any()) else None
        lrs = (id(self.optimizer), tuple(float(g["lr"]) for g in self.optimizer.param_groups))
        for b in new:
            self.window.append(b)
            self.lrs.append(lrs)
        self.forwards += 1
        self.low_precision |= torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")

    def inside_forward(self, module: torch.nn.Module, args: Any) -> None:
        # autocast entered inside forward (Accelerate's mixed_precision wraps model.forward) shows only here
        if self.window and (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")):
            self.low_precision = True

    def on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if not any(id(p) in self.param_ids for g in optimizer.param_groups for p in g["params"]):
            return None  # another model's optimizer (a GAN's other half)
        self.optimizer = optimizer  # the loop may have built its own; read learning rates from it
        # args[0] is the optimizer itself; a closure comes positionally after it or by keyword
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self.capture()
            return None

        def then_capture() -> Any:  # Lightning: the last micro-batch runs inside the closure
            out = closure()
            self.capture()
            return out

        rest = {k: v for k, v in kwargs.items() if k != "closure"}
        return args[:1], rest | {"closure": then_capture}

    @contextlib.contextmanager
    def clipping(self) -> Iterator[None]:
        """Record each clip_grad_norm_ call; restored on exit (it patches torch.nn.utils)."""
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_mod

        original = clip_mod.clip_grad_norm_

        def recorded(parameters: Any, max_norm: float, *a: Any, **kw: Any) -> torch.Tensor:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            total = original(params, max_norm, *a, **kw)
            if any(id(p) in self.param_ids for p in params):  # not another model's clip (a GAN's other half)
                self.clips.append(Clip(len(self.window), float(max_norm), float(total)))
            return total

        nn_utils.clip_grad_norm_ = clip_mod.clip_grad_norm_ = recorded  # type: ignore[assignment]
        try:
            yield
        finally:
            nn_utils.clip_grad_norm_ = clip_mod.clip_grad_norm_ = original  # type: ignore[assignment]

    @contextlib.contextmanager
    def scaler_skips(self) -> Iterator[None]:
        """Close a window GradScaler skipped (inf/nan), so it is not merged into the next one."""
        original = torch.amp.GradScaler.step

        def step(scaler: Any, optimizer: Any, *a: Any, **kw: Any) -> Any:
            before = len(self.steps)
            out = original(scaler, optimizer, *a, **kw)
            if len(self.steps) == before and self.window:
                self.steps.append(Step(list(self.window), self.window_lrs(), self.low_precision,
                                       flat([p.grad for p in self.params], self.params), None, list(self.clips), skipped=True))
                self.stepped.update(self.window)
                self.window, self.lrs, self.low_precision, self.leak, self.clips = [], [], False, None, []
            return out

        torch.amp.GradScaler.step = step  # type: ignore[method-assign]
        try:
            yield
        finally:
            torch.amp.GradScaler.step = original  # type: ignore[method-assign]

    # -- the oracle at each step ---------------------------------------------------------
    def _sync_shadow(self) -> None:
        with torch.no_grad():
            for s, p in zip(self.shadow.parameters(), self.net.parameters()):
                s.copy_(p)
            for s, b in zip(self.shadow.buffers(), self.net.buffers()):
                s.copy_(b)
        for s, m in zip(self.shadow.modules(), self.net.modules()):
            s.training = m.training

    def merged(self, batch_ids: list[int]) -> Any:
        """The window as one large batch: every item re-collated together, as a k*B DataLoader would."""
        return self.on_shadow(self.collate([self.dataset.dataset[i] for b in batch_ids for i in self.indices[b]]))

    def on_shadow(self, batch: Any) -> Any:
        return to_device(batch, next(self.shadow.parameters()).device)

    def _grad(self, batch: Any, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        losses = checked_losses(self.item_losses, self.shadow, batch)
        total = losses.sum() / (scale if scale is not None else max(losses.numel(), 1))
        grads = torch.autograd.grad(total, self.shadow_params, allow_unused=True)
        return flat(list(grads), self.shadow_params), losses.detach()

    def window_lrs(self) -> list[tuple[float, ...]]:
        """Learning rates of the optimizer that steps, as each micro-batch saw them. Forwards that ran
        before the loop's own optimizer first stepped (Lightning builds one) were read from another."""
        return [lrs for opt, lrs in self.lrs if opt == id(self.optimizer)]

    def capture(self) -> None:
        grad = flat([p.grad for p in self.params], self.params)
        step = Step(list(self.window), self.window_lrs(), self.low_precision, grad, self.leak, list(self.clips))
        self.stepped.update(self.window)
        self.window, self.lrs, self.low_precision, self.leak, self.clips = [], [], False, None, []
        self.steps.append(step)
        if not step.batches:
            return
        if not bool(torch.isfinite(grad).all()):
            step.items = self.count_and_loss(self.merged(step.batches))[0]  # for the coverage count only
            return
        self._sync_shadow()
        step.batchnorm = any(isinstance(m, BN_TYPES) and m.training for m in self.net.modules())
        with _exact():
            # one forward over the whole window, so BatchNorm sees the large batch
            losses = checked_losses(self.item_losses, self.shadow, self.merged(step.batches))
            step.items, step.loss_sum = losses.numel(), float(losses.detach().double().sum())
            if step.items == 0:
                return
            grads = torch.autograd.grad(losses.mean(), self.shadow_params, allow_unused=True)
            step.oracle = flat(list(grads), self.shadow_params)
            before_clip = unclipped(grad, step.clips, len(step.batches))[0]
            if step.batchnorm or _rel(before_clip, step.oracle) > self.tol(step.low_precision):
                # only for a step that needs a diagnosis: each micro-batch's share of the true gradient
                parts = [self._grad(self.on_shadow(self.batches[b]), scale=step.items) for b in step.batches]
                step.parts = [g for g, _ in parts]
                step.part_items = [int(losses.numel()) for _, losses in parts]

    def count_and_loss(self, batch: Any) -> tuple[int, float]:
        """Items and loss sum of a batch at the current parameters (for what never reached a step).
        The sum may be inf/nan after a diverged step: counted anyway, never a crash."""
        self._sync_shadow()
        with torch.no_grad(), _exact(grad=False):
            losses = self.item_losses(self.shadow, self.on_shadow(batch))
        if not isinstance(losses, torch.Tensor) or losses.dim() != 1:
            checked_losses(lambda m, b: losses, self.shadow, batch)  # raises the contract's own error
        return losses.numel(), float(losses.double().sum())


@contextlib.contextmanager
def _exact(grad: bool = True) -> Iterator[None]:
    """The oracle's own context, whatever the loop's: float32 (no autocast, e.g. inside Lightning's
    closure), autograd on (optimizer.step runs under no_grad), and the loop's RNG stream left alone."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        if grad:
            stack.enter_context(torch.enable_grad())
        yield


def unclipped(grad: torch.Tensor, clips: list[Clip], m: int) -> tuple[torch.Tensor, list[Clip]]:
    """Undo clips that ran on the complete window: torch scales by min(1, max_norm / (norm + 1e-6))."""
    complete = [c for c in clips if c.seen >= m]
    coef = math.prod(min(1.0, c.max_norm / (c.total_norm + 1e-6)) for c in complete)
    return grad / coef, complete


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    ref = float(b.norm())
    diff = float((a - b).norm())
    return diff / ref if ref > 0 else (0.0 if diff == 0 else float("inf"))


def first_layer(net: torch.nn.Module) -> torch.nn.Module:
    """The first module that holds parameters itself: a forward always passes through it."""
    return next((m for m in net.modules() if any(True for _ in m.parameters(recurse=False))), net)


def make_shadow(net: torch.nn.Module) -> torch.nn.Module:
    """A second copy for the oracle, so its forwards never reach the loop's hooks or RNG-driven state."""
    return copy.deepcopy(net)


def disable_dropout(net: torch.nn.Module) -> list[float]:
    """Set every dropout probability in verify's copy to 0; return the probabilities it had."""
    found = []
    for m in net.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            found.append(float(m.p))
            m.p = 0.0
        elif isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0:
            found.append(float(m.dropout))
            m.dropout = 0.0
    return found


__all__ = ["Clip", "Recorder", "Step", "Tracked", "disable_dropout", "flat", "make_shadow"]
