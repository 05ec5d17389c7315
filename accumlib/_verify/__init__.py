"""The implementation of ``accumlib.verify`` (private: import ``accumlib.verify``, the function).

One pipeline, data passed forward only, a module per stage:

- ``record``: hooks on verify's copy of the model, window state, the clip / GradScaler /
  scheduler patches; feeds the oracle at every micro-batch boundary and leaves ``StepNumbers``;
- ``oracle``: the true gradient micro-batch by micro-batch (``accumlib.oracle.sum_grad``) and
  the per-micro-batch fit of ``.grad``, in a few parameter-sized buffers;
- ``diagnose``: a pure function of a step's numbers -> its codes;
- ``report``: ``Report``, ``StepRow``, ``Finding``;
- ``codes``: the one table of finding codes (kind, message, fix); ``api``: ``verify`` itself.
"""

from .api import VerifyError, verify
from .codes import CODES, Code
from .report import EXIT_STATUS, Finding, Report, StepRow

__all__ = ["CODES", "EXIT_STATUS", "Code", "Finding", "Report", "StepRow", "VerifyError", "verify"]
