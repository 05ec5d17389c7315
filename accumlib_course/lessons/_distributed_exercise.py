"""Lesson 8's exercise on real ranks: the learner's DDP loop, sent to spawned gloo ranks and judged
as one job by ``accumlib.verify(..., ranks="all")``; rank 0's report is the grade.

A spawned process imports what it runs by name, so a function defined in a notebook cell cannot
be imported there. What travels instead (``ship``) is the function itself, taken apart:
  - its compiled code, by ``marshal`` (the ranks run this very interpreter: same bytecode);
  - the globals its code names: modules by name, functions of the same namespace (helpers the
    learner defined beside it) the same way as the function, anything else pickled;
  - the source lines of the cell, when the interpreter kept them, for tracebacks that quote them.
A rank rebuilds it (``rebuild``) with one namespace for every shipped function. No source text is
needed (a function exec'd from a string ships as well); a global that cannot travel is named in
the feedback if the loop then misses it.

``grade(fns)`` runs every loop in ONE launch (the ranks' start-up, ~6 s, dominates), bounded by a
timeout; a loop that raises stops the launch, which is started again for the loops after it. A rank
that dies without any error of the loop's (no Python exception: a crash in start-up) gets the loop
one more launch before its death is the feedback.
"""

from __future__ import annotations

import linecache
import logging
import marshal
import os
import pickle
import tempfile
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 120.0  # the whole launch: start-up ~6 s, one loop ~3-6 s per rank on 2 loaded cores
EACH_MORE_S = 30.0  # added to it for each further loop in one launch (measured: 10 loops in 27 s)
WORLD_SIZE = 2


class LoopFailed(Exception):
    """The learner's loop did not run to its end on the ranks; ``feedback`` says why, in their terms."""

    def __init__(self, feedback: str) -> None:
        super().__init__(feedback)
        self.feedback = feedback


@dataclass
class Shipped:
    """A function taken apart so that a spawned rank can rebuild it (see the module's docstring)."""

    entry: str
    # name -> (marshal'd code, pickled defaults)
    functions: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)  # global name -> module name
    values: dict[str, bytes] = field(default_factory=dict)  # global name -> pickled value
    missing: dict[str, str] = field(default_factory=dict)  # global name -> why it could not travel
    lines: dict[str, list[str]] = field(default_factory=dict)  # filename -> source lines


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, lambdas, generator expressions
            found |= _names(const)
    return found


def ship(fn: Callable[..., Any]) -> Shipped:
    """``fn`` and what it needs from its module's namespace, in a form a spawned process can load."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"train_fn must be a function defined with def (got {type(fn).__name__})")
    out = Shipped(fn.__name__)
    namespace = fn.__globals__
    todo = [(fn.__name__, fn)]
    while todo:
        key, f = todo.pop()
        if f.__closure__:
            raise TypeError(
                f"{f.__name__} must be defined at the top level of a cell, not inside another function (it "
                f"uses {', '.join(f.__code__.co_freevars)} from the function around it)"
            )
        out.functions[key] = (marshal.dumps(f.__code__), pickle.dumps((f.__defaults__, f.__kwdefaults__)))
        lines = linecache.getlines(f.__code__.co_filename)
        if lines:
            out.lines[f.__code__.co_filename] = lines
        for name in sorted(_names(f.__code__)):
            if name in out.functions or name in out.modules or name in out.values or name in out.missing:
                continue
            if name not in namespace or name.startswith("__"):
                continue  # a builtin or an attribute name
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                out.modules[name] = value.__name__
            elif isinstance(value, types.FunctionType) and value.__globals__ is namespace:
                todo.append((name, value))
                out.functions[name] = (b"", b"")  # placeholder: filled when popped
            else:
                try:
                    out.values[name] = pickle.dumps(value)
                except Exception as e:  # only a problem if the loop uses it: then the feedback names it
                    out.missing[name] = (
                        f"a {type(value).__name__} cannot be sent to another process ({type(e).__name__})"
                    )
    return out


def rebuild(s: Shipped) -> Callable[..., Any]:
    """The shipped function, in a fresh namespace holding what it named (run on a rank)."""
    import importlib

    namespace: dict[str, Any] = {"__name__": "__learner__", "__builtins__": __builtins__}
    for filename, lines in s.lines.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    for name, module in s.modules.items():
        namespace[name] = importlib.import_module(module)
    for name, blob in s.values.items():
        try:
            namespace[name] = pickle.loads(blob)
        except Exception as e:  # a class defined in the notebook: pickled by a name the rank cannot import
            s.missing[name] = f"it could not be loaded on the rank ({type(e).__name__}: {e})"
    for name, (code, defaults) in s.functions.items():
        f = types.FunctionType(marshal.loads(code), namespace, name)
        f.__defaults__, f.__kwdefaults__ = pickle.loads(defaults)
        namespace[name] = f
    return namespace[s.entry]


def feedback(err: BaseException, s: Shipped) -> str:
    """``NameError: ...`` and where in the learner's cell it was raised."""
    text = f"{type(err).__name__}: {err}"
    ours = [f for f in traceback.extract_tb(err.__traceback__) if f.filename in s.lines]
    if ours:
        text += f" (in {ours[-1].name}, line {ours[-1].lineno}: {(ours[-1].line or '').strip()})"
    name = getattr(err, "name", None)
    if isinstance(err, NameError) and name in s.missing:
        text += (
            f"; {name} was not sent to the ranks: {s.missing[name]}. Create it inside the function instead"
        )
    return text


def _worker(rank: int, world: int, loops: Sequence[Shipped], first: int, k: int, out: str) -> None:
    """One rank: every loop from ``first`` on, each judged by verify(..., ranks="all"); rank 0 keeps the
    reports.
    """
    import accumlib

    task = accumlib.get_task("lm-tokens")
    for i in range(first, len(loops)):
        try:
            train_fn = rebuild(loops[i])
            report = accumlib.verify(
                train_fn,
                model=task.make_model(0),
                dataset=task.make_dataset(),
                item_losses=task.item_losses,
                accum_steps=k,
                batch_size=task.batch_size,
                collate_fn=task.collate_fn,
                ranks="all",
            )
        except BaseException as e:
            with open(os.path.join(out, f"error{i}.rank{rank}"), "w") as fh:
                fh.write(feedback(e, loops[i]))
            raise
        if rank == 0:
            with open(os.path.join(out, f"report{i}.pkl.part"), "wb") as fh:
                pickle.dump(report, fh)
            os.replace(os.path.join(out, f"report{i}.pkl.part"), os.path.join(out, f"report{i}.pkl"))


def grade(fns: Sequence[Callable[..., Any]], k: int, timeout: float = TIMEOUT_S) -> list[Any]:
    """Run each loop on ``WORLD_SIZE`` real ranks; per loop, rank 0's Report or the LoopFailed that says why
    not.
    ``timeout``: seconds for the launch of one loop (each further loop in the same launch adds
    ``EACH_MORE_S``)."""
    from accumlib.distributed.launch import launch

    loops: list[Shipped | LoopFailed] = []
    for fn in fns:
        try:
            loops.append(ship(fn))
        except TypeError as e:
            loops.append(LoopFailed(f"TypeError: {e}"))
    results: list[Any] = [None] * len(loops)
    with tempfile.TemporaryDirectory(prefix="accumlib-exercise-") as out:
        first, retried = 0, -1
        while first < len(loops):
            if isinstance(loops[first], LoopFailed):
                results[first] = loops[first]
                first += 1
                continue
            end = next((i for i in range(first, len(loops)) if isinstance(loops[i], LoopFailed)), len(loops))
            # torch's spawn logs a warning for each peer it stops when
            # a rank fails: the feedback says it better
            spawn_log = logging.getLogger("torch.multiprocessing.spawn")
            level = spawn_log.level
            spawn_log.setLevel(logging.ERROR)
            try:
                launch(
                    _worker,
                    (loops[:end], first, k, out),
                    world_size=WORLD_SIZE,
                    timeout=timeout + EACH_MORE_S * (end - first - 1),
                )
                failure = None
            except Exception as e:  # a rank raised, was killed, or the launch ran out of time
                failure = e
            finally:
                spawn_log.setLevel(level)
            done = first
            while done < end and os.path.exists(os.path.join(out, f"report{done}.pkl")):
                with open(os.path.join(out, f"report{done}.pkl"), "rb") as fh:
                    results[done] = pickle.load(fh)
                done += 1
            if done < end and retried < done and _unexplained(out, done, failure):
                retried = done  # a rank died with no error of the loop's (a crash in start-up): once more
            elif done < end:
                results[done] = LoopFailed(_why(out, done, failure, timeout))
                done += 1
            first = done
    return results


def _errors(out: str, i: int) -> list[str]:
    """The error files the ranks wrote for loop ``i``, earliest first."""
    paths = [os.path.join(out, f"error{i}.rank{r}") for r in range(WORLD_SIZE)]
    return [p for _, p in sorted((os.path.getmtime(p), p) for p in paths if os.path.exists(p))]


def _unexplained(out: str, i: int, failure: BaseException | None) -> bool:
    return failure is not None and not isinstance(failure, TimeoutError) and not _errors(out, i)


def _why(out: str, i: int, failure: BaseException | None, timeout: float) -> str:
    """The learner's own error if a rank wrote one (the earliest), else what stopped the launch."""
    written = _errors(out, i)
    if written:
        with open(written[0]) as fh:
            return fh.read()
    if isinstance(failure, TimeoutError):
        return (
            f"TimeoutError: the ranks did not finish within {timeout:.0f} s (does every rank call the same "
            "collectives, in the same order, as often?)"
        )
    # the exit, then the ranks' last stderr lines
    lines = [line for line in str(failure).splitlines() if line.strip()]
    said = lines[0] + (f" (its last words: {lines[-1].strip()})" if len(lines) > 1 else "") if lines else ""
    return f"{type(failure).__name__}: {said}"
