"""``accumlib verify FILE.py:FUNCTION``: verify a user's own loop from the command line.

The loop runs on a built-in task (``--task NAME``) or on a task the same file defines:

    item_losses(model, batch) -> 1-D tensor     required
    make_model() -> nn.Module                    required
    make_dataset() -> Dataset, or dataset        required (one of the two)
    collate_fn, make_optimizer(params)           optional
    ACCUM_STEPS, BATCH_SIZE                      optional defaults for --accum-steps, --batch-size

Exit status (``accumlib._verify.report.EXIT_STATUS``), one CI can act on:
  0  correct: every step saw the true large-batch gradient
  1  a bug was found (the findings say which)
  2  usage error: bad arguments, a target that does not import; the loop never ran
  3  the user's code raised (its traceback is printed, with how far the loop got)
  4  verify could not judge: a limit (data it did not hand out, BatchNorm), or verify itself failed
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import UsageError


def _load(target: str) -> tuple[ModuleType, Any]:
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise UsageError(f"target must be FILE.py:FUNCTION (got {target!r})")
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"target file must exist (got {path!r})")
    spec = importlib.util.spec_from_file_location(f"_accumlib_target_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"target file must be a Python file (got {path!r})")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # SyntaxError, ImportError, ...: the file cannot be used, the loop was never run
        traceback.print_exc()
        raise UsageError(
            f"target file must import cleanly (importing {path} raised {type(err).__name__}: {err})"
        ) from None
    finally:
        sys.path.pop(0)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"target function must be defined in {path} and callable (got {name!r})")
    return module, fn


def _task(args: argparse.Namespace, module: ModuleType) -> dict[str, Any]:
    if args.task:
        from ..tasks import get_task

        if len(args.task) != 1:
            raise UsageError(f"--task must be given once with a target (got {args.task})")
        t = get_task(args.task[0])
        return dict(
            model=t.make_model(0),
            dataset=t.make_dataset(),
            item_losses=t.item_losses,
            collate_fn=t.collate_fn,
            accum_steps=t.accum_steps,
            batch_size=t.batch_size,
            optimizer=None,
        )
    missing = [n for n in ("item_losses", "make_model") if not callable(getattr(module, n, None))]
    if not (callable(getattr(module, "make_dataset", None)) or hasattr(module, "dataset")):
        missing.append("make_dataset or dataset")
    if missing:
        raise UsageError(
            f"without --task the file must define {', '.join(missing)} (see `accumlib verify --help`)"
        )
    make = getattr(module, "make_dataset", None)
    return dict(
        model=_call(module.make_model, "make_model"),
        dataset=_call(make, "make_dataset") if callable(make) else module.dataset,
        item_losses=module.item_losses,
        collate_fn=getattr(module, "collate_fn", None),
        accum_steps=getattr(module, "ACCUM_STEPS", None),
        batch_size=getattr(module, "BATCH_SIZE", None),
        optimizer=getattr(module, "make_optimizer", None),
    )


def _call(fn: Any, name: str) -> Any:
    """The file's own factory; its failure is a usage error (the loop under test never ran)."""
    try:
        return fn()
    except Exception as err:
        traceback.print_exc()
        raise UsageError(
            f"{name}() in the target file must build its object (it raised {type(err).__name__}: {err})"
        ) from None


def run_target(args: argparse.Namespace) -> int:
    from ..checks import check_int
    from .api import check_args, verify
    from .errors import VerifyError
    from .report import EXIT_STATUS

    try:
        module, fn = _load(args.target)
        kw = _task(args, module)
        kw["accum_steps"] = args.accum_steps if args.accum_steps is not None else kw["accum_steps"]
        kw["batch_size"] = args.batch_size if args.batch_size is not None else kw["batch_size"]
        for flag in ("accum_steps", "batch_size"):
            if kw[flag] is None:
                raise UsageError(
                    f"--{flag.replace('_', '-')} is required when the file does not set {flag.upper()}"
                )
        check_int("accum_steps", kw["accum_steps"], low=1)
        kw["max_steps"] = args.max_steps
        if args.world_size != 1:
            from ..distributed.launch import RANK_MEMORY_BYTES, RANKS_PER_CORE, max_world_size

            why = (
                f"{RANKS_PER_CORE} ranks per usable core, {RANK_MEMORY_BYTES // 2**20} MiB available per rank"
            )
            check_int("world_size", args.world_size, low=1, high=max_world_size(), why=why)
        check_args(
            fn,
            kw["model"],
            kw["dataset"],
            kw["item_losses"],
            kw["batch_size"],
            kw["optimizer"],
            kw["collate_fn"],
            kw["max_steps"],
        )
    except (UsageError, ValueError, TypeError) as err:
        print(f"accumlib verify: error: {err}", file=sys.stderr)
        return EXIT_STATUS["usage"]
    if args.world_size > 1:
        return _run_ranks(args)
    try:
        report = verify(fn, **kw, oracle=getattr(args, "oracle", "auto"))
    except VerifyError as err:  # not the loop's fault: say so, and how
        traceback.print_exc()
        print(f"accumlib verify: cannot judge: {err}", file=sys.stderr)
        return EXIT_STATUS["cannot-judge"]
    except Exception:  # the user's loop raised: its traceback, with verify's note of how far it got
        traceback.print_exc()
        print("accumlib verify: the loop raised (exit 3); nothing was judged", file=sys.stderr)
        return EXIT_STATUS["raised"]
    print(report.to_json() if args.json else report)
    return report.exit_status


def _run_ranks(args: argparse.Namespace) -> int:
    """``--world-size R``: every rank loads the target itself and calls verify(..., ranks="all"); rank 0
    writes the job's report (every rank's is the same), which this process prints."""
    import tempfile

    from ..distributed.launch import launch
    from .report import EXIT_STATUS

    with tempfile.TemporaryDirectory(prefix="accumlib-verify-") as out:
        try:
            launch(
                rank_main,
                (vars(args) | {"func": None}, out),
                world_size=args.world_size,
                timeout=args.timeout,
            )
        except Exception as err:  # a rank raised (its traceback is in the error) or the job ran out of time
            print(err, file=sys.stderr)
            cannot = "VerifyError" in str(err)
            print(
                "accumlib verify: "
                f"{'cannot judge' if cannot else 'the loop raised on a rank (exit 3); nothing was judged'}",
                file=sys.stderr,
            )
            return EXIT_STATUS["cannot-judge" if cannot else "raised"]
        result = Path(out, "report.txt").read_text()
        status = int(Path(out, "status").read_text())
    print(result)
    return status


def rank_main(rank: int, world_size: int, options: dict[str, Any], out: str) -> None:
    """One rank of ``accumlib verify --world-size R``: load the target and judge the whole job."""
    from .api import verify

    args = argparse.Namespace(**options)
    module, fn = _load(args.target)
    kw = _task(args, module)
    kw["accum_steps"] = args.accum_steps if args.accum_steps is not None else kw["accum_steps"]
    kw["batch_size"] = args.batch_size if args.batch_size is not None else kw["batch_size"]
    report = verify(fn, **kw, max_steps=args.max_steps, ranks="all")
    if rank == 0:
        Path(out, "report.txt").write_text(report.to_json() if args.json else str(report))
        Path(out, "status").write_text(str(report.exit_status))
