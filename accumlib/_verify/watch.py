"""``accumlib.watch()`` and ``accumlib run``: judge a run as it happens, wherever its objects are built.

    with accumlib.watch() as seen:          # around a training loop, in a script or a notebook cell
        train()
    print(seen.report)

Nothing is handed to verify: the optimizers are found as they are built (or alive when the block
opens), the model is the set of parameters the stepping optimizer holds, micro-batches are the
backwards between its steps, items come from the script's standard loss calls (``losscalls.py``),
``accum_steps`` is read from the run. The engine is ``inplace.py``: the run's own graphs, no copy.
The pipeline runs forward: record (hooks, patches) -> numbers per step -> ``diagnose_run`` ->
``Report``. What the engine cannot see is a ``limit`` finding, never a pass.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from math import nan
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..checks import check_int
from .diagnose_run import diagnose_run, run_notes, step_findings, step_rows
from .errors import ItemLossesError, StopRun
from .inplace import InPlace
from .inplace_patches import observed
from .itemlosses import check_in_script, in_module, is_script, parse, run_main, wrapper
from .lock import one_run
from .report import Finding, Report
from .step_numbers import StepNumbers


@dataclass
class Watched:
    """What ``watch`` hands out: ``report`` once the block has ended (None before)."""

    report: Report | None = None
    engine: InPlace = field(default_factory=InPlace)


@dataclass
class Passes:
    """What ``_passes`` saw of the run's DataLoaders: for each pass the loop left unfinished when it began
    the next one over the same data, having stepped from it, (micro-batches undrawn, the pass's length)."""

    left: list[tuple[int, int]] = field(default_factory=list)

    def dropped(self, k: int) -> tuple[int, int]:
        """Micro-batches of the passes' tails never drawn, and a pass's length: only passes left short of
        less than a window (an epoch rounded down to whole windows). A loop that draws a window or two from
        a fresh shuffled iterator each time samples the data, as an iteration-based loop does: not a tail."""
        tails = [(n, size) for n, size in self.left if 0 < n < k]
        return sum(n for n, _ in tails), max((size for _, size in tails), default=0)


@contextlib.contextmanager
def _passes(eng: InPlace, seen: Passes) -> Iterator[None]:
    """Where a pass over a DataLoader ends, which the run's length alone cannot say once it has several
    epochs: as the engine closes a step, if the DataLoader the run drew from last has yielded its whole
    pass, the step ends a pass of that many micro-batches (its short window is then the pass's tail, as
    verify's own loader tells it). A prefetching loader (Accelerate's, Lightning's) runs one micro-batch
    ahead: it reads as ended one micro-batch early, where only a window of exactly the pass's tail is
    excused. And a pass over a dataset left unfinished for the next one, after a step closed while it was
    the one drawn from, is recorded (``Passes.dropped`` says which are tails never drawn); a probe such as
    ``next(iter(loader))``, or an evaluation pass, closes no step. The run's last pass may end anywhere (a
    max_steps): not recorded."""
    base = torch.utils.data.dataloader._BaseDataLoaderIter  # every DataLoader iterator's __next__
    original, finish, last = base.__next__, eng.finish, [lambda: None]
    mine: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # iterator -> [drawn, length, stepped]
    current: dict[int, list[int]] = {}  # id(dataset) -> the pass drawing from it now

    def drawn(it: Any) -> Any:
        batch = original(it)
        last[0] = weakref.ref(it)
        now = mine.get(it)
        if now is None:  # a new pass
            before = current.get(id(it._dataset))
            if before is not None and before[1] and before[2]:
                seen.left.append((before[1] - before[0], before[1]))
            now = mine[it] = current[id(it._dataset)] = [0, _length(it) or 0, 0]
        now[0] = it._num_yielded  # its own count: an iterator begun before the block counts from there
        return batch

    def finished(numbers: StepNumbers) -> None:  # a step, or a window GradScaler skipped (patches.py)
        it = last[0]()
        size = _length(it) if it is not None else None
        if size and it._num_yielded >= size:  # type: ignore[union-attr]
            numbers.epoch_end, numbers.pass_length = True, size
        if it is not None and it in mine:
            mine[it][2] = 1  # a step closed while this pass was the one drawn from
        finish(numbers)

    base.__next__ = drawn  # type: ignore[method-assign]
    eng.finish = eng.finish_step = finished  # type: ignore[method-assign]
    try:
        yield
    finally:
        base.__next__ = original  # type: ignore[method-assign]
        del eng.finish, eng.finish_step


def _length(it: Any) -> int | None:
    try:
        return len(it)
    except TypeError:  # an iterable dataset without a length: passes end where its iterator ends
        return None


def _item_losses(spec: str | Callable[..., object] | None) -> tuple[str, str] | None:
    """``item_losses`` as (module, name), checked before anything runs: ``"MODULE:FUNCTION"``, or a
    function the loop calls by its module-level name (a notebook's own: module ``__main__``)."""
    if spec is None or isinstance(spec, str):
        return None if spec is None else parse(spec)
    if not callable(spec):
        raise ItemLossesError(
            f"item_losses must be MODULE:FUNCTION or a function (got {type(spec).__name__})"
        )
    module, name = getattr(spec, "__module__", None), getattr(spec, "__qualname__", "")
    holder = sys.modules.get(module or "")
    if holder is None or "<locals>" in name or "<lambda>" in name:
        raise ItemLossesError(
            f"item_losses must be a module-level function, which the loop calls by its name (got {name!r}: "
            "define it at the top level of a module or a notebook cell)"
        )
    return module, name  # type: ignore[return-value]


@contextlib.contextmanager
def watch(
    *,
    max_steps: int | None = None,
    accum_steps: int | None = None,
    item_losses: str | Callable[..., object] | None = None,
    scan: bool = True,
) -> Iterator[Watched]:
    """Judge every optimizer step taken inside the block against the true large-batch gradient.

    ``accum_steps``: the micro-batches per step the run is meant to take (read from the run when
    None); ``max_steps``: judge the first N steps, then end the block's loop (the block ends cleanly);
    ``item_losses``: the loop's own loss function, returning one loss per item (``"MODULE:FUNCTION"``
    or the function itself), where its loss is not one standard loss call (``itemlosses.py``);
    ``scan``: also find the optimizers alive when the block opens (a script builds its own: no need).

    >>> import torch, accumlib
    >>> _ = torch.manual_seed(0); model = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    >>> with accumlib.watch() as seen:
    ...     for i in range(8):                               # 4 micro-batches of 2 per step
    ...         torch.nn.functional.cross_entropy(model(x[2*i:2*i+2]), y[2*i:2*i+2]).backward()
    ...         if (i + 1) % 4 == 0:
    ...             opt.step(); opt.zero_grad()
    >>> seen.report.ok, sorted(seen.report.codes), seen.report.accum_steps
    (False, ['unscaled-sum'], 4)
    """
    check_int("max_steps", max_steps, low=1, optional=True)
    check_int("accum_steps", accum_steps, low=1, optional=True)
    named = _item_losses(item_losses)
    out = Watched(engine=InPlace(max_steps=max_steps, item_label=":".join(named) if named else ""))
    eng, stopped, passes = out.engine, False, Passes()
    with one_run("accumlib.watch"):
        own = in_module(*named, eng.saw_item_loss, eng.inside) if named else contextlib.nullcontext()
        hook = register_optimizer_step_pre_hook(eng.on_step)
        try:
            with own, observed(eng, scan=scan), _passes(eng, passes):
                yield out
        except StopRun:
            stopped = True
        finally:
            hook.remove()
            eng.close()
        out.report = judge(eng, accum_steps, stopped=stopped, passes=passes)


def run_k(steps: list[StepNumbers]) -> int:
    """accum_steps as the run shows it: the most common window length (the longer on a tie)."""
    lengths = Counter(s.micro_batches for s in steps if s.micro_batches)
    return max(lengths, key=lambda m: (lengths[m], m)) if lengths else 1


def judge(eng: InPlace, accum_steps: int | None, *, stopped: bool, passes: Passes | None = None) -> Report:
    """The stages after the run: every step diagnosed, the run's tail, what could not be judged. Several
    optimizers (a GAN's two halves): each one's steps diagnosed on their own, with their own k, each
    finding naming its optimizer; the rows stay in the run's order."""
    steps = eng.steps
    groups: dict[str, list[int]] = {}
    for t, s in enumerate(steps):
        groups.setdefault(s.optimizer, []).append(t)
    rows: list[Any] = [None] * len(steps)
    findings: list[Finding] = []
    ks: list[int] = []
    for label, idx in groups.items():
        sub = [steps[t] for t in idx]
        k = accum_steps or run_k(sub)
        ks.append(k)
        if not stopped and not eng.window and not sub[-1].epoch_end:  # the last window may be its data's
            sub[-1].epoch_end, sub[-1].pass_length = (
                True,
                sum(s.micro_batches for s in sub),
            )  # tail (no loader)
        verdicts, assumed = diagnose_run(sub, k=k)
        for j, t in enumerate(idx):
            if t in eng.unjudged:
                verdicts[j].codes = []
        for j, r in enumerate(step_rows(sub, verdicts, assumed)):
            t = idx[j]
            if t in eng.unjudged:
                r = replace(r, codes=("not judged: " + ", ".join(eng.unjudged[t]),), rel_error=nan)
                r = replace(r, norm_ratio=nan, factor=nan)
            rows[t] = replace(r, step=t)
        found = step_findings(sub, verdicts, k=k) + run_notes(
            sub, verdicts, assumed, dropout=(), stopped=False
        )
        if len(groups) > 1:  # the group's own step numbers back to the run's, and whose finding it is
            found = [
                replace(f, steps=tuple(idx[j] for j in f.steps), message=f"{label}: {f.message}")
                for f in found
            ]
        findings += found
    if stopped:
        findings.append(Finding.of("partial-run", n=len(steps)))
    k = ks[0] if ks else accum_steps or 1
    stepped = sum(s.items for s in steps)
    left = sum(int(sum(c.items for c in b.calls)) for b in eng.window)
    if not steps:  # nothing to judge: said, never passed (a limit, exit 4)
        findings.append(Finding.of("no-step"))
    elif eng.window and not stopped:  # backwards after the last step: their gradient never reached one
        findings.append(Finding.of("tail-dropped", form="count", n=left, total=stepped + left))
    undrawn, size = passes.dropped(k) if passes is not None else (0, 0)
    if undrawn:  # micro-batches never drawn: their items are unknown here
        findings.append(Finding.of("tail-dropped", form="passes", n=undrawn, total=size))
    if eng.batchnorm:
        findings.append(Finding.of("batchnorm"))
    for code, sites in eng.problems.items():
        many = code == "several-losses"
        findings.append(
            Finding.of(code, sites="; ".join(sites) or "?", n=eng.terms, where=() if many else sites)
        )
    if eng.item_label and not eng.item_calls:
        findings.append(Finding.of("item-losses-unused", name=eng.item_label))
    # undrawn micro-batches hold items this engine never saw: their count is unknown, not zero
    total = None if stopped or undrawn else stepped + (left if eng.window else 0)
    loss = sum(s.loss_sum for s in steps) + 0.0
    return Report(rows, findings, k, stepped, total, None, loss / stepped if stepped else None)


def run_script(
    script: str | os.PathLike[str],
    args: list[str] | tuple[str, ...] = (),
    *,
    max_steps: int | None = None,
    accum_steps: int | None = None,
    item_losses: str | None = None,
) -> Report:
    """Run ``script`` as ``__main__`` with ``args`` as its command line, unmodified, under ``watch``;
    its exceptions propagate (``accumlib run`` turns them into exit 3), ``SystemExit(0)`` ends it.
    ``item_losses="MODULE:FUNCTION"``: MODULE is the script itself (its name or ``__main__``) or a module
    it imports."""
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"script must be an existing Python file (got {str(script)!r})")
    module, name = parse(item_losses) if item_losses else ("", "")
    own = is_script(module, str(path))
    if own:
        check_in_script(str(path), name)
    argv, syspath = list(sys.argv), list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))  # as `python script.py` puts the script's folder first
    try:
        with watch(
            max_steps=max_steps, accum_steps=accum_steps, item_losses=None if own else item_losses, scan=False
        ) as seen:
            try:
                if own:  # the script's own function, wrapped as the script defines it
                    eng = seen.engine
                    eng.item_label = f"{path.name}:{name}"
                    wrap = (name, lambda fn: wrapper(fn, eng.item_label, eng.saw_item_loss, eng.inside))
                    run_main(str(path), wrap)
                else:
                    runpy.run_path(str(path), run_name="__main__")
            except SystemExit as end:
                if end.code not in (None, 0):
                    raise
    finally:
        sys.argv, sys.path[:] = argv, syspath

    assert seen.report is not None
    return seen.report


__all__ = ["Watched", "judge", "run_script", "watch"]
