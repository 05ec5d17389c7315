"""``verify``: run the user's own epoch loop and judge every optimizer step against the oracle."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, Dataset, default_collate

from .._batch import ItemLosses, check_accum_steps
from ._diagnose import FIXES, analyse, coverage, explained_by_clipping, logged_loss_off, step_tol
from ._record import Recorder, Tracked, _rel, disable_dropout, first_layer, make_shadow
from .report import Finding, Report, StepRow

DEFAULT_LR = 0.05  # plain SGD: every gradient error shows 1:1 in the update, unlike Adam

_MESSAGES = {
    "unscaled-sum": "the step's gradient is the sum of its m micro-batch means, about m x the true gradient: the loss was never divided",
    "mean-of-means": "micro-batches with different item counts were weighted per micro-batch, not per item",
    "tail-misscaled": "the last, partial window was divided as if it held all {k} micro-batches",
    "zero-grad-inside-window": "earlier micro-batches of a window (almost) never reached the step: .grad was zeroed, or shrunk again (divided inside the loop), between micro-batches of one window",
    "no-zero-grad": "gradients of an earlier window leaked into this step: .grad was not zeroed after the previous step",
    "early-step": "the optimizer stepped more often than every {k} micro-batches",
    "scheduler-per-micro-batch": "the learning rate changed between micro-batches of one window (a scheduler stepped per micro-batch)",
    "clip-per-micro-batch": "gradients were clipped before the window's gradient was complete",
    "clip-before-unscale": "clipping ran on GradScaler-scaled gradients, so it clipped (almost) everything",
    "unexplained": "the step's gradient differs from the true large-batch gradient in a way no known bug explains",
    "non-finite": "the gradient the optimizer saw holds inf or nan",
    "no-items": "the optimizer stepped on a window with no items",
}


def check_args(train_fn: Any, model: Any, dataset: Any, item_losses: Any, batch_size: Any, optimizer: Any, collate_fn: Any) -> None:
    """Refuse bad arguments to ``verify`` before anything runs, naming argument, rule and value."""
    if not callable(train_fn):
        raise TypeError(f"train_fn must be callable as train_fn(model, optimizer, loader) (got {type(train_fn).__name__})")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"model must have at least one parameter with requires_grad=True (got {type(model).__name__} with none)")
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(f"dataset must be a map-style dataset with __getitem__ and __len__ (got {type(dataset).__name__})")
    if len(dataset) == 0:
        raise ValueError(f"dataset must hold at least one item (got an empty {type(dataset).__name__})")
    if not callable(item_losses):
        raise TypeError(f"item_losses must be callable as item_losses(model, batch) (got {type(item_losses).__name__})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    for name, fn in (("optimizer", optimizer), ("collate_fn", collate_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be None or callable (got {type(fn).__name__})")


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
) -> Report:
    """Run ``train_fn(model, optimizer, loader)`` once on a copy and judge every optimizer step.

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
    check_args(train_fn, model, dataset, item_losses, batch_size, optimizer, collate_fn)
    k = check_accum_steps(accum_steps)
    net = copy.deepcopy(model)  # the caller's model is never touched
    dropout = disable_dropout(net)  # random masks would differ from the oracle's; see the dropout finding
    opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=DEFAULT_LR)))(net.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer must return a torch.optim.Optimizer when called with the parameters (got {type(opt).__name__})")
    tracked = Tracked(dataset)
    rec = Recorder(net, make_shadow(net), opt, tracked, collate_fn or default_collate, item_losses, step_tol)
    loader = DataLoader(tracked, batch_size=batch_size, shuffle=False, drop_last=False, collate_fn=rec.collate_fn)
    # a global step hook: it also sees an optimizer the loop builds itself (on_step keeps those over net's parameters)
    hooks = [net.register_forward_pre_hook(rec.on_forward, with_kwargs=True), first_layer(net).register_forward_pre_hook(rec.inside_forward),
             register_optimizer_step_pre_hook(rec.on_step)]
    try:
        with rec.clipping(), rec.scaler_skips():
            returned = train_fn(net, opt, loader)
    except Exception as err:
        err.add_note(
            f"accumlib.verify: train_fn raised after {rec.forwards} micro-batch forwards and "
            f"{len(rec.steps)} optimizer steps (accum_steps={k}, batch_size={batch_size})"
        )
        raise
    finally:
        for h in hooks:
            h.remove()
    return _report(rec, k, batch_size, returned, dropout)


def _report(rec: Recorder, k: int, batch_size: int, returned: Any, dropout: list[float]) -> Report:
    last = len(rec.dataset) - 1
    rows, by_code, bn_diffs, details = [], {}, [], {}  # type: ignore[var-annotated]
    n_mb = -(-len(rec.dataset) // batch_size)  # micro-batches per epoch (the last may be smaller)
    verdicts = []
    for t, step in enumerate(rec.steps):
        # a short window is a legitimate tail only if it holds exactly the epoch's last n_mb % k micro-batches
        is_tail = bool(step.batches) and last in rec.indices[step.batches[-1]] and len(step.batches) == n_mb % k
        verdicts.append(analyse(step, k=k, is_tail=is_tail))
    if explained_by_clipping(verdicts, rec.steps):
        for v in verdicts:
            if v.clip_scale is not None:
                v.codes.remove("unexplained")
    for t, (step, v) in enumerate(zip(rec.steps, verdicts)):
        for c in v.codes:
            by_code.setdefault(c, []).append(t)
            details.setdefault(c, v.detail)
        if v.bn_diff is not None:
            bn_diffs.append(v.bn_diff)
        ok_ref = step.oracle is not None and step.oracle.norm() > 0
        rows.append(StepRow(
            step=t, micro_batches=len(step.batches), items=step.items,
            lr=step.lrs[-1][0] if step.lrs else float("nan"),
            norm_ratio=float(step.grad.norm() / step.oracle.norm()) if ok_ref else float("nan"),
            rel_error=_rel(step.grad, step.oracle) if ok_ref else float("nan"),
            codes=("skipped by GradScaler",) if step.skipped else tuple(v.codes),
        ))
    stepped, missing, seen_items, seen_loss = coverage(rec, batch_size)
    findings = []
    for code, steps in by_code.items():
        msg = _MESSAGES[code].format(k=k)
        if details.get(code):
            msg += f" ({details[code]})"
        findings.append(Finding(code, msg, FIXES[code], tuple(steps)))
    if missing:
        what = "the loop never called optimizer.step(); " if not rec.steps else ""
        findings.append(Finding("tail-dropped", f"{what}{missing} of {stepped + missing} items reached no optimizer step", FIXES["tail-dropped"]))
    if bn_diffs:
        findings.append(Finding(
            "batchnorm",
            f"the model holds BatchNorm: per-micro-batch statistics differ from the large batch's, so no loop can "
            f"match it; a correct accumulation is off by up to {max(bn_diffs):.2e} (relative)",
            FIXES["batchnorm"],
        ))
    if dropout:
        findings.append(Finding(
            "dropout",
            f"{len(dropout)} dropout layer(s) (p={sorted(set(dropout))}) were set to p=0 in verify's copy, so every step "
            "is compared exactly; the verdict concerns accumulation alone, not dropout noise",
            FIXES["dropout"],
        ))
    true_items = stepped + seen_items
    true_loss = (sum(s.loss_sum for s in rec.steps) + seen_loss) / true_items if true_items else None
    logged = _logged(returned, rec, k, true_loss, findings)
    return Report(rows, findings, k, stepped, stepped + missing, logged, true_loss)


def _logged(returned: Any, rec: Recorder, k: int, true_loss: float | None, findings: list[Finding]) -> float | None:
    """A number is the epoch loss the loop reports; a list with one number per step, per-step losses."""
    if isinstance(returned, torch.Tensor) and returned.numel() == 1:
        returned = float(returned)
    if isinstance(returned, numbers.Real) and not isinstance(returned, bool) and true_loss is not None:
        if logged_loss_off(float(returned), true_loss, k):
            findings.append(Finding(
                "logged-loss-scaled",
                f"the loop reports a loss of {float(returned):.4g}, but the true mean item loss is {true_loss:.4g} "
                f"(off by about {k} = accum_steps)",
                FIXES["logged-loss-scaled"],
            ))
        return float(returned)
    if isinstance(returned, (list, tuple)) and len(returned) == len(rec.steps) and all(isinstance(x, numbers.Real) for x in returned):
        off = [t for t, (x, s) in enumerate(zip(returned, rec.steps)) if s.items and logged_loss_off(float(x), s.loss_sum / s.items, k)]
        if off:
            findings.append(Finding(
                "logged-loss-scaled", f"the per-step losses the loop returns are off by about {k} = accum_steps",
                FIXES["logged-loss-scaled"], tuple(off),
            ))
    return None
