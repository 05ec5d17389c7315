"""The record stage: instrument one run of the user's loop on verify's copy of the model.

What is recorded, and why it is enough to judge a step:
- every micro-batch as it arrives in the main process: the collate function verify hands out
  (it survives Accelerate's ``prepare`` and the Trainer's own DataLoader, which re-create the
  loader) and the dataset wrapper's indices (a loop that builds its own DataLoader over
  ``loader.dataset``). A worker process cannot report back, so one is refused loudly;
- every forward of the model, matched to the micro-batch it consumed by tensor address, else by
  content, else by the indices the loop just drew, so prefetching loaders (Accelerate, nanoGPT),
  device copies and casts do not shift windows; with the autocast state and learning rates;
- every backward (a post-accumulate-grad hook counts them): the end of a micro-batch, where the
  oracle stage reads ``.grad``; every parameter is watched, and ``requires_grad`` is read at each
  micro-batch's forward (gradual unfreezing), so the oracle differentiates what the loop did;
- at every step of any optimizer over the model's parameters (a global hook: frameworks build
  their own), the gradient it sees: before the step, or right after the closure when the step
  gets one (Lightning runs the last micro-batch inside it);
- every clip torch performs (``clips.py``: any import style), GradScaler's scale and skipped steps,
  learning-rate changes a scheduler makes inside a window, and what changed ``.grad`` after the
  window's last backward (``touched.py``).
Each step leaves a ``StepNumbers``: a few floats, nothing parameter-sized. The window's
micro-batches are released once its step is judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from torch.utils.data import get_worker_info

from ..batches import ItemLosses, cat_batches
from .errors import Fallback, StopRun
from .inplace_verify import same_oracle, take, take_over
from .measure import against_sums, measure
from .patches import capture_at_step, current_lr
from .ranks import Ranks, full, sharded
from .shadow import sync_shadow
from .sites import user_site
from .sources import WORKERS, Passes, Tracked, TrackedIterable, as_received, tensors
from .step_numbers import Clip, MicroBatch, StepNumbers
from .touched import fingerprint, hooked, rescale, unexplained
from .window_oracle import Replay, WindowOracle, clipped

BN_TYPES = (torch.nn.modules.batchnorm._BatchNorm,)


@dataclass
class Recorder:
    net: torch.nn.Module
    shadow: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Tracked | TrackedIterable
    collate: Callable[[list[Any]], Any]
    item_losses: ItemLosses
    max_steps: int | None = None
    mbs: dict[int, MicroBatch] = field(default_factory=dict)
    fresh: list[int] = field(default_factory=list)  # drawn, not yet consumed by a forward, oldest first
    consumed: set[int] = field(default_factory=set)
    address: dict[int, int] = field(default_factory=dict)
    storage: dict[int, int] = field(default_factory=dict)
    steps: list[StepNumbers] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    how: Replay = field(default_factory=Replay)
    lrs: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    lr_changed: bool = False
    sites: dict[str, str] = field(default_factory=dict)  # the window's calls in the user's code (sites.py)
    caller: str | None = (
        None  # the user's call of verify: a loop run wholly by a framework has no site of its own
    )
    clips: list[Clip] = field(default_factory=list)
    untracked: int = 0
    backwards: int = 0
    mark: int = 0
    forwards: int = 0
    drawn: int = 0
    scale: float = 1.0  # GradScaler's, at the loop's last scale() call
    scales: list[float] = field(default_factory=list)  # GradScaler's scale at each backward of the window
    end_next: bool = False  # an IterableDataset ran out while this batch was being drawn
    used_indices: set[int] = field(default_factory=set)  # dataset indices of windows that reached a step
    position: int = 0  # place of the last micro-batch drawn in its pass over the data
    passes: int = 0  # passes over the data that ended so far
    passes_used: set[int] = field(default_factory=set)  # passes the loop trained on (not a sweep for sizes)
    grad_hooks: dict[int, Any] = field(default_factory=dict)  # post-accumulate-grad hook per parameter id
    trainable: tuple[bool, ...] = ()  # requires_grad of each parameter at the current group's first forward
    frozen_changed: bool = False  # requires_grad changed between micro-batches of the window being recorded
    counting: bool = (
        False  # the run ended and the shadow holds its last parameters (``coverage.count_and_loss``)
    )
    ranks: Ranks | None = None  # a multi-rank job: the exchange stage makes each step's oracle the job's
    # per parameter id: the first few entries of .grad right after its latest backward (``rescale``)
    prints: dict[int, torch.Tensor] = field(default_factory=dict)
    kept: dict[int, torch.Tensor] = field(default_factory=dict)  # each parameter's fingerprint, reused
    # the in-place engine, whose figures judge each step (``inplace_verify.py``); None: the oracle replays
    engine: Any = None
    groups: list[tuple[int, int]] = field(default_factory=list)  # in place: (micro-batches, rows) per group
    checked: bool = False  # in place: the engine's oracle was checked against item_losses' (one window)
    switched: str = ""  # why the recompute oracle took the run over from the engine, and from which step

    def __post_init__(self) -> None:
        # every parameter, frozen or not: a loop may unfreeze some later (and freeze others)
        self.params = list(self.net.parameters())
        self.param_ids = {id(p) for p in self.params}
        self.oracle = WindowOracle(
            self.shadow, sync_shadow(self.shadow, self.net, self.params), self.item_losses
        )
        self.watch_grads()
        self.data_passes = Passes(len(self.dataset) if isinstance(self.dataset, Tracked) else 0)
        if isinstance(self.dataset, TrackedIterable):
            self.dataset.on_end = self._pass_ended

    def in_place(self, engine: Any) -> None:
        """Judge in place with ``engine``: told of each backward, so a case it cannot judge hands the run to
        the recompute oracle at its window's first backward (``inplace_verify.take_over``)."""
        self.engine = engine
        engine.before_backward = lambda first: take_over(self, first)

    def give_up(self, reason: str) -> None:
        """The in-place engine cannot vouch for this run: ``Fallback`` now, or in a job at the next exchange,
        where every rank raises it together (one rank alone rerunning would leave the others waiting)."""
        if self.ranks is None:
            raise Fallback(reason)
        self.ranks.fallback = self.ranks.fallback or reason

    def replay_from_here(self) -> None:
        """The recompute oracle takes the run over at a window's first backward: .grad is still what it
        held when the window began."""
        self.engine.paused, self.engine = True, None
        self.oracle.leaves = self.sync()
        self.oracle.open(self.grads())

    def watch_grads(self) -> None:
        """Count backwards on every parameter that requires grad now (no hook sits on one that does not)."""
        for p in self.params:
            if p.requires_grad and id(p) not in self.grad_hooks:
                self.grad_hooks[id(p)] = p.register_post_accumulate_grad_hook(self.on_backward)  # type: ignore[no-untyped-call]  # unannotated in torch

    def live(self) -> list[torch.nn.Parameter]:
        """The model's parameters now, in ``params`` order. FSDP2's ``fully_shard`` replaces them (and, inside
        a forward, shows gathered ones): taken by place, and every one seen counts as the model's."""
        now = list(self.net.parameters())
        if len(now) == len(self.params) and any(a is not b for a, b in zip(now, self.params)):
            self.params = now
            self.param_ids |= {id(p) for p in now}
        return self.params

    def grads(self) -> list[torch.Tensor | None]:
        """``.grad`` of every parameter, whole (a DTensor's gathered, on every rank alike)."""
        return [full(p.grad) for p in self.live()]

    def sync(self) -> list[torch.Tensor]:
        return sync_shadow(self.shadow, self.net, self.live(), own=sharded(self.net))

    def unwatch(self) -> None:
        for h in self.grad_hooks.values():
            h.remove()
        self.grad_hooks.clear()

    # -- data -----------------------------------------------------------------------------
    def collate_fn(self, samples: list[Any]) -> Any:
        if get_worker_info() is not None:
            raise RuntimeError(WORKERS)
        batch = self.collate(samples)
        if isinstance(self.dataset, Tracked):
            # the last len(samples) reads are this batch's; earlier ones were the loop reading the dataset
            # for its own purposes (item lengths for a length-grouped sampler), not a micro-batch
            idx, self.dataset.pending = self.dataset.pending[len(self.dataset.pending) - len(samples) :], []
            self._register(batch, idx)
        else:
            self.dataset.pending = 0
            self._register(batch, None)
        return batch

    def _register(self, batch: Any, idx: list[int] | None) -> int:
        b = self.drawn
        self.drawn += 1
        first = next(tensors(batch), None)
        self.position += 1
        mb = MicroBatch(
            batch,
            idx,
            int(first.shape[0]) if first is not None and first.dim() else 0,
            self.end_next,
            self.position,
            self.passes,
        )
        if idx is not None:
            mb.epoch_end = self.data_passes.drew(idx)
            if self.ranks is not None:
                self.ranks.drawn.append((self.passes, list(idx)))
        if mb.epoch_end:
            self.position, self.passes = 0, self.passes + 1
        self.end_next = False
        self.mbs[b] = mb
        self.fresh.append(b)
        for t in tensors(batch):
            self.address[t.data_ptr()] = b
            s = t.untyped_storage().data_ptr()
            self.storage[s] = b if self.storage.get(s, b) == b else -1  # -1: batches share one storage
        return b

    def iteration_began(self, loader: Any) -> None:
        """The loop began iterating a DataLoader over verify's dataset (see ``Passes.began``)."""
        if isinstance(self.dataset, Tracked):
            if self.data_passes.batches is not None and self.data_passes.drawn > 0:  # the open pass ends here
                self.position, self.passes = 0, self.passes + 1
            self.data_passes.began(loader)

    def _pass_ended(self, mid_batch: bool) -> None:
        """An IterableDataset ran out: the batch being collated (or the one before) ends the pass."""
        if mid_batch:
            self.end_next = True
        elif self.drawn - 1 in self.mbs:
            self.mbs[self.drawn - 1].epoch_end = True
            self.position, self.passes = 0, self.passes + 1

    def _release(self, ids: list[int]) -> None:
        for b in ids:
            mb = self.mbs.pop(b, None)
            if mb is None:
                continue
            for t in tensors(mb.batch):
                if self.address.get(t.data_ptr()) == b:
                    del self.address[t.data_ptr()]
                s = t.untyped_storage().data_ptr()
                if self.storage.get(s) == b:
                    del self.storage[s]

    def identify(self, args: Any, kwargs: Any) -> list[int] | None:
        """The micro-batches a forward consumed; None when it came from no loader verify knows."""
        ts = list(tensors((args, kwargs)))
        for t in ts:
            b = self.address.get(t.data_ptr(), self.storage.get(t.untyped_storage().data_ptr(), -1))
            if b >= 0:
                return [b]
        key = next((t for t in ts if t.dim()), None)
        if key is None:
            return None
        for b in self.fresh:  # a device copy or a cast of a batch we handed out
            for u in tensors(self.mbs[b].batch):
                if u.shape == key.shape and torch.equal(u.to(key.device, key.dtype), key):
                    return [b]
        rows, taken, total = key.shape[0], [], 0
        for b in self.fresh:  # several micro-batches merged into one forward (the large-batch loop)
            taken.append(b)
            total += self.mbs[b].rows
            if total >= rows:
                break
        if len(taken) > 1 and total == rows:
            return taken
        if isinstance(self.dataset, Tracked) and 0 < rows <= len(self.dataset.pending):
            return [self._from_pending(key, rows)]
        return None

    def _from_pending(self, key: torch.Tensor, rows: int) -> int:
        """The loop's own DataLoader over loader.dataset (its own collate): the items it just drew.
        The oldest reads when the loop drew its batches ahead, the latest when it read the dataset
        for other purposes first; checked by content where the collates agree, else the oldest."""
        dataset = cast(Tracked, self.dataset)  # identify calls this for a map-style dataset only
        pending = dataset.pending
        first, last = pending[:rows], pending[len(pending) - rows :]
        for idx, rest in ((first, pending[rows:]), (last, pending[: len(pending) - rows])):
            batch = self.collate([dataset.dataset[i] for i in idx])
            if any(
                u.shape == key.shape and torch.equal(u.to(key.device, key.dtype), key) for u in tensors(batch)
            ):
                dataset.pending = rest
                return self._register(batch, idx)
        dataset.pending = pending[rows:]
        # a second read gave other tensors (augmentation): the model's input is the one it received
        batch = self.collate([dataset.dataset[i] for i in first])
        return self._register(as_received(batch, key), first)

    # -- hooks ------------------------------------------------------------------------------
    def on_backward(self, p: torch.Tensor) -> None:
        self.backwards += 1
        if self.sites.get("at") != str(self.forwards):  # once per backward: the user's backward call
            self.sites.update(at=str(self.forwards), backward=user_site() or "")
            self.scales.append(self.scale)
        g = p.grad
        # what .grad holds after this backward (touched.py): a factor applied before the step shows as the
        # ratio. Not in a job: its .grad is averaged across ranks after this
        if self.ranks is None and type(g) is torch.Tensor:
            self.prints[id(p)] = self.kept[id(p)] = fingerprint(g, self.kept.get(id(p)))

    def on_forward(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        ids = self.identify(args, kwargs)
        if ids is None:
            self.untracked += 1
            return
        new = [b for b in ids if b not in self.consumed]
        if not new:
            return  # a forward on a micro-batch already used (evaluation, a repeat)
        if not self.window:
            if self.engine is None:
                self.oracle.leaves = self.sync()
                self.oracle.open(self.grads())
            self.mark = self.backwards
        elif self.backwards != self.mark:  # the micro-batches before this one went through backward
            self._close_group()
        if not self.group:  # what this forward differentiates: the oracle's replay of the group follows it
            now = tuple(p.requires_grad for p in self.params)
            self.frozen_changed |= len(self.window) > 0 and now != self.trainable  # inside one window
            self.trainable = now
            self.watch_grads()
        for b in new:
            self.fresh.remove(b)
            self.consumed.add(b)
            self.passes_used.add(self.mbs[b].pass_id)
            self.window.append(b)
            self.group.append(b)
            self.lrs.append((id(self.optimizer), tuple(float(g["lr"]) for g in self.optimizer.param_groups)))
        self.forwards += 1
        self._autocast()

    def inside_forward(self, module: torch.nn.Module, args: Any) -> None:
        # autocast entered inside forward (Accelerate's mixed_precision wraps model.forward) shows only here
        if self.group:
            self._autocast()

    def _autocast(self) -> None:
        for dev in ("cpu", "cuda"):
            if torch.is_autocast_enabled(dev):
                self.how = Replay((dev, torch.get_autocast_dtype(dev)), self.how.scale)

    def _close_group(self, *, last: bool = False, unclip: float = 1.0) -> None:
        if self.engine is not None:  # nothing replayed: the engine has the group's numbers
            self.groups.append((len(self.group), sum(self.mbs[b].rows for b in self.group)))
            window = self.engine.window
            # the run's first group with items, alone in the engine's sum: check it is item_losses' sum
            if not self.checked and len(window) == 1 and not last:
                items = int(sum(c.items for c in window[0].calls))
                if items > 0:
                    self.checked = True
                    try:
                        same_oracle(self.engine, self, items, [self.mbs[b].batch for b in self.group])
                    except Fallback as why:
                        self.give_up(why.reason)
            self.group, self.mark = [], self.backwards
            return
        batches = [self.mbs[b].batch for b in self.group]
        for leaf, on in zip(self.oracle.leaves, self.trainable):
            leaf.requires_grad_(on)  # as the loop's forward of these micro-batches had it
        self.oracle.close_group(
            self.grads(), batches, Replay(self.how.autocast, self.scale), unclip=unclip, last=last
        )
        self.group, self.mark = [], self.backwards

    def on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        self.live()  # outside a forward: FSDP2's sharded parameters, which a loop's own optimizer holds
        if not any(id(p) in self.param_ids for g in optimizer.param_groups for p in g["params"]):
            return None  # another model's optimizer (a GAN's other half)
        self.optimizer = optimizer  # the loop may have built its own; read learning rates from it
        self.sites["step"] = user_site() or ""
        return capture_at_step(args, kwargs, lambda: self.capture(optimizer))

    # -- the step ---------------------------------------------------------------------------
    def capture(self, optimizer: torch.optim.Optimizer) -> None:
        m = len(self.window)
        numbers = StepNumbers(m, current_lr(optimizer), untracked=self.untracked)
        if m == 0:
            if self.engine is not None and self.engine.window:
                self.give_up(f"step {len(self.steps)}: a backward of data verify did not hand out")
            # the other ranks' windows may hold items: this rank joins the exchange, adding nothing to it
            if self.ranks is not None:
                self.ranks.step(numbers, [None] * len(self.params), self.params, self.grads(), self.params)
            self.finish_step(numbers)
            return
        complete = [c for c in self.clips if c.seen >= m]
        numbers.unclip = math.prod(clipped(c.total_norm, c.max_norm) for c in complete)
        self._close_group(last=True, unclip=numbers.unclip)
        last = self.mbs[self.window[-1]]
        numbers.epoch_end, numbers.pass_length = last.epoch_end, last.position
        numbers.lrs = [lrs for opt, lrs in self.lrs if opt == id(optimizer)]
        numbers.frozen_changed = self.frozen_changed
        r = rescale(self.params, self.prints) if self.ranks is None else math.nan
        numbers.rescaled, numbers.grad_hooks = unexplained(r, numbers.unclip, self.scale), hooked(self.params)
        numbers.scales = list(self.scales)
        if self.engine is not None:  # judged in place: the loop's own backward is the oracle
            try:
                take(numbers, self.engine, optimizer, self)
                if not self.checked:  # no group was checked alone (one group per window): the whole window
                    same_oracle(self.engine, self, numbers.items, [self.mbs[b].batch for b in self.window])
                    self.checked = True
            except Fallback as why:
                self.give_up(why.reason)
            if self.ranks is not None:  # this rank's figures become the job's, as the replayed ones do
                sums = [self.engine.sum_of(p) for p in self.params]
                job = self.ranks.step(numbers, sums, self.params, self.grads(), self.params)
                numbers.weights, numbers.leak_coef = [], 0.0  # fitted to this rank's share: not the job's
                if job:
                    against_sums(numbers, self.grads(), job)
            self.finish_step(numbers)
            return
        o = self.oracle
        numbers.items, numbers.sequences, numbers.loss_sum, numbers.fits = (
            o.items,
            o.sequences,
            o.loss_sum,
            list(o.fits),
        )
        numbers.leak, numbers.finite = o.leak, o.finite
        grads = self.grads()
        if self.ranks is not None:
            job = self.ranks.step(numbers, o.O(), o.leaves, grads, self.params)
            if job is None:
                self.finish_step(numbers)  # another rank's run had ended: nothing to judge this step against
                return
            o.items, o.finite = numbers.items, numbers.finite  # the job's
            for leaf, t in zip(o.leaves, job):
                leaf.grad = t
        if o.finite and o.items > 0:
            measure(
                numbers,
                o,
                grads,
                batches=[self.mbs[b].batch for b in self.window],
                autocast=self.how.autocast,
                batchnorm=any(isinstance(mod, BN_TYPES) and mod.training for mod in self.net.modules()),
                job=self.ranks is not None,
                merged=lambda: self._merged(self.window),
            )
        self.finish_step(numbers)

    def _merged(self, ids: list[int]) -> Any:
        """The window as one large batch: re-collated from its items when known (padding as a k*B
        DataLoader would pad), else the micro-batches concatenated."""
        if all(self.mbs[b].indices is not None for b in ids) and isinstance(self.dataset, Tracked):
            return self.collate([self.dataset.dataset[i] for b in ids for i in self.mbs[b].indices])  # type: ignore[union-attr]  # checked: none is None
        return cat_batches([self.mbs[b].batch for b in ids])

    def finish_step(self, numbers: StepNumbers) -> None:
        numbers.lr_changed = numbers.lr_changed or self.lr_changed
        numbers.sites = {k: v for k, v in self.sites.items() if v and k != "at" and v != self.caller}
        numbers.clips = [replace(c, site=None) if c.site == self.caller else c for c in self.clips]
        self.steps.append(numbers)
        for b in self.window:
            self.used_indices.update(self.mbs[b].indices or ())
        self._release(self.window)
        self.window, self.group, self.lrs, self.clips, self.groups, self.scales = [], [], [], [], [], []
        self.prints.clear()
        self.sites.clear()
        self.how, self.lr_changed, self.untracked, self.frozen_changed = Replay(), False, 0, False
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            raise StopRun


__all__ = ["BN_TYPES", "Recorder"]
