"""Every exception verify raises, in one home: what each door catches, and why some are BaseExceptions.

``VerifyError`` and the usage errors reach the user; ``StopRun`` and ``Fallback`` are verify's own control
flow through the user's loop, BaseExceptions so that a loop's ``except Exception`` does not swallow them.
"""

from __future__ import annotations


class VerifyError(RuntimeError):
    """verify itself could not judge the run: it failed inside its own stages (a case it does not
    handle), not in the user's code. The command line exits 4 on it, not 3 ("your code raised").

    >>> import accumlib
    >>> # an exception from the loop itself propagates as it is
    >>> issubclass(accumlib.VerifyError, RuntimeError)
    True
    """


class VerifyBusy(RuntimeError):
    """Another verify run is recording in this process: runs take turns (``lock.one_run``)."""


class UsageError(ValueError):
    """The command line's target or arguments are wrong (``accumlib verify`` exits 2)."""


class ItemLossesError(ValueError):
    """``item_losses`` misnamed, or its function broke its contract during the run: a usage error
    (``accumlib run`` exits 2), raised as a ValueError naming the argument, the rule and the value."""


class StopRun(BaseException):
    """Raised from the step hook after ``max_steps`` judged steps; a BaseException, so a loop's
    ``except Exception`` does not swallow it."""


class Fallback(BaseException):
    """The in-place engine cannot vouch for a step: verify runs the loop again on the recompute oracle.
    A BaseException, as ``StopRun`` is: a loop's ``except Exception`` does not swallow it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


__all__ = ["Fallback", "ItemLossesError", "StopRun", "UsageError", "VerifyBusy", "VerifyError"]
