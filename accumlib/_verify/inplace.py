"""The in-place engine: judge a run from its own backward passes, with no copy, replay or re-read.

``accumlib run`` and ``accumlib.watch`` observe a script as it is: its model, optimizer and data are
never handed to verify. What a step needs comes from the run's own graph. Let micro-batch j's loss
call (``losscalls.py``) return L_j over n_j items, and let the script backward a root R_j. A prehook on
L_j's node reads u_j = dR_j/dL_j (one number) before any gradient reaches a parameter; by the chain
rule, when R_j reaches the parameters through L_j alone (a graph walk from R_j checks it), the
gradient the backward deposits is

    g_j = u_j grad L_j = (u_j / m_j) s_j,    s_j = grad sum_{i in j} l_i,  m_j = n_j (mean) or 1 (sum)

so a hook on each parameter, which sees g_j before it is accumulated, adds (m_j / u_j) g_j into one
buffer O. At the step, with N = sum_j n_j, O / N is the true large-batch gradient of the window,
g* = grad (1/N) sum_i l_i, computed from the very graphs the run built (its dropout masks, its
autocast, its data as the model received it), and G, what the optimizer holds, is compared with it
in float64 (``measure.dist``). Each micro-batch's weight is exact too: w_j = N u_j / (m_j S) times
the factors .grad was multiplied by since (S: GradScaler's scale), where the copying engine fits
them. Buffers: O, one per trainable parameter of the stepping optimizer, views of one block made at
the first deposit (1x the parameters' bytes; a window's first deposit writes it, so it is never zeroed
first); the rest is a few numbers per micro-batch. What this cannot see is said: a backward that
reaches the parameters other than through a loss call it knows, two loss terms, BatchNorm's
per-micro-batch statistics.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .clips import share
from .errors import StopRun
from .gradhooks import existing
from .inplace_job import measure_job, sharded, world
from .losscalls import LossCall, own_reduction
from .measure import against_sums
from .patches import capture_at_step, current_lr, lrs
from .sites import user_site
from .step_numbers import Clip, StepNumbers
from .touched import PRINT, checksum, differ, factors, head, hooked, prints, unexplained
from .window_oracle import Fit, clipped

LOW = (torch.float16, torch.bfloat16)
# u_j of two loss calls judged as one micro-batch must agree to float32 rounding of a division
SAME_U = 1e-6


@dataclass
class Backward:
    """One backward of the window: the loss calls it reached and what it deposited, as numbers."""

    site: str
    calls: list[LossCall] = field(default_factory=list)
    ratios: list[torch.Tensor] = field(default_factory=list)  # m / u per call, 0-dim, on the device
    spread: list[torch.Tensor] = field(default_factory=list)  # reduction "none": unequal upstream
    # what .grad was multiplied by since the previous backward: a float, or the fingerprints (before,
    # now; now None: every .grad set to None) that say it, read at the step in one sync (``factors``)
    beta: Any = 1.0
    scale: float = 1.0  # GradScaler's scale when it ran
    lrs: dict[int, tuple[float, ...]] = field(default_factory=dict)
    reached: frozenset[int] = frozenset()  # the parameters it deposited into
    frozen: frozenset[int] = frozenset()  # the optimizers' parameters with requires_grad off as it ran
    # the fingerprint of .grad after it, on the device, whose |.|^2 the step reads (``capture``): equal on
    # every rank of a job exactly where a sync ran. Kept as it is: a tensor made right after a backward takes
    # a block freed amid the backward's own and pins the allocator's hole below it for the window
    norm2: Any = math.nan


@dataclass
class InPlace:
    """Everything the run's hooks write; ``steps`` and ``problems`` are what the judge stage reads."""

    max_steps: int | None = None
    # every optimizer seen, in the order seen (a set's order follows ids: the ranks of a job differ in them)
    optimizers: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)
    params: dict[int, torch.Tensor] = field(default_factory=dict)  # every optimizer's parameters
    handles: list[Any] = field(default_factory=list)
    sums: dict[int, torch.Tensor] = field(default_factory=dict)  # O, per parameter (read through ``sum_of``)
    stale: set[int] = field(default_factory=set)  # the sums no backward of the open window has written yet
    pending: dict[int, LossCall] = field(default_factory=dict)  # id(node) -> call, not yet backwarded
    window: list[Backward] = field(default_factory=list)
    # .grad fingerprints after the last backward: which parameters, and their first entries in one tensor
    after: tuple[list[int], torch.Tensor | None] = ([], None)
    leak: bool = False
    opened: dict[int, torch.Tensor] = field(default_factory=dict)  # .grad fingerprints as the window opened
    # the parameters' checksums as the window opened: at its first loss call where its first backward reaches
    # that call (``_hold``), else at that backward; for the window the step numbered ``held_for`` closes
    held: dict[int, torch.Tensor] = field(default_factory=dict)
    held_for: int = -1
    held_call: int = 0  # id of the loss call's node they were taken at (0: at a backward)
    reached: set[int] = field(default_factory=set)  # parameters the last backward deposited into
    ratio: torch.Tensor | None = None  # m / u of the backward running now
    steps: list[StepNumbers] = field(default_factory=list)
    stepping: dict[int, str] = field(default_factory=dict)  # id(optimizer) -> where it was built or stepped
    problems: dict[str, list[str]] = field(default_factory=dict)  # code -> sites: what could not be judged
    unjudged: dict[int, list[str]] = field(default_factory=dict)  # step -> the codes that kept it unjudged
    blind: list[str] = field(default_factory=list)  # the open window's codes
    clips: list[Clip] = field(default_factory=list)
    scale: float = 1.0
    lr_changed: bool = False
    sites: dict[str, str] = field(default_factory=dict)
    batchnorm: bool = False
    grad_hooks: list[str] = field(default_factory=list)  # gradient hooks seen (``gradhooks.py``), file:line
    model: str = ""  # the module class whose parameters were stepped (for the report)
    inside: list[int] = field(default_factory=lambda: [0])  # item_losses calls open (``itemlosses.py``)
    item_label: str = ""  # the item_losses function, as the user named it
    item_calls: int = 0  # item_losses calls seen
    terms: int = 0  # the most loss terms one backward added (several-losses)
    # several optimizers (a GAN's two halves, two parameter groups): who steps each parameter, and the
    # window the last step closed, for an optimizer that steps right after another over the same backwards
    owner: dict[int, int] = field(default_factory=dict)
    holders: dict[int, set[int]] = field(default_factory=dict)  # parameter -> the optimizers holding it
    last: dict[str, Any] = field(default_factory=dict)
    stepping_now: int = 0  # the optimizer whose step is being captured
    paused: bool = False  # verify's own replay runs (``inplace_verify.py``): nothing of it is the run's
    # verify's recorder, told of each backward (True: its window's first) once the engine has read it
    before_backward: Any = None
    # a job's figures: the engine's own exchange (``inplace_job.py``, ``accumlib run``), or False where
    # verify's exchange stage makes them the job's (``ranks.py``, ``verify(..., ranks="all")``)
    exchange: bool = True

    def __deepcopy__(self, memo: dict[int, Any]) -> InPlace:
        # one engine per run: a loop that deep-copies its model (hooks, and through them verify's recorder,
        # included) must not copy the run's graph nodes, which cannot be copied
        return self

    @property
    def param_ids(self) -> set[int]:  # the patches' test for "this run's parameters" (patches.py)
        return set(self.params)

    # -- record ------------------------------------------------------------------------------
    def saw_optimizer(self, opt: torch.optim.Optimizer) -> None:
        if self.optimizers.get(id(opt)) is not opt:
            self.optimizers[id(opt)] = opt

    def saw_loss(self, call: LossCall) -> None:
        if (
            not self.inside[0] and not self.paused
        ):  # inside the user's item_losses, a standard loss call is one of its terms
            self.pending[id(call.node)] = call
            self._hold(id(call.node))

    def saw_item_loss(self, call: LossCall) -> None:
        self.item_calls += 1
        self.pending[id(call.node)] = call
        self._hold(id(call.node))

    def _hold(self, node: int) -> None:
        """The parameters' checksums at the first loss call since the last step, before its backward: an
        edit between a window's first forward and its first backward moves what that backward reads too."""
        if self.window or self.paused or self.held_for == len(self.steps):
            return
        if _compiling():  # a loss call traced inside a compiled function: its window opens at its backward
            return
        self._hook_params()
        plain = {k: p for k, p in self.params.items() if type(p.data) is torch.Tensor}  # a DTensor's: not
        self.held, self.held_for, self.held_call = (
            dict(zip(plain, checksum(list(plain.values())))),
            len(self.steps),
            node,
        )

    def saw_hook(self, site: str) -> None:
        if site not in self.grad_hooks:
            self.grad_hooks.append(site)

    def problem(self, code: str, site: str) -> None:
        if code not in self.blind:
            self.blind.append(code)
        sites = self.problems.setdefault(code, [])
        if site and site not in sites:
            sites.append(site)

    def _hook_params(self) -> None:
        for opt in list(self.optimizers.values()):
            for p in _params(opt):
                if id(p) not in self.params and p.requires_grad:
                    self.params[id(p)] = p
                    self.handles.append(p.register_hook(self._deposit(p)))
                self.holders.setdefault(id(p), set()).add(id(opt))

    def _allocate(self, p: torch.Tensor) -> None:
        """O for the parameters of the optimizer holding ``p``, at the first deposit into any of them: one
        block per device and dtype, split into views (one all-reduce sums a job's, ``ranks.one_block``;
        one allocation, not one per tensor amid a backward's own). Another model's optimizer, alive in
        the same process but never reached by a watched backward, gets none."""
        held = self.holders.get(id(p), set())
        opt = next((o for o in self.optimizers.values() if id(o) in held), None)
        if opt is None:  # its optimizer is gone: the deposit makes this parameter's O alone
            return
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for q in _params(opt):
            # a DTensor's O is made as its deposits come
            if id(q) in self.params and type(q.data) is torch.Tensor and id(q) not in self.sums:
                dtype = torch.float32 if q.dtype in LOW else q.dtype
                groups.setdefault((q.device, dtype), []).append(q)
        for (device, dtype), qs in groups.items():
            block = torch.empty(sum(q.numel() for q in qs), dtype=dtype, device=device)
            for q, view in zip(qs, block.split([q.numel() for q in qs])):
                self.sums[id(q)] = view.view(q.shape)
                self.stale.add(id(q))

    def _owners(self, b: Backward) -> frozenset[int]:
        """The optimizers holding a parameter this backward reached: whose loss it was, as the run shows."""
        return frozenset(o for k in b.reached for o in self.holders.get(k, ()))

    def _deposit(self, p: torch.Tensor) -> Any:
        key = id(p)

        def seen(g: torch.Tensor) -> None:
            if self.ratio is None:
                return None  # not a backward this engine watches (torch.autograd.grad, an evaluation)
            buf = self.sums.get(key)
            if buf is None:
                self._allocate(p)
                buf = self.sums.get(key)
            if buf is None or buf.shape != g.shape or buf.device != g.device:
                buf = self.sums[key] = torch.empty_like(g, dtype=torch.float32 if g.dtype in LOW else g.dtype)
                self.stale.add(key)
            if g.dtype != buf.dtype:
                g = g.to(buf.dtype)
            if key in self.stale:  # the window's first deposit: O = r g, one kernel, no zeroing pass first
                torch.mul(g, self.ratio, out=buf)
                self.stale.discard(key)
            else:
                buf.addcmul_(g, self.ratio)  # one kernel, no temporary
            self.reached.add(key)
            return None  # the run's gradient is left as it is

        return seen

    def sum_of(self, p: torch.Tensor) -> torch.Tensor | None:
        """O for parameter ``p`` in the open window: None where no backward of this run reached it."""
        buf = self.sums.get(id(p))
        if buf is not None and id(p) in self.stale:  # a buffer from an earlier window, unreached in this one
            buf.zero_()
            self.stale.discard(id(p))
        return buf

    def _walk(self, roots: list[torch.Tensor]) -> tuple[list[LossCall], bool, bool]:
        """The loss calls each root reaches, whether it reaches a watched parameter other than through
        one of them (a regulariser, a loss verify does not know), and whether through a torch.compile'd
        function (AOTAutograd's one node for its whole backward: the loss calls inside it never ran)."""
        seen, found, stray, compiled = set(), [], False, False
        todo = [r.grad_fn for r in roots if r.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            call = self.pending.get(id(node))
            if call is not None and call.node is node:
                found.append(call)
                continue  # what lies beyond a loss call is its own gradient
            var = getattr(node, "variable", None)
            if var is not None and id(var) in self.params:
                stray = True
            compiled = compiled or type(node).__name__ == "CompiledFunctionBackward"
            todo.extend(n for n, _ in node.next_functions)
        return found, stray, compiled

    def _own(
        self, roots: list[torch.Tensor], calls: list[LossCall], stray: bool, site: str
    ) -> tuple[list[LossCall], bool, str]:
        """A root that is the script's own mean or sum over per-item values (``losscalls.own_reduction``) is
        the backward's one loss call, in place of the reduction="none" call it reduces; or why its values are
        not per item (said as unseen-loss). Tried only where the backward goes unjudged otherwise, or may:
        parameters reached through no loss call, or through one reduction="none" call alone."""
        alone = len(calls) == 1 and calls[0].reduction == "none" and not stray
        if len(roots) != 1 or not (alone or (stray and not calls)):
            return calls, stray, ""
        own = own_reduction(roots[0], calls, site)
        if not isinstance(own, LossCall):
            return calls, stray, own or ""
        for c in calls:  # the none call is the reduction's term now
            self.pending.pop(id(c.node), None)
            if self.held_call == id(c.node):  # the window's checksums were taken at it (``_hold``)
                self.held_call = id(own.node)
        return [own], False, ""

    def backward(self, original: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if self.paused:
            return original(tensors, *args, **kwargs)
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        self._hook_params()
        calls, stray, compiled = self._walk(roots)
        if not calls and not stray:
            return original(tensors, *args, **kwargs)  # no watched parameter is reached
        site = user_site() or ""
        calls, stray, refused = self._own(roots, calls, stray, site)
        here = Backward(site, calls, scale=self.scale)
        here.lrs = {id(o): lrs(o) for o in list(self.optimizers.values())}
        here.frozen = frozenset(
            id(p) for o in list(self.optimizers.values()) for p in _params(o) if not p.requires_grad
        )
        self.sites["backward"] = here.site
        terms = sorted({f"{c.kind} at {c.site}" for c in calls})
        if stray and terms:  # a regulariser, an auxiliary term: added to the loss, not a loss call
            terms.append(f"a term of the script's own in the loss backwarded at {here.site}")
        if refused:  # the script's own reduction, over values that are not per item
            self.problem("unseen-loss", f"{here.site} ({refused})")
        elif not calls:  # a loss computed inside a compiled function: named, as what accumlib cannot see
            self.problem("compiled-loss" if compiled else "unseen-loss", here.site)
        elif len(terms) > 1:
            self.terms = max(self.terms, len(terms))
            self.problem("several-losses", " and ".join(terms))
        # verify's recorder may take the run over here, on its recompute oracle (``inplace_verify.py``)
        if self.before_backward is not None and self.before_backward(not self.window):
            return original(tensors, *args, **kwargs)
        self._open(here)
        handles = [c.node.register_prehook(self._upstream(c, here)) for c in calls]
        handles += [c.counter.register_prehook(c.counted) for c in calls if c.counter is not None]
        self.ratio = torch.zeros(())  # nothing reached the parameters yet; each call's prehook sets it
        try:
            return original(tensors, *args, **kwargs)
        finally:
            self.ratio = None
            for h in handles:
                h.remove()
            for c in calls:
                self.pending.pop(id(c.node), None)
                # the graph is spent: a node kept past its backward keeps every node of it (small blocks
                # made amid the forward's activations, which then pin the allocator's holes)
                c.node = c.counter = None
            here.reached = frozenset(self.reached)
            self.window.append(here)
            # only what this backward reached: another model's optimizer (alive in a notebook) is not ours
            # in the optimizers' order, not a set's: every rank of a job sums the same entries alike
            self.after = prints({k: p for k, p in self.params.items() if k in self.reached})
            if self.after[1] is not None:
                here.norm2 = self.after[1]
            self.reached = set()

    def _open(self, here: Backward) -> None:
        """Before the backward: a window begins (O = 0; .grad should hold nothing), or what happened
        to .grad since the previous backward (zeroed, rescaled) is read off its fingerprints."""
        if not self.window:
            self.last = {}  # a backward since the last step: no optimizer steps over that window again
            self.stale = set(self.sums)  # O = 0: each buffer is overwritten by its first deposit (``sum_of``)
            # read at the step, for the stepping optimizer's parameters alone (no sync here)
            keys, heads = prints(self.params)  # one copy for every parameter's fingerprint, split into views
            sizes = [min(PRINT, self.params[k].numel()) for k in keys]
            self.opened = dict(zip(keys, heads.split(sizes))) if heads is not None else {}
            # the parameters every micro-batch of the window must see (a .data edit moves no version counter),
            # as its first loss call saw them where this backward is that call's (not an evaluation's first)
            if self.held_for != len(self.steps) or self.held_call not in {id(c.node) for c in here.calls}:
                self.held, self.held_for, self.held_call = {}, len(self.steps), 0
            plain = {
                k: p for k, p in self.params.items() if k not in self.held and type(p.data) is torch.Tensor
            }
            self.held.update(zip(plain, checksum(list(plain.values()))))
            return
        here.beta = self._prints_now()

    def _prints_now(self, only: set[int] | None = None) -> Any:
        """What .grad holds now against the last backward's fingerprints, kept on the device (no sync
        between backwards): 1.0 where nothing was fingerprinted, nan where only some .grad became None,
        else (before, now), ``now`` None where every .grad is None; ``factors`` reads them at the step.
        ``only``: these parameters' (the stepping optimizer's), at the step, where the parameters are
        checked against the window's opening too (one sync, the GPU's queue about to drain for ``factors``).
        """
        if only is not None and self.window:
            self._moved(only)
        keys, before = self.after
        if before is None:
            return 1.0
        if only is not None:
            at, n = [], 0
            for k in keys:
                size = min(PRINT, self.params[k].numel())
                if k in only:
                    at.append((k, n, size))
                n += size
            if not at:
                return 1.0
            keys = [k for k, _, _ in at]
            before = torch.cat([before[i : i + size] for _, i, size in at])
        grads = [self.params[k].grad for k in keys]
        if all(g is None for g in grads):
            return (before, None)
        if any(g is None for g in grads):
            return math.nan
        return (before, torch.cat([head(g) for g in grads]))  # type: ignore[arg-type]

    def _moved(self, only: set[int]) -> None:
        """Parameters of ``only`` changed since the window opened (``held``): the micro-batches' gradients
        were taken at different points, and O, the deposits' sum, followed them (a limit, said by name).
        An edit after the last backward reads the same: which side of it the backwards were is not known.
        A parameter another optimizer already stepped over this window moved by that step (two optimizers
        holding it: ``several-optimizers`` says so)."""
        stepped = self.last.get("stepped", set()) if self.last.get("window") is self.window else set()
        keys = [k for k in self.held if k in only and not self.holders.get(k, set()) & stepped]
        if not keys:
            return
        moved = differ([self.held[k] for k in keys], checksum([self.params[k] for k in keys]))
        if any(moved):
            first, step = self.window[0].site or "?", self.sites.get("step") or "?"
            self.problem(
                "params-changed-inside-window",
                f"{sum(moved)} of {len(keys)} parameters, in the window of the backward at {first}, before "
                f"the step at {step}",
            )

    def _upstream(self, call: LossCall, here: Backward) -> Any:
        def seen(grad_outputs: tuple[torch.Tensor, ...]) -> None:
            u = grad_outputs[call.index].detach()
            if call.counter is not None:  # the script's own reduction (``own_reduction``): its items' losses
                u = u * call.sign  # are v_i with the sign the root gave them, and the root was u times their
                call.value = call.value / u.reshape(())  # reduction (a mean or a sum of them)
            if call.reduction == "none":  # the script's own reduction: equal weights on the items kept
                keep = u != 0
                call.items = keep.sum()
                mean = u.sum() / call.items.clamp(min=1)
                here.spread.append(((u - mean) * keep).abs().max() / mean.abs().clamp(min=1e-30))
                r = 1.0 / mean
            elif call.reduction == "mean":
                r = (call.items if call.m is None else call.m) / u.reshape(())
            else:
                r = 1.0 / u.reshape(())
            here.ratios.append(r)
            if len(here.ratios) == 1:  # several calls in one backward are judged only if their ratios agree
                self.ratio = r.to(torch.float32)
            return None

        return seen

    def on_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        self.saw_optimizer(opt)
        return capture_at_step(args, kwargs, lambda: self.capture(opt))

    # -- compute -----------------------------------------------------------------------------
    def capture(self, opt: torch.optim.Optimizer) -> None:
        self._hook_params()
        ps = [p for p in _params(opt) if id(p) in self.params]
        if not ps:
            return  # an optimizer with nothing to train
        self.stepping.setdefault(id(opt), f"{type(opt).__name__} stepped at {user_site() or '?'}")
        self.stepping_now = id(opt)
        shared = [p for p in ps if self.owner.setdefault(id(p), id(opt)) != id(opt)]
        if shared:  # one parameter, two optimizers: which step's gradient is which is not ours to say
            self.problem("several-optimizers", f"{len(shared)} parameters held by two optimizers")
        stepped_over = self.last.get("stepped", set())
        if not self.window and self.last and id(opt) not in stepped_over:  # another optimizer, same backwards
            self.window, self.clips = self.last["window"], self.last["clips"]
            self.lr_changed, self.opened = self.last["lr_changed"], self.last["opened"]
            self.sites = dict(self.last["sites"])
        own = {id(p) for p in ps}
        # every backward of the window reached this optimizer's parameters, and the same optimizers' (a GAN's
        # generator loss, which reaches the discriminator too, never in the discriminator's window)
        owners = {self._owners(b) for b in self.window}
        if len(owners) > 1 or any(id(opt) not in o for o in owners):
            self.problem("several-optimizers", self.stepping[id(opt)])
        self.sites["step"] = user_site() or ""
        job = world() > 1
        if job and sharded(ps):  # FSDP2: each rank holds a shard of G and of O
            self.problem("multi-rank", f"world size {world()}, sharded parameters")
        # a hook on a gradient inside the graph changes G and the engine's sum alike: never judged through
        hooks = hooked(ps)
        for at in [*self.grad_hooks, *existing(), *hooks]:
            self.problem("grad-hook", at)
        w = self.window
        betas = factors([b.beta for b in w] + [self._prints_now(own)])  # one sync for the window
        for b, beta in zip(w, betas):
            b.beta = beta
        if not w:  # a gradient no watched backward made (torch.autograd.grad, assigned to .grad)
            self.problem("unseen-loss", self.sites["step"])
        numbers = StepNumbers(len(w), current_lr(opt), lr_changed=self.lr_changed, sites=dict(self.sites))
        numbers.optimizer = self.stepping[id(opt)]
        numbers.own_items = True
        if not w and not job:
            return self.finish(numbers)
        numbers.lrs = [b.lrs[id(opt)] for b in w if id(opt) in b.lrs]  # none before the optimizer was known
        # requires_grad changed inside the window, for any of this optimizer's parameters (frozen ones too)
        numbers.frozen_changed = len({b.frozen & {id(p) for p in _params(opt)} for b in w}) > 1
        # every backward's m / u and |.grad|^2, read in one sync
        sq = [b.norm2.double().square().sum() if isinstance(b.norm2, torch.Tensor) else b.norm2 for b in w]
        read = _read([*(r.double() for b in w for r in b.ratios), *sq])
        ratios, at = [], 0
        for b in w:
            ratios.append(read[at : at + len(b.ratios)] if b.ratios else None)
            at += len(b.ratios)
        norms = read[at:]
        items = [int(sum(c.items for c in b.calls)) for b in w]
        numbers.items = sum(items)
        numbers.sequences = sum(c.sequences for b in w for c in b.calls)
        numbers.loss_sum = float(sum(c.loss_sum() for b in w for c in b.calls))
        spread = [float(s) for b in w for s in b.spread]
        for r in ratios:
            if r is not None and len(r) > 1 and _apart(r):
                self.problem("unseen-loss", self.sites["backward"])
        if any(s > SAME_U for s in spread):
            self.problem("unseen-loss", self.sites["backward"])
        fits = []
        for b, r, n, norm2 in zip(w, ratios, items, norms):
            # u_j / m_j, GradScaler's scale at this backward included: what one item's loss gradient was
            # multiplied by as it reached .grad (the unscale that divides it out comes at the step)
            a = 1.0 / r[0] if r is not None and r[0] != 0 else math.nan
            exact = math.isfinite(b.beta) and math.isfinite(a)
            rows = sum(c.sequences for c in b.calls)  # a causal LM's sequences: the shift rule reads them
            fits.append(Fit(len(b.calls), n, rows, a, b.beta, 0.0 if exact else math.nan, norm2))
        numbers.fits = fits
        numbers.scales = [b.scale for b in w]
        numbers.clips, whose = share(self.clips, ps, own)
        if not whose:  # which clip scaled which part by how much is not one coefficient
            self.problem("several-optimizers", "a clip over two optimizers' parameters, and another clip")
        complete = [c for c in numbers.clips if c.seen >= len(w)]
        numbers.unclip = math.prod(clipped(c.total_norm, c.max_norm) for c in complete)
        # ONE convention for a weight, the copying engine's: everything .grad took between the backward and
        # the step but a clip (which verify undoes and judges apart), the unscale and a p.grad.mul_ included.
        # Where .grad changed after the last backward by no single factor, the unscale alone is assumed and
        # the measurement says the rest (``diagnose._one_factor_measured``)
        after = betas[-1] / numbers.unclip if math.isfinite(betas[-1]) else 1.0 / self.scale
        tail, numbers.weights = after, [0.0] * len(fits)
        for j in range(len(fits) - 1, -1, -1):  # w_j = N a_j prod_{l>j} beta_l (``WindowOracle.weights``)
            numbers.weights[j] = numbers.items * fits[j].a * tail
            tail *= fits[j].beta
        mine = [self.opened[id(p)] for p in ps if id(p) in self.opened]
        self.leak = (
            bool(torch.cat(mine).any()) if mine else False
        )  # .grad held something as the window opened
        numbers.leak, numbers.leak_coef = self.leak, tail
        numbers.finite = all(math.isfinite(f.a) for f in fits)
        numbers.rescaled = unexplained(betas[-1], numbers.unclip, self.scale)
        numbers.grad_hooks = hooks
        numbers.batchnorm = self.batchnorm
        if job and not self.exchange:
            pass  # verify's exchange stage makes this rank's figures the job's, then measures (``record.py``)
        elif job and not sharded(ps):  # every rank, at the same step: the job's window
            measure_job(numbers, ps, [self.sum_of(p) for p in ps])
        elif numbers.items > 0 and numbers.finite:
            against_sums(numbers, [p.grad for p in ps], [self.sum_of(p) for p in ps])
        self.finish(numbers)

    def finish(self, numbers: StepNumbers) -> None:
        if self.blind:  # its figures mean nothing: no verdict is drawn from them
            self.unjudged[len(self.steps)], self.blind = self.blind, []
        self.steps.append(numbers)
        again = self.last.get("stepped", set()) if self.last and self.last["window"] is self.window else set()
        self.last = {
            "stepped": again | {self.stepping_now},
            "window": self.window,
            "clips": self.clips,
            "lr_changed": self.lr_changed,
            "opened": self.opened,
            "sites": self.sites,
        }
        self.window, self.clips, self.lr_changed, self.leak = [], [], False, False
        self.sites, self.pending = {}, {}  # a loss call no backward reached by the step was not trained on
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            raise StopRun

    finish_step = finish  # the GradScaler patch closes a skipped window through this name (patches.py)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _apart(r: list[float]) -> bool:
    """The loss calls of one backward weigh their items unequally: max |r_i - r_0| / |r_0| > SAME_U (nan: not
    read as apart, as a nan never compares greater)."""
    d = max(abs(x - r[0]) for x in r)
    return d > SAME_U * abs(r[0]) if r[0] != 0 else d > 0


def _compiling() -> bool:
    """Inside torch.compile's tracing (its fake tensors have no bits to sum); a torch without the public
    name compiles nothing here."""
    check = getattr(torch.compiler, "is_compiling", None)
    return bool(check is not None and check())


def _read(values: list[Any]) -> list[float]:
    """Numbers kept on the device, read in one sync (a float stays as it is)."""
    on = [v for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(on).tolist() if on else [])
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


__all__ = ["Backward", "InPlace"]
