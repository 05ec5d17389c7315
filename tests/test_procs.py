"""The tests' bounded runs leave nothing behind: a child that starts a session of its own (as torchrun
starts each rank) is killed with the command, and the wait for output ends with it. Before, that child
ran on and, holding the output pipe, kept the test waiting past its own bound (seen with Accelerate's
example on 2 ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _procs import descendants, run_bounded

CHILD = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_a_child_in_its_own_session_is_killed_with_the_command_past_its_bound():
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_bounded([sys.executable, "-c", CHILD], timeout=3)
    took = time.monotonic() - started
    orphan = int(err.value.output.split()[0])
    time.sleep(0.5)
    assert not alive(orphan), "the child in its own session outlived the bound"
    assert took < 20, took  # the wait for output ended with the kill


def test_descendants_are_found_by_their_parents():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    pids = [proc.pid]
    try:
        pids.append(int(proc.stdout.readline()))
        assert pids[1] in descendants(proc.pid) and descendants(os.getpid()).count(proc.pid) == 1
    finally:
        for pid in pids:
            os.kill(pid, 9)
        proc.wait()
