"""Command line: ``accumlib verify`` (also ``python -m accumlib verify``).

Exit status: 0 when every verdict holds, 1 when one does not, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys

from ._batch import resolve_device


def _verify(args: argparse.Namespace) -> int:
    from .check import check_reference_loops

    try:
        device = resolve_device(args.device)
        table = check_reference_loops(tasks=args.task or None, loops=args.loop or None, device=device)
    except ValueError as err:
        print(f"accumlib verify: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(table.to_json())
    else:
        print(f"Reference loops against the true large-batch gradient (device: {device})\n")
        print(table)
    return 0 if table.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accumlib", description="Gradient accumulation, checked against the large batch.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify",
        help="run every reference loop on every built-in task and check its verdict",
        description="Run every reference loop on every built-in task, compare each optimizer step with the true "
        "large-batch gradient, and check the verdict each loop's docstring promises.",
    )
    v.add_argument("--task", action="append", metavar="NAME", help="only this built-in task (repeatable)")
    v.add_argument("--loop", action="append", metavar="NAME", help="only this reference loop (repeatable)")
    v.add_argument("--json", action="store_true", help="print the results as JSON")
    v.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    v.set_defaults(func=_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
