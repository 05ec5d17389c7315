"""``verify``: run the user's own loop on a copy and judge every optimizer step against the oracle.

The pipeline runs forward only: ``record`` (hooks on the copy; the oracle stage fed at every
micro-batch boundary) -> ``StepNumbers`` per step -> ``diagnose`` (a pure function) -> the report.
"""

from __future__ import annotations

import numbers
import traceback
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from ..batches import ItemLosses
from ..checks import check_callable, check_choice, check_int, check_model
from .copying import copy_model
from .diagnose_run import (
    coverage_findings,
    diagnose_run,
    logged_findings,
    run_notes,
    step_findings,
    step_rows,
)
from .errors import Fallback, StopRun, VerifyError
from .inplace import InPlace
from .inplace_patches import observed
from .inplace_verify import rng_state, set_rng_state
from .items_used import coverage, job_coverage, leftover
from .job import judge_job
from .lock import one_run
from .patches import patched
from .ranks import Ranks, in_group, sharded
from .record import BN_TYPES, Recorder
from .report import Finding, Report
from .shadow import disable_dropout, first_layer, make_shadow
from .sites import user_site
from .sources import Tracked, TrackedIterable, tensors

DEFAULT_LR = 0.05  # plain SGD: every gradient error shows 1:1 in the update, unlike Adam
# verify's own stages: this package and the oracle's shared gradient (accumlib/oracle.py)
_OWN = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "oracle.py"))
_TORCH = str(Path(torch.__file__).resolve().parent)


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
    check_choice(
        "ranks", ranks, (None, "all"), "None judges one process, 'all' every rank of the process group"
    )
    where = in_group()
    if ranks is None and where is not None and where[1] > 1:
        raise ValueError(
            "accumlib.verify judges one process's run unless told otherwise: called in a process group of "
            "world "
            f"size {where[1]} (rank {where[0]}) without ranks='all', each rank's oracle would see only its "
            "own "
            "items and a wrong multi-rank loop could read as OK. Call accumlib.verify(..., ranks='all') on "
            "every "
            "rank to judge the whole job (or run verify in a single process)"
        )
    check_callable("train_fn", train_fn, "train_fn(model, optimizer, loader)")
    check_model(model)
    if isinstance(dataset, IterableDataset):
        pass  # no length: passes end where its iterator ends
    elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"dataset must be a map-style dataset (__getitem__ and __len__) or a torch IterableDataset "
            f"(got {type(dataset).__name__})"
        )
    elif len(dataset) == 0:
        raise ValueError(f"dataset must hold at least one item (got an empty {type(dataset).__name__})")
    check_callable("item_losses", item_losses, "item_losses(model, batch)")
    check_int("batch_size", batch_size, low=1)
    check_int("max_steps", max_steps, low=1, optional=True)
    # it holds the caller's parameters, which verify never steps
    if isinstance(optimizer, torch.optim.Optimizer):
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        kind = type(optimizer)
        module = "torch.optim" if kind.__module__.startswith("torch.optim") else kind.__module__
        raise TypeError(
            "optimizer must be a factory that builds the optimizer over verify's copy of the model, not an "
            f"optimizer (got a {kind.__name__} instance over your model's own parameters); write "
            "optimizer=lambda params: "
            f"{module}.{kind.__name__}(params{f', lr={lr!r}' if isinstance(lr, float) else ''}) "
            "with the same settings"
        )
    check_callable("optimizer", optimizer, optional=True)
    check_callable("collate_fn", collate_fn, optional=True)
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
            "collate_fn must be given when items differ in size: without one, verify's loader stacks them, "
            "which "
            f"fails (got item shapes {shapes[0]} and {shapes[1]} in the first micro-batch: {err}). Pad them, "
            "e.g. "
            "collate_fn=lambda items: torch.nn.utils.rnn.pad_sequence(items, batch_first=True, "
            "padding_value=PAD), "
            "and let item_losses skip the padding (accumlib.data.pad_collate is one such collate_fn)"
        ) from None


def verify(
    train_fn: Callable[[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]], Any],
    *,
    model: torch.nn.Module,
    dataset: Dataset[Any],
    item_losses: ItemLosses,
    accum_steps: int,
    batch_size: int,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    max_steps: int | None = None,
    ranks: Literal["all"] | None = None,
    oracle: Literal["auto", "recompute"] = "auto",
) -> Report:
    """Run ``train_fn(model, optimizer, loader)`` once on a copy and judge every optimizer step.

    ``loader`` is a DataLoader over ``dataset`` (map-style or iterable) with ``batch_size`` and
    ``collate_fn``; the loop may also build its own over ``loader.dataset`` with
    ``loader.collate_fn`` (a framework's sampler, shuffling), in the main process.
    ``max_steps`` judges the first N optimizer steps and then ends the loop.
    The oracle runs wherever the model's parameters live.

    ``oracle="auto"`` judges each step in place, from the loop's own backward (``inplace_verify.py``: at
    little more than the loop's own cost), once one window's replay through ``item_losses`` has shown the
    loop's items are ``item_losses``' items; where the engine cannot vouch for a step (autocast,
    BatchNorm, a loss it cannot follow), the loop is run again from the start on the recompute oracle,
    which replays every micro-batch (``oracle="recompute"``: always that one). ``Report.oracle`` says
    which judged the run.

    ``ranks="all"``, called on every rank of a process group (under torchrun, or ``accumlib verify
    --world-size R``), judges the whole job: the loop keeps its own ``DDP(...)`` or ``fully_shard(...)``
    wrap and its own ``DistributedSampler`` over ``loader.dataset``, and each step's oracle is the mean
    item loss's gradient over every rank's window (``accumlib._verify.ranks``), each rank's share judged in
    place as one process's is; where one rank's engine cannot vouch for its run, every rank runs the job again
    on the recompute oracle together. Every rank returns the same report.

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
    check_choice(
        "oracle",
        oracle,
        ("auto", "recompute"),
        "'auto' judges in place where it can (the loop's own backward), 'recompute' replays each micro-batch",
    )
    caller = user_site()  # the user's line that called verify (or verify_trainer, verify_fit)
    with one_run("accumlib.verify"):  # refused by name while another run records (lock.py)
        where = in_group()
        # refuses non-data-parallel
        multi = ranks == "all" and where is not None and where[1] > 1

        def once(engine: InPlace | None) -> Report:
            job = Ranks.join(model) if multi else None  # a fresh exchange per run, every rank at once
            args = (
                train_fn,
                model,
                dataset,
                item_losses,
                k,
                batch_size,
                optimizer,
                collate_fn,
                max_steps,
                job,
            )
            return _run(*args, caller=caller, engine=engine)

        # BatchNorm couples a window's items: its merged window is the recompute oracle's alone
        if oracle == "recompute" or any(isinstance(m, BN_TYPES) for m in model.modules()):
            return once(None)
        start = rng_state()
        try:
            return once(InPlace(exchange=not multi))
        except Fallback as why:  # the engine cannot vouch for a step: the run again, from the same start
            # (in a job, every rank at once: the exchange raised it on every rank together)
            set_rng_state(start)
            return replace(once(None), oracle=f"recompute ({why.reason})")


def _run(
    train_fn: Callable[..., Any],
    model: torch.nn.Module,
    dataset: Dataset[Any],
    item_losses: ItemLosses,
    k: int,
    batch_size: int,
    optimizer: Callable[..., torch.optim.Optimizer] | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    max_steps: int | None,
    job: Ranks | None,
    *,
    caller: str | None,
    engine: InPlace | None,
) -> Report:
    """One run of the loop on a fresh copy, recorded (``engine``: judged in place, else replayed), judged."""
    net = copy_model(model)  # the caller's model is never touched, nor reached through a patched forward
    dropout = disable_dropout(net)  # random masks would differ from the oracle's; see the dropout finding
    opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=DEFAULT_LR)))(net.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must return a torch.optim.Optimizer when called with the parameters (got "
            f"{type(opt).__name__})"
        )
    tracked = TrackedIterable(dataset) if isinstance(dataset, IterableDataset) else Tracked(dataset)
    rec = Recorder(
        net,
        make_shadow(net),
        opt,
        tracked,
        collate_fn or default_collate,
        item_losses,
        max_steps,
        ranks=job,
        caller=caller,
    )
    if engine is not None:
        rec.in_place(engine)
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
    # a script that destroys its process group as it ends (Accelerate's end_training) has the
    # end-of-run exchange run right before (its return value is not known yet: no logged loss)
    ended: list[list[dict[str, Any]]] = []

    def said() -> str:  # which oracle judged the run (read at its end: a take-over may have switched it)
        return rec.switched or ("in-place" if engine is not None else "recompute")

    at_end = (
        job.before_destroy(lambda: ended.append(_exchange(rec, job, k, None, said())))
        if job
        else nullcontext()
    )
    if engine is not None:
        engine.saw_optimizer(opt)
    in_place = observed(engine, scan=False) if engine is not None else nullcontext()
    try:
        with patched(rec), at_end, in_place:
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
        if engine is not None:
            engine.close()
    if job is None:
        report = _judge(rec, k, batch_size, _number(returned), dropout, stopped)
        return replace(report, oracle=said())
    every = ended[0] if ended else _exchange(rec, job, k, returned, said())
    if any(e["fallback"] for e in every):  # after the last exchange of steps: every rank at once
        if ended:
            raise VerifyError(
                "accumlib.verify could not judge this job: "
                + "; ".join(f"rank {r}: {e['fallback']}" for r, e in enumerate(every) if e["fallback"])
                + ", and the loop destroyed its process group, so the job cannot run again on the "
                "recompute oracle. Call accumlib.verify(..., oracle='recompute')"
            )
        job.agree([e["fallback"] for e in every])
    report = _judge(rec, k, batch_size, None, dropout, stopped, every)
    oracles = [e["oracle"] for e in every]
    if len(set(oracles)) > 1:  # ranks may differ: one handed a window to the recompute oracle
        return replace(report, oracle="; ".join(f"rank {r}: {o}" for r, o in enumerate(oracles)))
    return replace(report, oracle=oracles[0])


def _exchange(rec: Recorder, job: Ranks, k: int, returned: Any, oracle: str) -> list[dict[str, Any]]:
    """The end of a job's run, on every rank at once: what each rank holds for the report, gathered."""
    if not job.alive():
        raise VerifyError(
            "accumlib.verify could not judge this job: the loop destroyed its process group before verify "
            "could gather the ranks' results, with a destroy_process_group verify did not see (imported "
            "by name before verify started). Call torch.distributed.destroy_process_group() by its module "
            "path, or after verify returns"
        )
    # on every rank at once: FSDP2 gathers its parameters here
    rec.oracle.leaves, rec.counting = rec.sync(), True
    mine = dict(
        steps=len(rec.steps),
        used=sorted(rec.used_indices),
        drawn=job.drawn,
        leftover=leftover(rec),
        returned=returned if isinstance(returned, (numbers.Real, list, tuple)) else None,
        codes=[v.codes for v in diagnose_run(rec.steps, k=k)[0]],
        numbers=rec.steps,
        oracle=oracle,
        fallback=job.fallback,
    )
    return job.finish(mine)


def _number(returned: Any) -> Any:
    """A running loss kept as a one-element tensor is its value (read without torch's warning)."""
    if isinstance(returned, torch.Tensor) and returned.numel() == 1:
        return float(returned.detach())
    return returned


def _judge(
    rec: Recorder,
    k: int,
    batch_size: int,
    returned: Any,
    dropout: list[float],
    stopped: bool,
    every: list[dict[str, Any]] | None = None,
) -> Report:
    """The stages after the run, in order: diagnose every step and the run, count what no step used,
    judge the job (``every``: what each rank handed in), and the report."""
    steps = rec.steps if every is None else every[0]["numbers"]  # a job: rank 0's rows, every rank's codes
    verdicts, assumed = diagnose_run(steps, k=k, ranks_codes=[e["codes"] for e in every or ()])
    rows = step_rows(steps, verdicts, assumed)
    found = step_findings(steps, verdicts, k=k)
    findings = found + run_notes(steps, verdicts, assumed, dropout=dropout, stopped=stopped)
    stepped = sum(s.items for s in steps)
    if stopped or any(f.code == "untracked-data" for f in found):  # what the loop left out is unknown
        return Report(rows, findings, k, stepped, None)
    if every is None:
        cov = coverage(rec, batch_size, stepped)
    else:
        job = judge_job(every, steps, len(rec.dataset) if isinstance(rec.dataset, Tracked) else None)
        findings += [f for f in job.findings if f.code not in {g.code for g in found}]
        if sharded(rec.net):
            mib = sum(leaf.numel() * leaf.element_size() for leaf in rec.oracle.leaves) / 2**20
            findings.append(Finding.of("sharded-model", mib=mib))
        cov = job_coverage(rec, job, batch_size, stepped)
        returned = every[0]["returned"]  # rank 0's, so every rank reports alike
    findings += coverage_findings(cov, stepped=bool(steps), job=every is not None)
    true_items = stepped + cov.seen_items
    true_loss = (sum(s.loss_sum for s in steps) + cov.seen_loss) / true_items if true_items else None
    logged, off = logged_findings(returned, steps, k=k, true_loss=true_loss)
    return Report(rows, findings + off, k, stepped, cov.total, logged, true_loss)


__all__ = ["check_args", "verify"]
