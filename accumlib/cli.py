"""Command line (also ``python -m accumlib``):

    accumlib verify FILE.py:FUNCTION ...   your own loop against the large batch
    accumlib selfcheck                     the library's own check: every reference loop, every task
    accumlib run -- SCRIPT.py [ARGS...]    an unmodified training script, judged as it runs

Exit status: 0 when every verdict holds (the loop is correct), 1 when one does not (a bug),
2 on bad usage; ``verify FILE.py:FUNCTION`` also exits 3 when the loop itself raised and 4 when
verify could not judge it (``accumlib._verify.report.EXIT_STATUS``). One command, one meaning: ``verify``
judges the user's loop, ``selfcheck`` the library's own reference loops.

The course's commands live beside it, in ``accumlib_course`` (a clone's dev install):
``python -m accumlib_course.distributed`` (notebook 8's DDP experiment; ``accumlib ddp`` before) and
``python -m accumlib_course.survey transformers`` (every Transformers model class under its Trainer;
``accumlib survey`` before).
"""

from __future__ import annotations

import argparse
import os
import sys

from .checks import resolve_device


def _verify(args: argparse.Namespace) -> int:
    if not args.target:
        print(
            "accumlib verify: error: a target FILE.py:FUNCTION is required (the loop to judge, e.g. "
            "accumlib verify train.py:train --task mlp-digits); the library's own check of its reference "
            "loops is `accumlib selfcheck`",
            file=sys.stderr,
        )
        return 2
    from ._verify.cli import run_target

    return run_target(args)


def _selfcheck(args: argparse.Namespace) -> int:
    from .reference import check_reference_loops

    try:
        device = resolve_device(args.device)
        table = check_reference_loops(tasks=args.task or None, loops=args.loop or None, device=device)
    except ValueError as err:
        print(f"accumlib selfcheck: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(table.to_json())
    else:
        print(f"Reference loops against the true large-batch gradient (device: {device})\n")
        print(table)
    return 0 if table.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accumlib", description="Gradient accumulation, checked against the large batch."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify",
        help="judge your own loop (FILE.py:FUNCTION) against the large batch",
        description="Run FUNCTION(model, optimizer, loader) from FILE.py once on "
        "--task NAME, or on a task the file defines (item_losses, make_model, make_dataset or dataset; "
        "optional collate_fn, make_optimizer, ACCUM_STEPS, BATCH_SIZE), and name what is wrong with its "
        "accumulation. Exit 0: correct; 1: a bug was found; 2: usage error; 3: the loop raised; 4: verify "
        "could not judge (a limit such as data it did not hand out).",
    )
    # nargs="?": without a target, a usage error that names `accumlib selfcheck` (which it once was)
    v.add_argument("target", nargs="?", metavar="FILE.py:FUNCTION", help="your training loop")
    v.add_argument(
        "--task",
        action="append",
        metavar="NAME",
        help="the built-in task to run it on (when the file defines none)",
    )
    v.add_argument("--accum-steps", type=int, metavar="K", help="micro-batches per optimizer step")
    v.add_argument("--batch-size", type=int, metavar="B", help="micro-batch size")
    v.add_argument(
        "--max-steps", type=int, metavar="N", help="judge the first N optimizer steps, then end the loop"
    )
    v.add_argument(
        "--world-size",
        type=int,
        metavar="R",
        default=1,
        help="run it on R local processes (gloo on 127.0.0.1, NCCL when every rank has a GPU) "
        "and judge the whole job (verify(..., ranks='all')); the loop wraps its model in DDP or fully_shard",
    )
    v.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=600.0,
        help="with --world-size: stop the ranks after this long (default 600)",
    )
    v.add_argument(
        "--oracle",
        choices=("auto", "recompute"),
        default="auto",
        help="auto (default): judge in place, from the loop's own backward, where it can; recompute: replay "
        "every micro-batch through item_losses",
    )
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify)
    c = sub.add_parser(
        "selfcheck",
        help="the library's own check: every reference loop on every built-in task against the large batch",
        description="Run every reference loop on every built-in task under accumlib.verify, which compares "
        "each optimizer step with the true large-batch gradient, and check that verify's codes are the "
        "verdict each loop's contract promises (the CONTRACT at the end of its file). Exit 0 when every "
        "verdict holds, 1 when one does not, 2 on bad usage.",
    )
    c.add_argument("--task", action="append", metavar="NAME", help="only this built-in task (repeatable)")
    c.add_argument("--loop", action="append", metavar="NAME", help="only this reference loop (repeatable)")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    c.set_defaults(func=_selfcheck)
    from ._verify import run_cli

    r = sub.add_parser(
        "run",
        help="judge an unmodified training script: accumlib run -- SCRIPT.py ARGS",
        description=run_cli.DESCRIPTION,
    )
    run_cli.add_arguments(r)
    r.set_defaults(func=run_cli.run)
    return parser


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader closed the pipe


# commands that moved to the course beside the core (they need its extras, never a user's run)
MOVED = {"survey": "python -m accumlib_course.survey", "ddp": "python -m accumlib_course.distributed"}


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in MOVED:
        print(
            f"accumlib: error: 'accumlib {given[0]}' moved to the course: run {MOVED[given[0]]}",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, not at the interpreter's exit, where a closed pipe is a traceback
        return status
    except BrokenPipeError:
        # `accumlib verify ... | head`: the reader stopped reading. No traceback; stdout goes to devnull so
        # that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
