"""Peak resident memory of a run, for verify_scale: the kernel's high-water mark, reset per run (or
sampled every 2 ms where it cannot be reset), and the address-space guard a run is held under.
"""

from __future__ import annotations

import gc
import re
import threading
from typing import Any

GUARD_BYTES = 12 * 2**30  # the most address space one run may take: a run past it fails, never swaps


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))


class Peak:
    """Peak resident bytes of this process over a with-block, above its resident bytes at entry.

    The kernel's high-water mark (VmHWM), reset at entry through /proc/self/clear_refs; where that
    reset is refused, a thread samples VmRSS every 2 ms instead (and may miss a short spike).
    """

    def __enter__(self) -> Peak:
        gc.collect()
        self.base = _status_kib("VmRSS") * 1024
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak resident set size to the current one
            self.exact = _status_kib("VmHWM") * 1024 <= self.base + 2**20
        except OSError:
            self.exact = False
        self.sampled, self._stop = self.base, threading.Event()
        if not self.exact:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.sampled = max(self.sampled, _status_kib("VmRSS") * 1024)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if not self.exact:
            self._thread.join()
        self.peak = (
            _status_kib("VmHWM") * 1024 if self.exact else max(self.sampled, _status_kib("VmRSS") * 1024)
        )
        self.extra = self.peak - self.base


def default_guard() -> int:
    """12 GiB, or 3/4 of the memory free now where that is less: a machine shared with other work."""
    try:
        available = _meminfo("MemAvailable")
    except (OSError, AttributeError):
        return GUARD_BYTES
    return min(GUARD_BYTES, int(available * 0.75))


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1)) * 1024
