"""Start a process group on loopback (or under torchrun) with bounded time and no leftovers.

``launch(fn, args, world_size=2)`` spawns ``world_size`` processes, each running
``fn(rank, world_size, *args)`` inside an initialized process group (gloo on CPU,
NCCL when every rank has a GPU). A rank that raises fails the launch with its
traceback; a launch that runs past ``timeout`` is stopped. Either way every child is
terminated (then killed) before ``launch`` returns or raises.

Each rank's standard error goes to a file that ``launch`` copies to its own
``sys.stderr`` afterwards, prefixed ``[rank r]``, and whose last lines it puts into the
error when a rank fails. A rank killed by a signal (a C++ abort inside gloo or the
rendezvous store) writes no Python traceback; what it printed is the only clue, and in a
notebook or under pytest a child's raw stderr is otherwise lost. (CI once saw rank 0
die by SIGABRT during a launch with nothing kept; it did not happen again here in 25
launches on loaded cores, so its cause is still unknown.)

``fn`` must be importable (a module-level function in an installed module): spawned
children import it by name, so a function defined in a notebook cannot be sent.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..checks import check_float, check_int

HOST = "127.0.0.1"
# How long a rank may wait inside one collective before gloo gives up on its peers:
# long enough for a slow import on a busy 2-core machine, short enough that a lost
# peer surfaces as an error rather than a hang.
COLLECTIVE_TIMEOUT_S = 60.0
# After SIGTERM, how long a child gets to exit before SIGKILL.
KILL_GRACE_S = 5.0
# How many of a failed rank's last stderr lines go into the launch's error.
STDERR_TAIL_LINES = 30
# Spawned ranks a machine can hold: each rank is a Python process with torch imported
# (peak RSS measured at 0.35 GB running the lesson's DDP loop; 0.5 GB leaves headroom),
# and start-up dominates on a small machine (lm-tokens, one spec, 2 cores: 4 ranks 20 s,
# 8 ranks 40 s, 16 ranks 89 s), so beyond 8 ranks per core a launch mostly waits.
RANK_MEMORY_BYTES = 512 * 2**20
RANKS_PER_CORE = 8


def max_world_size() -> int:
    """The most ranks ``launch`` spawns here: bounded by the usable cores and the available memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = RANKS_PER_CORE * cores
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        available = int(info["MemAvailable"].split()[0]) * 1024
        limit = min(limit, max(1, available // RANK_MEMORY_BYTES))
    except (OSError, KeyError, ValueError):
        pass  # not Linux: cores only
    return limit


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port(port: object, host: str = HOST) -> int:
    """``port`` must be an integer in 1..65535 that can be bound on ``host`` now."""
    port = check_int("port", port, low=1, high=65535)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as err:
            raise ValueError(
                f"port must be free on {host} for the rendezvous (got {port}, in use: {err.strerror})"
            ) from None
    return port


def _check_importable(fn: Callable[..., Any]) -> None:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            "fn must be a module-level function importable by spawned processes, e.g. "
            f"mypackage.train.worker (got {module}.{qualname}; functions defined in a "
            "notebook, a script's __main__, a lambda or a closure cannot be imported by the children)"
        )


def default_backend() -> str:
    """NCCL when CUDA is present (one GPU per rank), gloo on CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_from_env(backend: str | None = None, timeout: float = COLLECTIVE_TIMEOUT_S) -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    import torch.distributed as dist

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(
            f"environment must set {missing} to join a process group; start this with torchrun "
            "(got none of them)"
        )
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def gloo_interface(backend: str, host: str, environ: Mapping[str, str]) -> str | None:
    """The network interface gloo should bind to for a launch on ``host``, or None to leave gloo's choice.

    Left alone, gloo binds to whatever address the machine's *hostname* resolves to, which
    in containers and sandboxes can be an interface other than the loopback the rendezvous
    uses (torch then warns, or cannot connect). When every peer is on this machine,
    loopback is the one right interface. A user's own ``GLOO_SOCKET_IFNAME`` is kept.
    """
    if (
        backend != "gloo"
        or "GLOO_SOCKET_IFNAME" in environ
        or not _loopback(host)
        or "lo" not in _interfaces()
    ):
        return None
    return "lo"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _die_with_parent(parent: int) -> None:
    """Ranks must not outlive the launcher: a SIGKILLed launcher (then ``accumlib ddp``) once left 64 rank
    processes behind.

    torch's spawn asks the kernel for SIGINT on the parent's death, which a rank busy in C++
    (importing torch, waiting in a gloo collective) does not act on; SIGKILL cannot be ignored.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before the line above took effect
        os._exit(1)


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    host: str,
    port: int,
    backend: str,
    timeout: float,
    args: Sequence[Any],
    log_dir: str,
    parent: int,
) -> None:
    import torch.distributed as dist

    _die_with_parent(parent)

    # Everything this rank writes to fd 2 (Python tracebacks and warnings, and C++ aborts,
    # which never reach Python) lands in its own file; launch() copies it back.
    log = os.open(os.path.join(log_dir, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    torch.set_num_threads(1)  # ranks share the machine's cores; one thread each avoids oversubscription
    os.environ.update(
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    interface = gloo_interface(backend, host, os.environ)
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout)
    )
    fn(rank, world_size, *args)
    # Only on success: tearing the group down on failure would break the peers' connections
    # before this rank's traceback is written, and the peers' errors would look like the cause.
    # The barrier keeps a rank from tearing down while a peer is still inside a collective.
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's and C++'s teardown at exit: gloo and the rendezvous store
    # keep threads there, and a joinable std::thread destroyed at exit aborts the process
    # ("terminate called without an active exception", SIGABRT), which a fresh-clone CI run
    # showed in rank 1 after its work was done and its results written. Flushed first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _interfaces() -> set[str]:
    try:
        return {name for _, name in socket.if_nameindex()}
    except OSError:
        return set()


def launch(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    world_size: int = 2,
    port: int | None = None,
    backend: str | None = None,
    timeout: float = 120.0,
    host: str = HOST,
) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes on ``host``.

    Raises ``torch.multiprocessing.ProcessRaisedException`` (with the rank's traceback)
    when a rank fails, ``TimeoutError`` after ``timeout`` seconds; no child outlives the call.

    >>> from accumlib.distributed import launch, free_port   # doctest: +SKIP
    >>> launch(mypackage.train.worker, (spec, out), world_size=2)  # doctest: +SKIP
    """
    world_size = check_int("world_size", world_size, low=1)
    if world_size > (most := max_world_size()):
        raise ValueError(
            f"world_size must be <= {most} on this machine ({RANKS_PER_CORE} ranks per usable core, "
            f"{RANK_MEMORY_BYTES // 2**20} MiB of available memory per rank) (got {world_size})"
        )
    port = free_port(host) if port is None else check_port(port, host)
    timeout = check_float("timeout", timeout, low=0, low_open=True)  # seconds
    _check_importable(fn)
    backend = backend or default_backend()
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            "world_size must be <= the number of GPUs for nccl "
            f"(got {world_size}, {torch.cuda.device_count()} GPUs)"
        )
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="accumlib-launch-") as log_dir:
        ctx = mp.start_processes(
            _entry,
            args=(
                fn,
                world_size,
                host,
                port,
                backend,
                min(COLLECTIVE_TIMEOUT_S, timeout),
                tuple(args),
                log_dir,
                os.getpid(),
            ),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            # join() raises ProcessRaisedException/ProcessExitedException as soon as one rank fails
            while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"distributed run did not finish within timeout={timeout} s "
                        f"(world_size={world_size}); ranks stopped{_stderr_tails(log_dir, world_size)}"
                    )
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
            _stop(ctx.processes)
            raise _every_failure(ctx, err, _stderr_tails(log_dir, world_size)) from None
        finally:
            _stop(ctx.processes)
            _replay_stderr(log_dir, world_size)


def _read_log(log_dir: str, rank: int) -> str:
    try:
        with open(os.path.join(log_dir, f"rank{rank}.stderr"), errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _replay_stderr(log_dir: str, world_size: int) -> None:
    for rank in range(world_size):
        text = _read_log(log_dir, rank)
        if text.strip():
            sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").split("\n")))


def _stderr_tails(log_dir: str, world_size: int) -> str:
    parts = []
    for rank in range(world_size):
        lines = _read_log(log_dir, rank).rstrip("\n").split("\n")
        if any(line.strip() for line in lines):
            tail = "\n".join(lines[-STDERR_TAIL_LINES:])
            parts.append(f"\n\n-- rank {rank}'s last stderr lines:\n{tail}")
    return "".join(parts)


def _every_failure(ctx: Any, err: Exception, tails: str = "") -> Exception:
    """One rank's failure makes its peers fail too (a reset connection); report every rank, first
    failure first.

    torch's join() reports whichever failed rank it notices first, which may be a peer
    that only lost its connection; the earliest traceback written is the cause.
    """
    import pickle

    import torch.multiprocessing as mp

    found = []
    for rank, path in enumerate(ctx.error_files):
        if os.access(path, os.R_OK) and os.path.getsize(path) > 0:
            with open(path, "rb") as fh:
                found.append((os.path.getmtime(path), rank, pickle.load(fh)))
    if not found:
        # Killed by a signal or exited without a Python traceback: what it printed is all there is.
        if isinstance(err, mp.ProcessExitedException):
            return mp.ProcessExitedException(
                f"{err.msg}{tails}", err.error_index, err.error_pid, err.exit_code, err.signal_name
            )
        return mp.ProcessRaisedException(f"{err.msg}{tails}", err.error_index, err.error_pid)
    found.sort()
    msg = "".join(
        f"\n\n-- rank {rank} {'failed first' if n == 0 else 'failed next'} with the following error:\n{trace}"
        for n, (_, rank, trace) in enumerate(found)
    )
    first = found[0][1]
    return mp.ProcessRaisedException(msg + tails, first, ctx.processes[first].pid)


def _stop(processes: Sequence[Any]) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + KILL_GRACE_S
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
