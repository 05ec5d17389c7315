"""``python -m accumlib.distributed [--accum-steps K] [--json]``: ``accumlib ddp``, for torchrun.

torchrun --nproc-per-node 2 -m accumlib.distributed --accum-steps 4
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
