"""The exchange stage of a multi-rank job: what flows between ranks at each optimizer step, so that
every rank judges the whole job against one oracle (``verify(..., ranks="all")``).

Each rank r runs the user's loop on its own shard; its window holds N_r items, and the oracle stage
leaves O_r = sum_{i in window_r} grad l_i at the window's starting parameters. The job's true
gradient is what one process would compute on the union of the ranks' windows:

    g* = (sum_r O_r) / N,    N = sum_r N_r.

Under DDP every rank's ``.grad`` after the window's synchronized backward is the mean of the ranks'
own; a correct loop makes it g*. Two bugs have exact predictions of their own:
    each rank divided by its own count:  G = c H,  H = (1/R) sum_r O_r / N_r   (``per-rank-mean``)
    the gradient never synchronized:     G_r differs between ranks              (``ranks-diverged``)

What flows at each step (R ranks, P parameters):
  - a few numbers per rank, gathered: items, loss sum, finiteness, the window's dataset indices,
    and |.grad|^2 at each micro-batch boundary (equal on every rank exactly where a sync ran);
  - sum_r O_r / N_r, all-reduced, only when the ranks' counts differ (equal counts make H = g*);
  - sum_r O_r, all-reduced into the oracle's own sums (the recompute oracle's .grad of its shadow, or
    the in-place engine's buffers: a rank may judge in place while another replays);
  - rank 0's G, then rank 0's parameters, broadcast and compared on every rank, only where the gathered
    round shows some rank's G or parameters differ from rank 0's (a few sums of each, ``_checksums``).
At most 4 P floats per rank per step. Judged in place, each rank's O_r is one block (``InPlace._allocate``)
and, where every rank lays it out alike (the order travels in the gathered round), the all-reduce sums
the blocks where they lie; otherwise, and for H and the broadcasts, through one P-sized float32 buffer:
the only memory a job adds.

Every collective runs inside the optimizer-step hook, where every rank of a well-formed job is at
the same time. A gathered round comes first and says whether every rank is still stepping: a rank
whose loop has ended answers ``None`` until all have, so ranks that step a different number of
times end with ``uneven-steps``, never in a deadlock. The same round carries each rank's reason, if
any, why its in-place engine cannot vouch for its run (``inplace_verify.py``): every rank then raises
``Fallback`` at once, and verify runs the job again on the recompute oracle, every rank together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast, overload

import torch

from .errors import Fallback
from .window_oracle import Vec, gram

if TYPE_CHECKING:
    from .step_numbers import StepNumbers

_CHUNK = 1 << 16  # elements per float64 chunk in Ranks._spread (512 KiB)


def _dist() -> Any:
    import torch.distributed as dist  # only a multi-rank run gets here

    return dist


def in_group() -> tuple[int, int] | None:
    """(rank, world size) of the process group this process is in, or None (imports no torch.distributed)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


@overload
def full(t: torch.Tensor) -> torch.Tensor: ...
@overload
def full(t: None) -> None: ...
def full(t: torch.Tensor | None) -> torch.Tensor | None:
    """The whole tensor of a DTensor (FSDP2 shards parameters and gradients: an all-gather every rank
    joins, one tensor at a time); any other tensor as it is."""
    if t is not None and hasattr(t, "full_tensor"):
        return cast(torch.Tensor, t.full_tensor())
    return t


def sharded(net: torch.nn.Module) -> bool:
    """True when FSDP2's ``fully_shard`` manages the model: its parameters are gathered for each forward
    and freed after it, so the oracle's shadow must hold copies, not share their storage."""
    import sys

    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in net.modules())


@dataclass
class Ranks:
    """One rank's side of the exchange; every rank holds one and calls it at the same points."""

    rank: int
    world: int
    group: Any  # gloo, for the gathered numbers (the default group may be NCCL)
    buffer: torch.Tensor | None = None  # the one P-sized float32 buffer (none where O is summed in place)
    fallback: str = ""  # why this rank's in-place engine cannot vouch for its run (said at the next exchange)
    # (pass, dataset indices) of each micro-batch drawn
    drawn: list[tuple[int, list[int]]] = field(default_factory=list)

    @classmethod
    def join(cls, net: torch.nn.Module) -> Ranks:
        """Every rank at once, before the loop runs: the exchange assumes data parallelism, every rank
        holding the same model; pipeline or tensor parallelism (a rank holding part of it) is refused."""
        dist = _dist()
        group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        me = cls(dist.get_rank(), dist.get_world_size(), group)
        shapes = [(name, tuple(p.shape)) for name, p in net.named_parameters()]
        every = me.gather(shapes)
        other = next((r for r, s in enumerate(every) if s != shapes), None)
        if other is not None:
            differ = next((a, b) for a, b in zip(shapes + [None], every[other] + [None]) if a != b)
            raise ValueError(
                "ranks='all' judges data-parallel jobs, where every rank holds the same model: rank "
                f"{me.rank} and rank "
                f"{other} hold different parameters ({differ[0]} against {differ[1]}). Pipeline and tensor "
                "parallel groups "
                "are not supported; wrap the whole model in DDP or fully_shard on every rank"
            )
        return me

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        _dist().all_gather_object(out, obj, group=self.group)
        return out

    def _max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        _dist().all_reduce(t, op=_dist().ReduceOp.MAX, group=self.group)
        return t.tolist()

    # -- the buffer ---------------------------------------------------------------------------
    def _flat(
        self, vec: Sequence[torch.Tensor | None], like: Sequence[torch.Tensor], weight: float = 1.0
    ) -> torch.Tensor:
        """``vec`` (None: zeros) copied into the buffer, times ``weight``; parameters in ``like`` order."""
        numel = sum(p.numel() for p in like)
        if self.buffer is None or self.buffer.numel() != numel or self.buffer.device != like[0].device:
            self.buffer = torch.empty(numel, dtype=torch.float32, device=like[0].device)
        at = 0
        for t, p in zip(vec, like):
            part = self.buffer[at : at + p.numel()]
            whole = full(t)
            if whole is None:
                part.zero_()
            else:
                part.copy_(whole.detach().reshape(-1))
                if weight != 1.0:
                    part.mul_(weight)
            at += p.numel()
        return self.buffer

    def _views(self, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        assert self.buffer is not None
        return [v.view(p.shape) for v, p in zip(torch.split(self.buffer, [p.numel() for p in like]), like)]

    # -- one step -------------------------------------------------------------------------------
    def step(
        self,
        numbers: StepNumbers,
        sums: Vec,
        like: Sequence[torch.Tensor],
        grads: Vec,
        params: Sequence[torch.Tensor],
    ) -> Vec | None:
        """Exchange this step's numbers (this rank's items, loss, rows, finiteness, leak and |.grad|^2 at
        each micro-batch boundary, read from ``numbers``) and make them the job's. ``sums``: this rank's
        O_r in ``like``'s parameter order (None: zeros), from whichever oracle judged the step, replayed or
        in place. Returns the job's sum_r O_r, written into ``sums`` (for a None, a fresh tensor where the
        parameter trains); [] where the job's window holds no item or a non-finite number (nothing to
        compare); None where some rank had ended its run (nothing more flows; the step is judged on this
        rank alone). Where a rank's in-place engine cannot vouch for its run (``fallback``), every rank
        raises ``Fallback`` together, before any other collective."""
        # the in-place engine's O as one block, and its parameters' order in it: summed where it lies below,
        # where every rank's order is this one
        own = one_block(sums)
        mine = dict(  # a rank with no window here hands in a step's defaults (no item, finite, no leak)
            items=numbers.items,
            loss=numbers.loss_sum,
            rows=numbers.sequences,
            finite=numbers.finite,
            leak=numbers.leak,
            norms=[f.norm2 for f in numbers.fits],
            fallback=self.fallback,
            same=checksums([*grads, *params]),  # G and the parameters, each a few numbers
            block=None if own is None else own[1],
        )
        every = self.gather(mine)
        if any(e is None for e in every):
            numbers.all_ranks = False
            return None
        self.agree([e["fallback"] for e in every])
        counts = [e["items"] for e in every]
        numbers.ranks, numbers.rank_items = self.world, counts
        numbers.items, numbers.sequences = sum(counts), sum(e["rows"] for e in every)
        numbers.loss_sum = sum(e["loss"] for e in every)
        numbers.finite, numbers.leak = all(e["finite"] for e in every), any(e["leak"] for e in every)
        norms = [e["norms"] for e in every]
        if len({len(x) for x in norms}) == 1:
            numbers.syncs = sum(1 for j in range(len(norms[0])) if len({x[j] for x in norms}) == 1)
        if not numbers.finite or numbers.items == 0:
            return []
        dist = _dist()
        if len(set(counts)) > 1 and all(counts):  # H, the per-rank-mean prediction: (1/R) sum_r O_r / N_r
            dist.all_reduce(self._flat(sums, like, 1.0 / counts[self.rank]))
            self.buffer.div_(self.world)  # type: ignore[union-attr]  # _flat just set the buffer
            g = gram([[full(t) for t in grads], self._views(like)])
            gg, gh, hh = float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
            if hh > 0 and gg > 0:
                c = gh / hh
                numbers.per_rank_factor = c
                numbers.per_rank_resid = math.sqrt(max(gg - 2 * c * gh + c * c * hh, 0.0)) / math.sqrt(gg)
        if own is not None and all(e["block"] == own[1] for e in every):
            dist.all_reduce(own[0])  # every rank's O is one block, laid out alike: summed where it lies
            job: Vec = list(sums)
        else:
            dist.all_reduce(self._flat(sums, like))  # the job's sum, copied out (the buffer is reused below)
            job = []
            for t, part, p in zip(sums, self._views(like), like):
                if t is not None:
                    job.append(t.copy_(part))
                else:  # a parameter this rank's window never reached: its share of the job's sum, if trained
                    job.append(part.clone() if p.requires_grad else None)
        if every[0]["same"] is None or any(e["same"] != every[0]["same"] for e in every):
            # some rank holds other bits (or shards, or a nan): how far each is from rank 0's, measured
            numbers.diverged = self._spread(grads, like)
            numbers.params_diverged = self._spread(list(params), like)
            numbers.diverged, numbers.params_diverged = self._max([numbers.diverged, numbers.params_diverged])
        return job

    def agree(self, reasons: list[str]) -> None:
        """Every rank at once: where any rank's in-place engine could not vouch for its run, every rank
        raises ``Fallback`` together (verify runs the job again on the recompute oracle)."""

        said = [(r, why) for r, why in enumerate(reasons) if why]
        if said:
            raise Fallback("; ".join(f"rank {r}: {why}" if self.world > 1 else why for r, why in said))

    def _spread(self, vec: Sequence[torch.Tensor | None], leaves: Sequence[torch.Tensor]) -> float:
        """||v_r - v_0|| / ||v_0|| on this rank, v_0 broadcast from rank 0 (0.0: bit for bit the same)."""
        buf = self._flat(vec, leaves)
        _dist().broadcast(buf, src=0)
        # rank 0 too runs the loop: a DTensor's full_tensor() is a collective every rank joins
        sums = torch.zeros(2, dtype=torch.float64, device=buf.device)  # sum (a - b)^2, sum b^2
        for t, part in zip(vec, self._views(leaves)):
            whole = full(t)
            a = (
                whole.detach().reshape(-1)
                if whole is not None
                else torch.zeros(part.numel(), device=part.device)
            )
            b = part.reshape(-1)
            # float64 sums chunk by chunk: no parameter-sized float64 copies
            for i in range(0, b.numel(), _CHUNK):
                x, y = a[i : i + _CHUNK].double(), b[i : i + _CHUNK].double()
                sums[0] += ((x - y) ** 2).sum()
                sums[1] += (y * y).sum()
        diff, ref = sums.tolist()
        return math.sqrt(diff / ref) if ref > 0 else (0.0 if diff == 0 else math.inf)

    # -- the run's end ----------------------------------------------------------------------------
    def alive(self) -> bool:
        """The process group still exists (a script may have destroyed it as it ended)."""
        return cast(bool, _dist().is_initialized())

    @contextlib.contextmanager
    def before_destroy(self, end: Callable[[], None]) -> Iterator[None]:
        """Run ``end()`` (the end-of-run exchange) when the loop destroys the default process group, just
        before it goes: Accelerate's ``end_training()`` calls ``torch.distributed.destroy_process_group``
        (accelerate 1.15, ``state.py:855``). Once only; the function is torch's own again on exit."""
        import torch.distributed.distributed_c10d as c10d

        dist, original = _dist(), c10d.destroy_process_group
        done: list[bool] = []

        def destroy(group: Any = None, *a: Any, **kw: Any) -> Any:
            if group is None and not done and dist.is_initialized():
                done.append(True)
                end()
            return original(group, *a, **kw)

        dist.destroy_process_group = c10d.destroy_process_group = destroy
        try:
            yield
        finally:
            dist.destroy_process_group = c10d.destroy_process_group = original

    def finish(self, local: dict[str, Any]) -> list[dict[str, Any]]:
        """This rank's loop ended: answer rounds as ``None`` until every rank's has, then gather what
        each rank holds for the report (``local``); every rank gets the same list."""
        while any(e is not None for e in self.gather(None)):
            pass
        return self.gather(local)


def one_block(tensors: Vec) -> tuple[torch.Tensor, tuple[int, ...]] | None:
    """The one flat tensor that ``tensors`` are views of, end to end and nothing else besides (the
    in-place engine's O), and their order in it: an all-reduce of it sums them all, with no copy, where
    every rank's order is the same. None otherwise.

    >>> block = torch.zeros(5); a, b = block.split([2, 3])
    >>> one_block([b, a])[1], one_block([a]), one_block([a, torch.zeros(3)])
    ((1, 0), None, None)
    """
    if not tensors or any(t is None or t._base is None for t in tensors):
        return None
    views = cast(list[torch.Tensor], tensors)  # none of them None: checked above
    base = cast(torch.Tensor, views[0]._base)  # each a view: checked above
    if base.dim() != 1 or not base.is_contiguous() or any(t._base is not base for t in views):
        return None
    order = tuple(sorted(range(len(views)), key=lambda i: views[i].storage_offset()))
    at = base.storage_offset()
    for i in order:
        t = views[i]
        if t.storage_offset() != at or not t.is_contiguous():
            return None
        at += t.numel()
    return (base, order) if at == base.storage_offset() + base.numel() else None


def checksums(tensors: Vec) -> list[float] | None:
    """Per tensor its first entries and the sum of its bits read as 64-bit integers (wrapping), as this
    rank holds them: equal on every rank that holds the same bits, apart wherever one word differs (two
    P-sized broadcasts spared on every step of a job whose ranks agree; a rank that differs anywhere
    changes its sum, and the spread is then measured). One exact pass per tensor, where a float sum and
    sum of squares took two and could round a small difference away; a tensor whose bytes are no whole
    number of 64-bit words (an odd length) gives those two instead. None where a tensor is a shard
    (FSDP2's DTensor: each rank holds another part)."""
    if any(hasattr(t, "full_tensor") for t in tensors):
        return None
    flat = [t.detach().reshape(-1) for t in tensors if t is not None]
    if not flat:
        return []
    whole = [_words(f) for f in flat]
    ints = [w.sum() for w in whole if w is not None]
    floats = [torch.stack([f.sum(), torch.dot(f, f)]) for f, w in zip(flat, whole) if w is None]
    out = torch.stack(ints).tolist() if ints else []  # Python ints: exact, whatever their size
    out += torch.cat(floats).tolist() if floats else []
    return out + torch.cat([f[:4] for f in flat]).tolist() + [t is None for t in tensors]


def _words(f: torch.Tensor) -> torch.Tensor | None:
    """``f``'s bytes as int64 words where its length makes whole ones (the same on every rank: shapes
    agree), a view where its offset allows, else of a copy; None where it does not."""
    if (f.numel() * f.element_size()) % 8:
        return None
    if (f.storage_offset() * f.element_size()) % 8:
        f = f.clone()
    return f.view(torch.int64)


__all__ = ["Ranks", "checksums", "full", "in_group", "one_block", "sharded"]
