"""The implementation of ``accumlib.verify`` (private: import ``accumlib.verify``, the function).

One pipeline, data passed forward only, a module per stage:

- ``record``: hooks on verify's copy of the model, window state (``patches``: the clip / GradScaler /
  scheduler / DataLoader patches, recording into it); feeds the oracle at every micro-batch boundary
  and leaves ``StepNumbers``;
- ``oracle``: the true gradient micro-batch by micro-batch (``accumlib.oracle.sum_grad``) and
  the per-micro-batch fit of ``.grad``, in a few parameter-sized buffers; ``measure``: a finished
  window's numbers against it; ``coverage``: the items no step used, counted at the run's end;
- ``diagnose``: a pure function of a step's numbers -> its codes; ``diagnose_run``: the rules across
  the run (a clip assumed, coverage, the logged loss), each finding worded by the codes table;
  ``job``: what a multi-rank job's ranks handed in, judged together;
- ``report``: ``Report`` (immutable; ``with_finding`` for an adapter's note), ``StepRow``, ``Finding``;
- ``codes``: the one table of finding codes (kind, message, fix, wordings); ``api``: ``verify`` itself,
  which checks the arguments, makes the copy and runs the stages in that order.

The in-place engine, for runs verify did not set up (``accumlib.watch``, ``accumlib run``): ``losscalls``
(every standard loss call, its items) -> ``inplace`` (the oracle from the run's own backward passes,
``StepNumbers`` per step) -> ``watch`` (the same diagnose and report stages); ``run_cli``: the command.
"""

from .api import verify
from .codes import CODES, Code
from .errors import VerifyError
from .report import EXIT_STATUS, Finding, Report, StepRow
from .watch import watch

__all__ = ["CODES", "EXIT_STATUS", "Code", "Finding", "Report", "StepRow", "VerifyError", "verify", "watch"]
