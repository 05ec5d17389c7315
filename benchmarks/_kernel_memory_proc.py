"""The kernel memory section's process reader: a process's peak and current resident memory from /proc, its
private memory (USS), and a sampler that adds up its descendants (a kernel's distributed ranks, a DataLoader's
workers, or, sampled from the bench's own process, the kernels it starts one after another) while they live.

A process's private memory (USS, ``private``) is what it alone maps: Private_Clean + Private_Dirty of
/proc/<pid>/smaps_rollup, the memory its exit would give back. Pages of a library that another live process
maps too (torch's, once two kernels run) are shared, not private.

A process's own peak is exact: the kernel keeps it (VmHWM). Processes that come and go have no peak a
parent can read after they exit, so the tree's peak (the process and its descendants at the same moment)
is the largest sum of their resident sets over samples taken every ``SAMPLE_S`` seconds: a descendant that
lives less than a sample's interval can be missed, and the sum can only be lower than the truth.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 2**20
SAMPLE_S = 0.02  # a rank of lesson 8 lives for seconds: 20 ms samples see it many times
FIELDS = {"peak": "VmHWM", "rss": "VmRSS", "anon": "RssAnon"}  # bytes of: peak resident, resident, private


def status(pid: int) -> dict[str, int]:
    """``pid``'s peak resident bytes (VmHWM), resident bytes now (VmRSS) and the private part of those
    (RssAnon: what a second process of the same program does not share); 0 for a field a zombie lacks."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = {}
    for key, name in FIELDS.items():
        m = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
        found[key] = int(m.group(1)) * 1024 if m else 0
    return found


def private(pid: int) -> int:
    """``pid``'s private bytes (USS): Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup."""
    return sum(private_parts(pid))


def private_parts(pid: int) -> tuple[int, int]:
    """``pid``'s private bytes, clean and dirty. Clean ones are file pages (a library's code) that no other
    live process maps at this moment: they move to shared as soon as one does, so they depend on what else
    runs; dirty ones (the heap, written pages) are the process's whatever else runs."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    kib = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(Private_\w+):\s+(\d+) kB", text, re.M)}
    return kib["Private_Clean"] * 1024, kib["Private_Dirty"] * 1024


def tree_private(pid: int) -> tuple[int, int]:
    """The private bytes of ``pid`` and of its live descendants together, and how many descendants counted."""
    total, counted = private(pid), 0
    for child in descendants(pid):
        try:
            total += private(child)
        except OSError:  # it exited meanwhile: nothing of it is live
            continue
        counted += 1
    return total, counted


def descendants(pid: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), but those in ``exclude`` and their
    own descendants."""
    found, todo = [], [pid]
    while todo:
        kids = [k for k in _children(todo.pop()) if k not in exclude]
        found += kids
        todo += kids
    return found


def children(pid: int) -> list[int]:
    """``pid``'s live children now."""
    return _children(pid)


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    try:
        files = list(tasks.glob("*/children"))
    except OSError:
        return []
    if files:
        kids = []
        for f in files:
            try:
                kids += [int(k) for k in f.read_text().split()]
            except OSError:  # the thread ended meanwhile
                continue
        return kids
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if _parent(p) == pid]  # no children files


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Tree:
    """The resident memory of process ``pid`` and its descendants together, sampled every ``SAMPLE_S`` s in
    a thread while the with-block runs (or by calling ``sample()``).

    ``peak``: the largest sum over one sample of the process's and its descendants' resident bytes;
    ``children_peak``: the largest sum of the descendants' alone; ``children``: every descendant seen, with
    the largest peak (VmHWM) read from it while it lived; ``most_children``: the most direct children alive
    in one sample (the route's kernels: 1 when each is shut down before the next starts). Processes in
    ``exclude`` (children that were there before, such as multiprocessing's resource tracker that an earlier
    section started) are left out, with their descendants.
    """

    pid: int
    interval: float = SAMPLE_S
    peak: int = 0
    children_peak: int = 0
    children: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    most_children: int = 0
    exclude: frozenset[int] = frozenset()

    def sample(self) -> None:
        try:
            own = status(self.pid)["rss"]
        except OSError:  # the process has exited
            return
        kids = 0
        for child in descendants(self.pid, self.exclude):
            try:
                s = status(child)
            except OSError:
                continue
            kids += s["rss"]
            self.children[child] = max(self.children.get(child, 0), s["peak"])
        self.samples += 1
        alive = [k for k in _children(self.pid) if k not in self.exclude]
        self.most_children = max(self.most_children, len(alive))
        self.children_peak = max(self.children_peak, kids)
        self.peak = max(self.peak, own + kids)

    def __enter__(self) -> Tree:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.interval):
            self.sample()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
