"""``python -m accumlib_course.distributed``: notebook 8's DDP experiment from a shell (``accumlib ddp``
before it moved beside the core; torchrun starts the same module).

    python -m accumlib_course.distributed --world-size 2 --accum-steps 4
    torchrun --nproc-per-node 2 -m accumlib_course.distributed --accum-steps 4

Exit 0 when every step matched, 1 when one did not, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(d: argparse.ArgumentParser) -> argparse.ArgumentParser:
    d.add_argument(
        "--world-size", type=int, default=2, help="processes to spawn (default: 2; ignored under torchrun)"
    )
    d.add_argument("--accum-steps", type=int, default=4, help="micro-batches per optimizer step (default: 4)")
    d.add_argument(
        "--task", default="lm-tokens", help="built-in task (default: lm-tokens, variable token counts)"
    )
    d.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before the ranks are stopped (default: 300)"
    )
    d.add_argument(
        "--port", type=int, default=None, help="rendezvous port on 127.0.0.1 (default: a free one)"
    )
    d.add_argument("--json", action="store_true", help="print the results as JSON")
    return d


DESCRIPTION = (
    "Spawn --world-size processes on 127.0.0.1 (gloo on CPU), accumulate with DistributedDataParallel "
    "and compare every step with the large-batch gradient over all ranks' windows; "
    "count all-reduce calls and bytes with and without no_sync. "
    "Under torchrun it joins torchrun's process group instead."
)


def run(args: argparse.Namespace) -> int:
    from accumlib.distributed import init_from_env

    from . import ddp_experiment

    try:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: join its group
            init_from_env()
        report = ddp_experiment(
            world_size=args.world_size,
            accum_steps=args.accum_steps,
            task=args.task,
            timeout=args.timeout,
            port=args.port,
        )
    except ValueError as err:
        print(f"python -m accumlib_course.distributed: error: {err}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(report.to_json() if args.json else report)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(prog="python -m accumlib_course.distributed", description=DESCRIPTION)
    )
    return run(parser.parse_args(argv))
