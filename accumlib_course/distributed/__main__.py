"""``python -m accumlib_course.distributed [--world-size R] [--accum-steps K] [--json]``: notebook 8's
experiment (``cli.py``); torchrun starts it as a module:

torchrun --nproc-per-node 2 -m accumlib_course.distributed --accum-steps 4
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
