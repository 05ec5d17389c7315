"""``verify``: run the user's own loop on a copy and judge every optimizer step against the oracle.

The pipeline runs forward only: ``record`` (hooks on the copy; the oracle stage fed at every
micro-batch boundary) -> ``StepNumbers`` per step -> ``diagnose`` (a pure function) -> the report.
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from .._batch import ItemLosses
from .._checks import check_int
from ..tolerances import LOGGED_RTOL
from .codes import CODES
from .copying import copy_model
from .diagnose import CAUSES, clip_norms, diagnose_run, like_for_like
from .job import judge_job
from .numbers import StepNumbers
from .ranks import Ranks, in_group, sharded
from .record import Recorder, StopRun
from .report import Finding, Report, StepRow
from .shadow import disable_dropout, first_layer, make_shadow
from .sources import Tracked, TrackedIterable, tensors

DEFAULT_LR = 0.05  # plain SGD: every gradient error shows 1:1 in the update, unlike Adam
# verify's own stages: this package and the oracle's shared gradient (accumlib/oracle.py)
_OWN = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "oracle.py"))
_TORCH = str(Path(torch.__file__).resolve().parent)


class VerifyError(RuntimeError):
    """verify itself could not judge the run: it failed inside its own stages (a case it does not
    handle), not in the user's code. The command line exits 4 on it, not 3 ("your code raised").

    >>> import accumlib
    >>> issubclass(accumlib.VerifyError, RuntimeError)  # an exception from the loop itself propagates as it is
    True
    """


def _raised_by_verify(err: BaseException) -> bool:
    """True when the innermost frame outside torch that raised ``err`` is one of verify's own: torch
    raising inside the oracle is verify's failure, torch raising inside the user's forward is theirs."""
    frames = [f.filename for f in traceback.extract_tb(err.__traceback__)]
    ours = [f for f in frames if not str(Path(f).resolve()).startswith(_TORCH)]
    return bool(ours) and str(Path(ours[-1]).resolve()).startswith(_OWN)


def check_args(
    train_fn: Any,
    model: Any,
    dataset: Any,
    item_losses: Any,
    batch_size: Any,
    optimizer: Any,
    collate_fn: Any,
    max_steps: Any = None,
    ranks: Any = None,
) -> None:
    """Refuse bad arguments to ``verify`` before anything runs, naming argument, rule and value."""
    if ranks not in (None, "all"):
        raise ValueError(
            f"ranks must be None (one process) or 'all' (every rank of the process group) (got {ranks!r})"
        )
    where = in_group()
    if ranks is None and where is not None and where[1] > 1:
        raise ValueError(
            f"accumlib.verify judges one process's run unless told otherwise: called in a process group of world size "
            f"{where[1]} (rank {where[0]}) without ranks='all', each rank's oracle would see only its own items and a "
            "wrong multi-rank loop could read as OK. Call accumlib.verify(..., ranks='all') on every rank to judge the "
            "whole job (or run verify in a single process)"
        )
    if not callable(train_fn):
        raise TypeError(
            f"train_fn must be callable as train_fn(model, optimizer, loader) (got {type(train_fn).__name__})"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model must have at least one parameter with requires_grad=True (got {type(model).__name__} with none)"
        )
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(
            f"model must hold real parameters, not parameters on the meta device (got {type(model).__name__})"
        )
    if isinstance(dataset, IterableDataset):
        pass  # no length: passes end where its iterator ends
    elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"dataset must be a map-style dataset (__getitem__ and __len__) or a torch IterableDataset "
            f"(got {type(dataset).__name__})"
        )
    elif len(dataset) == 0:
        raise ValueError(f"dataset must hold at least one item (got an empty {type(dataset).__name__})")
    if not callable(item_losses):
        raise TypeError(
            f"item_losses must be callable as item_losses(model, batch) (got {type(item_losses).__name__})"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 1
    ):
        raise ValueError(f"max_steps must be None or an integer >= 1 (got {max_steps!r})")
    # it holds the caller's parameters, which verify never steps
    if isinstance(optimizer, torch.optim.Optimizer):
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        kind = type(optimizer)
        where = "torch.optim" if kind.__module__.startswith("torch.optim") else kind.__module__
        raise TypeError(
            "optimizer must be a factory that builds the optimizer over verify's copy of the model, not an optimizer "
            f"(got a {kind.__name__} instance over your model's own parameters); write optimizer=lambda params: "
            f"{where}.{kind.__name__}(params{f', lr={lr!r}' if isinstance(lr, float) else ''}) with the same settings"
        )
    for name, fn in (("optimizer", optimizer), ("collate_fn", collate_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be None or callable (got {type(fn).__name__})")
    if collate_fn is None and not isinstance(dataset, IterableDataset):
        _check_default_collate(dataset, batch_size)


def _check_default_collate(dataset: Any, batch_size: int) -> None:
    """Without a collate_fn, items are stacked: refuse items of different sizes now, with what to write,
    rather than torch's 'stack expects each tensor to be equal size' from inside the loop."""
    items = [dataset[i] for i in range(min(batch_size, len(dataset)))]
    try:
        default_collate(items)
    except RuntimeError as err:
        shapes = [tuple(t.shape) for t in tensors(items[0])], [tuple(t.shape) for t in tensors(items[-1])]
        raise ValueError(
            "collate_fn must be given when items differ in size: without one, verify's loader stacks them, which "
            f"fails (got item shapes {shapes[0]} and {shapes[1]} in the first micro-batch: {err}). Pad them, e.g. "
            "collate_fn=lambda items: torch.nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=PAD), "
            "and let item_losses skip the padding (accumlib.data.pad_collate is one such collate_fn)"
        ) from None


def verify(
    train_fn: Callable[[torch.nn.Module, torch.optim.Optimizer, DataLoader], Any],
    *,
    model: torch.nn.Module,
    dataset: Dataset,
    item_losses: ItemLosses,
    accum_steps: int,
    batch_size: int,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    collate_fn: Callable[[list], Any] | None = None,
    max_steps: int | None = None,
    ranks: str | None = None,
) -> Report:
    """Run ``train_fn(model, optimizer, loader)`` once on a copy and judge every optimizer step.

    ``loader`` is a DataLoader over ``dataset`` (map-style or iterable) with ``batch_size`` and
    ``collate_fn``; the loop may also build its own over ``loader.dataset`` with
    ``loader.collate_fn`` (a framework's sampler, shuffling), in the main process.
    ``max_steps`` judges the first N optimizer steps and then ends the loop.
    The oracle runs wherever the model's parameters live.

    ``ranks="all"``, called on every rank of a process group (under torchrun, or ``accumlib verify
    --world-size R``), judges the whole job: the loop keeps its own ``DDP(...)`` or ``fully_shard(...)``
    wrap and its own ``DistributedSampler`` over ``loader.dataset``, and each step's oracle is the mean
    item loss's gradient over every rank's window (``accumlib._verify.ranks``). Every rank returns
    the same report.

    >>> import torch, accumlib
    >>> task = accumlib.get_task("mlp-digits")
    >>> def train(model, opt, loader):
    ...     for i, (x, y) in enumerate(loader):
    ...         torch.nn.functional.cross_entropy(model(x), y).backward()  # never divided
    ...         if (i + 1) % 4 == 0:
    ...             opt.step(); opt.zero_grad()
    >>> report = accumlib.verify(train, model=task.make_model(0), dataset=task.make_dataset(),
    ...                          item_losses=task.item_losses, accum_steps=4, batch_size=8)
    >>> report.ok, sorted(report.codes)
    (False, ['tail-dropped', 'unscaled-sum'])
    """
    check_args(train_fn, model, dataset, item_losses, batch_size, optimizer, collate_fn, max_steps, ranks)
    k = check_int("accum_steps", accum_steps, low=1)
    where = in_group()
    # refuses non-data-parallel
    job = Ranks.join(model) if ranks == "all" and where is not None and where[1] > 1 else None
    net = copy_model(model)  # the caller's model is never touched, nor reached through a patched forward
    dropout = disable_dropout(net)  # random masks would differ from the oracle's; see the dropout finding
    opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=DEFAULT_LR)))(net.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must return a torch.optim.Optimizer when called with the parameters (got {type(opt).__name__})"
        )
    tracked = TrackedIterable(dataset) if isinstance(dataset, IterableDataset) else Tracked(dataset)
    rec = Recorder(
        net, make_shadow(net), opt, tracked, collate_fn or default_collate, item_losses, max_steps, ranks=job
    )
    loader = DataLoader(
        tracked, batch_size=batch_size, shuffle=False, drop_last=False, collate_fn=rec.collate_fn
    )
    # a global step hook: it also sees an optimizer the loop builds itself
    hooks = [
        net.register_forward_pre_hook(rec.on_forward, with_kwargs=True),
        first_layer(net).register_forward_pre_hook(rec.inside_forward),
        register_optimizer_step_pre_hook(rec.on_step),
    ]
    returned, stopped = None, False
    try:
        with rec.patched():
            returned = train_fn(net, opt, loader)
    except StopRun:
        stopped = True
    except Exception as err:
        where = (
            f"after {rec.forwards} micro-batch forwards and {len(rec.steps)} optimizer steps "
            f"(accum_steps={k}, batch_size={batch_size})"
        )
        if _raised_by_verify(err):
            raise VerifyError(
                f"accumlib.verify could not judge this run: its own recording failed {where} with "
                f"{type(err).__name__}: {err}. This is a limit of verify, not a bug found in the loop; "
                "please report it with the loop"
            ) from err
        err.add_note(f"accumlib.verify: train_fn raised {where}")
        raise
    finally:
        for h in hooks:
            h.remove()
        rec.unwatch()
    if job is None:
        return _report(rec, k, batch_size, returned, dropout, stopped)
    # on every rank at once: FSDP2 gathers its parameters here
    rec.oracle.leaves, rec.counting = rec.sync(), True
    mine = dict(
        steps=len(rec.steps),
        used=sorted(rec.used_indices),
        drawn=job.drawn,
        leftover=_leftover(rec),
        returned=returned if isinstance(returned, (numbers.Real, list, tuple)) else None,
        codes=[v.codes for v in diagnose_run(rec.steps, k=k)[0]],
        numbers=rec.steps,
    )
    every = job.finish(mine)
    return _report(rec, k, batch_size, returned, dropout, stopped, every)


def _leftover(rec: Recorder) -> tuple[int, float]:
    """Items and loss sum forwarded after the last step: the loop saw them, no step used them."""
    out = (0, 0.0)
    for mb in rec.leftovers():
        n, loss = rec.count_and_loss(mb.batch)
        out = (out[0] + n, out[1] + loss)
    return out


def _report(
    rec: Recorder,
    k: int,
    batch_size: int,
    returned: Any,
    dropout: list[float],
    stopped: bool,
    every: list[dict[str, Any]] | None = None,
) -> Report:
    steps = rec.steps if every is None else every[0]["numbers"]  # a job: rank 0's rows, every rank's codes
    verdicts, assumed = diagnose_run(steps, k=k)
    for e in every or ():
        for v, codes in zip(verdicts, e["codes"]):
            v.codes += [c for c in codes if c not in v.codes]
    converted = {t for t, v in enumerate(verdicts) if v.clip_assumed}
    rows, by_code, details = [], {}, {}  # type: ignore[var-annotated]
    for t, (s, v) in enumerate(zip(steps, verdicts)):
        for c in v.codes:
            by_code.setdefault(c, []).append(t)
            details.setdefault(c, [])
            if v.detail and v.detail not in details[c]:
                details[c].append(v.detail)
        clip_to = clip_norms(s) or ([assumed] if assumed else [])
        ratio, rel = like_for_like(s, clip_to)
        coef = s.scale if t in converted else s.unclip
        reference = (
            s.precision
            + (" replay" if s.precision != "float32" else "")
            + ("; BatchNorm: accumulated" if s.batchnorm else "")
        )
        ref_error = s.rel
        # judged against the truth clipped to the assumed norm, so show that error, not the unclipped one
        if t in converted:
            reference, ref_error = f"float32 clipped to {assumed:.3g} (assumed)", rel
        rows.append(
            StepRow(
                step=t,
                micro_batches=s.micro_batches,
                items=s.items,
                lr=s.lr,
                norm_ratio=ratio,
                rel_error=rel,
                codes=("skipped by GradScaler",) if s.skipped else tuple(v.codes),
                reference=reference,
                scale=s.scale / coef if t in converted else s.scale,
                clip=coef,
                ref_error=ref_error,
            )
        )
    if "misscaled" in by_code:  # one line for all its steps: the range of c, and the causes it matches
        cs = [verdicts[t].factor for t in by_code["misscaled"] if verdicts[t].factor is not None]
        found = sorted({verdicts[t].cause for t in by_code["misscaled"] if verdicts[t].cause})
        span = (
            f"c = {min(cs):.4f}" + (f" to {max(cs):.4f}" if max(cs) - min(cs) >= 5e-5 else "") if cs else ""
        )
        divisor = next((s.items / v.factor for s, v in zip(steps, verdicts) if v.cause == "constant"), None)
        span += f" (D = {divisor:.4g})" if divisor else ""
        details["misscaled"] = [span + "".join(f"; {CAUSES[c][0]}" for c in found)]
        masked = [t for t in by_code["misscaled"] if verdicts[t].masked]
        if masked:
            details["misscaled"].append(
                f"masked by clipping at step(s) {', '.join(map(str, masked))}: clip_grad_norm_ cut both the loop's "
                "gradient and the true one to max_norm, so the update there equals the correct one; the bug is real "
                "and shows at any step where the clip does not act"
            )
    findings = [_finding(code, steps, details[code], k) for code, steps in by_code.items()]
    if "misscaled" in by_code and found:  # the fix of the cause found, not the generic one
        at = next(i for i, f in enumerate(findings) if f.code == "misscaled")
        findings[at] = Finding(
            "misscaled", findings[at].message, "; ".join(CAUSES[c][1] for c in found), findings[at].steps
        )
    limited = [
        s.bn_gap for s, v in zip(steps, verdicts) if s.bn_gap is not None and (v.batchnorm_limit or v.codes)
    ]
    if limited:
        worst = max(limited)
        findings.append(
            Finding(
                "batchnorm",
                CODES["batchnorm"].message + f"; a correct accumulation is off by up to {worst:.2e} "
                "(relative) from the merged window's gradient, and the verdicts were judged against the "
                "micro-batch accumulation instead",
                CODES["batchnorm"].fix,
            )
        )
    if assumed is not None:
        findings.append(
            Finding(
                "clip-assumed",
                CODES["clip-assumed"].message + f" (max_norm ~= {assumed:.4g})",
                CODES["clip-assumed"].fix,
            )
        )
    if dropout:
        findings.append(
            Finding(
                "dropout",
                f"{len(dropout)} dropout layer(s) (p={sorted(set(dropout))}): " + CODES["dropout"].message,
                CODES["dropout"].fix,
            )
        )
    stepped = sum(s.items for s in steps)
    if stopped:
        findings.append(
            Finding(
                "partial-run", CODES["partial-run"].message.format(n=len(steps)), CODES["partial-run"].fix
            )
        )
        return Report(rows, findings, k, stepped, None)
    if "untracked-data" in by_code:  # the loop drew data verify never saw: what it left out is unknown
        return Report(rows, findings, k, stepped, None)
    if every is not None:
        return _job_report(rec, every, steps, rows, findings, k, batch_size, stepped, returned, by_code)
    missing, total, seen_items, seen_loss, left_out = _coverage(rec, batch_size, stepped)
    if missing:
        what = "the loop never called optimizer.step(); " if not steps else ""
        of = f" of {total}" if total is not None else ""
        findings.append(
            Finding(
                "tail-dropped",
                f"{what}{missing}{of} items reached no optimizer step",
                CODES["tail-dropped"].fix,
            )
        )
    passes = rec.data_passes
    if left_out:
        per = sorted(set(x for x in passes.left_out if x))
        findings.append(
            Finding(
                "loader-left-out",
                CODES["loader-left-out"].message.format(
                    n=sum(passes.left_out),
                    passes=len(passes.left_out),
                    per=" or ".join(map(str, per)),
                    held=passes.held,
                    why=passes.left_out_by,
                ),
                CODES["loader-left-out"].fix,
            )
        )
    if passes.duplicates:
        findings.append(
            Finding(
                "duplicate-items",
                CODES["duplicate-items"].message.format(n=passes.duplicates),
                CODES["duplicate-items"].fix,
            )
        )
    true_items = stepped + seen_items
    true_loss = (sum(s.loss_sum for s in steps) + seen_loss) / true_items if true_items else None
    logged = _logged(returned, steps, k, true_loss, findings)
    return Report(rows, findings, k, stepped, total, logged, true_loss)


def _job_report(
    rec: Recorder,
    every: list[dict[str, Any]],
    steps: list[StepNumbers],
    rows: list[StepRow],
    findings: list[Finding],
    k: int,
    batch_size: int,
    stepped: int,
    returned: Any,
    by_code: dict,
) -> Report:
    """The end of a multi-rank job's report: coverage, duplicates and sharding over every rank (``job``)."""
    held = len(rec.dataset) if isinstance(rec.dataset, Tracked) else None
    job = judge_job(every, steps, held)
    findings += [f for f in job.findings if f.code not in by_code]
    if sharded(rec.net):
        size = sum(leaf.numel() * leaf.element_size() for leaf in rec.oracle.leaves) / 2**20
        findings.append(
            Finding(
                "sharded-model",
                CODES["sharded-model"].message.format(size=f"{size:.3g} MiB"),
                CODES["sharded-model"].fix,
            )
        )
    missing = 0
    for s in range(0, len(job.missing), batch_size):
        missing += rec.count_and_loss(
            rec.collate([rec.dataset.dataset[i] for i in job.missing[s : s + batch_size]])
        )[0]  # type: ignore[union-attr]
    missing += job.leftover_items if held is None else 0  # indexed leftovers are among job.missing already
    if missing:
        what = "the job never called optimizer.step(); " if not steps else ""
        findings.append(
            Finding(
                "tail-dropped",
                f"{what}{missing}{f' of {stepped + missing}' if held is not None else ''} "
                "items reached no optimizer step on any rank",
                CODES["tail-dropped"].fix,
            )
        )
    true_items = stepped + job.leftover_items
    true_loss = (sum(s.loss_sum for s in steps) + job.leftover_loss) / true_items if true_items else None
    # rank 0's, so every rank reports alike
    logged = _logged(every[0]["returned"], steps, k, true_loss, findings)
    return Report(
        rows, findings, k, stepped, stepped + missing if held is not None else None, logged, true_loss
    )


def _finding(code: str, steps: list[int], details: list[str], k: int) -> Finding:
    msg = CODES[code].message.format(k=k)
    if details:
        shown = " | ".join(details[:2]) + (f" | ... ({len(details) - 2} more)" if len(details) > 2 else "")
        msg += f" ({shown})"
    return Finding(code, msg, CODES[code].fix, tuple(steps))


def _coverage(rec: Recorder, batch_size: int, stepped: int) -> tuple[int, int | None, int, float, bool]:
    """(items never stepped, items in all, items forwarded but never stepped, their loss sum, whether
    complete passes of the loop's loader left dataset items out by design: drop_last or its sampler)."""
    seen_items, seen_loss = 0, 0.0
    for mb in rec.leftovers():  # forwarded after the last step: the loop saw them, no step used them
        n, loss = rec.count_and_loss(mb.batch)
        seen_items, seen_loss = seen_items + n, seen_loss + loss
    # no indices: what was drawn in a pass the loop trained on, never used
    if not isinstance(rec.dataset, Tracked):
        missing = seen_items + sum(
            rec.count_and_loss(rec.mbs[b].batch)[0]
            for b in rec.fresh
            if rec.mbs[b].pass_id in rec.passes_used
        )
        return missing, stepped + missing, seen_items, seen_loss, 0
    left = [i for i in range(len(rec.dataset)) if i not in rec.used_indices]  # never in a stepped window
    passes = rec.data_passes
    # every pass ran to its end: what it did not draw, it left out
    left_out = passes.complete and any(passes.left_out)
    if left_out:
        left = [i for i in left if i in passes.seen]  # the rest was drawn: the loop's to step
    missing = 0
    for s in range(0, len(left), batch_size):
        missing += rec.count_and_loss(
            rec.collate([rec.dataset.dataset[i] for i in left[s : s + batch_size]])
        )[0]
    return missing, stepped + missing, seen_items, seen_loss, left_out


def logged_loss_off(logged: float, true: float, k: int) -> bool:
    """True when the reported loss is about k times (or 1/k times) the true mean item loss."""
    if k < 2 or not math.isfinite(logged) or true == 0 or not math.isfinite(true):
        return False
    r = logged / true
    near = lambda a, b: abs(a - b) <= LOGGED_RTOL * abs(b)  # noqa: E731
    return not near(r, 1.0) and (near(r * k, 1.0) or near(r / k, 1.0))


def _logged(
    returned: Any, steps: list[StepNumbers], k: int, true_loss: float | None, findings: list[Finding]
) -> float | None:
    """A number is the epoch loss the loop reports; a list with one number per step, per-step losses."""
    if isinstance(returned, torch.Tensor) and returned.numel() == 1:
        returned = float(returned.detach())  # a running loss kept as a tensor: its value, without the warning
    if isinstance(returned, numbers.Real) and not isinstance(returned, bool) and true_loss is not None:
        if logged_loss_off(float(returned), true_loss, k):
            findings.append(
                Finding(
                    "logged-loss-scaled",
                    f"the loop reports a loss of {float(returned):.4g}, but the true mean item loss is {true_loss:.4g} "
                    f"(off by about {k} = accum_steps)",
                    CODES["logged-loss-scaled"].fix,
                )
            )
        return float(returned)
    if (
        isinstance(returned, (list, tuple))
        and len(returned) == len(steps)
        and all(isinstance(x, numbers.Real) for x in returned)
    ):
        off = [
            t
            for t, (x, s) in enumerate(zip(returned, steps))
            if s.items and logged_loss_off(float(x), s.loss_sum / s.items, k)
        ]
        if off:
            findings.append(
                Finding(
                    "logged-loss-scaled",
                    CODES["logged-loss-scaled"].message.format(k=k),
                    CODES["logged-loss-scaled"].fix,
                    tuple(off),
                )
            )
    return None


__all__ = ["VerifyError", "check_args", "verify"]
