"""``accumlib run [OPTIONS] -- SCRIPT.py [ARGS...]``: judge an unmodified training script.

The script runs as ``__main__`` with its own arguments, under ``accumlib.watch`` (``watch.py``), and
the report is printed when it ends (or after ``--max-steps`` optimizer steps, ending it cleanly).
Exit status, as ``accumlib verify``'s (``report.EXIT_STATUS``): 0 correct, 1 a bug was found,
2 usage, 3 the script raised (its traceback is printed), 4 the run could not be judged.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

DESCRIPTION = (
    "Run SCRIPT.py as __main__ with its own arguments, unmodified, and judge every optimizer step it takes "
    "against the true large-batch gradient, computed in place from the run's own backward passes (no copy "
    "of the model, no re-read data). The model is the set of parameters the stepping optimizer holds; items "
    "come from the script's standard loss calls (torch.nn.functional's, wherever they are made, inside the "
    "model's forward too), accum_steps from the run. Exit 0: correct; 1: a bug was found; 2: usage error; "
    "3: the script raised; 4: the run could not be judged. A loss of the script's own, or several loss terms "
    "per micro-batch: name the function returning each item's combined loss with --item-losses."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-steps", type=int, metavar="N", help="judge the first N optimizer steps, then end the script"
    )
    p.add_argument(
        "--accum-steps",
        type=int,
        metavar="K",
        help="the micro-batches per optimizer step the script is meant to take (default: read from the run)",
    )
    p.add_argument(
        "--item-losses",
        metavar="MODULE:FUNCTION",
        help="the script's own loss: a function it calls that returns each item's (combined) loss, one per "
        "item; MODULE is the script's name (or __main__) for a function it defines, else a module it imports",
    )
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT.py [ARGS...]")


def run(args: argparse.Namespace) -> int:
    from ..checks import check_int
    from .errors import ItemLossesError
    from .itemlosses import parse
    from .report import EXIT_STATUS
    from .watch import run_script

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        check_int("max_steps", args.max_steps, low=1, optional=True)
        check_int("accum_steps", args.accum_steps, low=1, optional=True)
        if not command:
            raise ValueError("a script must follow `--` (got nothing to run): accumlib run -- train.py ARGS")
        if not Path(command[0]).is_file() or not command[0].endswith(".py"):
            raise ValueError(f"SCRIPT.py must be an existing Python file (got {command[0]!r})")
        if args.item_losses is not None:
            parse(args.item_losses)
    except ValueError as err:
        print(f"accumlib run: error: {err}", file=sys.stderr)
        return EXIT_STATUS["usage"]
    try:
        report = run_script(
            command[0],
            command[1:],
            max_steps=args.max_steps,
            accum_steps=args.accum_steps,
            item_losses=args.item_losses,
        )
    except ItemLossesError as err:  # misnamed, or its function broke the contract: a usage error
        print(f"accumlib run: error: {err}", file=sys.stderr)
        return EXIT_STATUS["usage"]
    except BaseException as err:  # the script's own failure, SystemExit(1) included: its traceback
        if isinstance(err, KeyboardInterrupt):
            raise
        traceback.print_exception(type(err), err, _from_script(err.__traceback__, command[0]))
        print(f"accumlib run: {command[0]} raised (exit 3); nothing was judged", file=sys.stderr)
        return EXIT_STATUS["raised"]
    # The script's objects (a DDP model holds its process group, whose gloo threads hold tensors) are freed
    # now, while the interpreter is whole: left to its finalization, a gloo worker thread torn down there can
    # abort the process after the report (SIGABRT, "terminate called without an active exception"; seen once
    # in CI on 2 loaded cores; pytorch/pytorch#179291 describes the race).
    gc.collect()
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: one report for the job, by rank 0
        print(report, flush=True)
        if args.json:
            Path(args.json).write_text(report.to_json())
    several = [f for f in report.findings if f.code == "several-losses"]
    if several:  # how the terms combine is the user's to say: a usage error, never guessed
        print(
            f"accumlib run: error: {several[0].message}; pass --item-losses MODULE:FUNCTION", file=sys.stderr
        )
        return EXIT_STATUS["usage"]
    return report.exit_status


def _from_script(tb: TracebackType | None, script: str) -> TracebackType | None:
    """The traceback from the script's first frame on: accumlib's and runpy's own frames are not the
    user's (all of it when the script's frame is not found)."""
    here, path = tb, str(Path(script).resolve())
    while here is not None and str(Path(here.tb_frame.f_code.co_filename).resolve()) != path:
        here = here.tb_next
    return here or tb


__all__ = ["DESCRIPTION", "add_arguments", "run"]
