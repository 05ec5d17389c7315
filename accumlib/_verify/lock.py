"""One verify run at a time in a process.

While it records, verify changes torch process-wide: GradScaler's and the schedulers' ``step``,
``DataLoader.__iter__``, torch's clip function (``clips.py``) and a global optimizer step hook. Two
runs overlapping in two threads (a lesson's widget runs verify from its own thread) would record
each other's steps, and runs that end out of order would restore each other's patches. So a second
run is refused by name while one runs, before it touches anything, and the first run's report is
unaffected. The same thread may enter again (``verify_trainer`` holds it around ``verify``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .errors import VerifyBusy

_lock = threading.RLock()
_running: list[tuple[str, str]] = []  # (entry point, thread name) of the run that holds the lock


@contextlib.contextmanager
def one_run(entry: str) -> Iterator[None]:
    """Hold the process's verify lock for ``entry`` (e.g. ``"accumlib.verify"``), or refuse at once."""
    if not _lock.acquire(blocking=False):
        held, thread = _running[0] if _running else ("accumlib.verify", "another thread")
        raise VerifyBusy(
            f"{entry} was called while {held} is still judging a run in this process (thread "
            f"{thread!r}): verify patches torch process-wide while it records, so runs must take turns. "
            "Wait for that run to return (a widget: wait for its output) and call it again"
        )
    _running.append((entry, threading.current_thread().name))
    try:
        yield
    finally:
        _running.pop()
        _lock.release()


__all__ = ["one_run"]
