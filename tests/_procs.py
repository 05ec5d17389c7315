"""Child processes for the tests: a free port for a rendezvous, and a run bounded in time.

A torchrun job or a training script starts processes of its own (ranks, data workers); killing only the
process the test started would leave the rest running, holding ports and cores for the tests after it. So
``run_bounded`` starts the command in a new session (its own process group) and kills the whole group when
it outlives its bound, and also when the test is interrupted some other way (pytest-timeout, Ctrl-C). One
copy here, so that every test that launches such a job bounds and stops it the same way.

A process that starts a session of its own, as torch's elastic agent (torchrun) starts each rank, is not in
that group: so the command's descendants are also found by their parent ids (``/proc``) before anything is
killed, and killed with it. Otherwise an orphaned rank runs on, and, holding the output pipe open, keeps
the test waiting for output after the kill.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on now on 127.0.0.1 (a rendezvous or a server's port).

    Another process may take it before the caller binds it: callers that cannot tolerate that retry.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), by the parent ids in /proc/*/stat."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command's name may hold spaces and parentheses
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the command's process group and every descendant, wherever its session."""
    below = descendants(proc.pid)  # first: once the parent dies its children are re-parented
    for kill in (
        lambda: os.killpg(proc.pid, signal.SIGKILL),
        *(lambda p=p: os.kill(p, signal.SIGKILL) for p in below),
    ):
        try:
            kill()
        except ProcessLookupError:
            pass


def run_bounded(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    merge_stderr: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (text output captured) in its own process group and return its CompletedProcess.

    Past ``timeout`` seconds the whole group is killed (SIGKILL) and ``subprocess.TimeoutExpired`` raised,
    its ``output`` and ``stderr`` the text the command wrote until then, for the caller's message. Any other
    way out (an exception in the wait, pytest-timeout, KeyboardInterrupt) kills the group too. With
    ``merge_stderr`` stderr goes into stdout (one interleaved log) and ``stderr`` is ``""``.
    """
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_all(proc)
        exc.output, exc.stderr = proc.communicate()
        raise
    finally:
        if proc.poll() is None:  # interrupted some other way: leave nothing running
            _kill_all(proc)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")


def run_job(argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
    """A multi-rank job's launcher (torchrun, accelerate launch) under ``run_bounded``, stderr in its log:
    its exit status and log. Past ``timeout`` the test fails with the log's tail."""
    import pytest

    try:
        done = run_bounded(argv, timeout=timeout, cwd=cwd, env=env, merge_stderr=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.output or ""
        pytest.fail(f"the job ran past {timeout} s; its process group was killed\n{out[-3000:]}")
    return done.returncode, done.stdout
