"""Mutants of accumlib/distributed/: the DDP loop, the loopback launcher, the all-reduce counter, the
experiment and its verdict, and `accumlib ddp`.

The in-process checks come first: a mutant they catch stops there (-x) before any rank is spawned.
tests/test_verify_ranks.py and tests/test_lesson_08.py also launch ranks, but through accumlib/_verify
and the notebook; they add minutes and no mutant here needs them.
"""

from mutate import Mutant

TESTS = ["tests/test_distributed_checks.py", "tests/test_distributed.py"]

P, E, L, C, X = (
    "accumlib/distributed/loop.py",
    "accumlib/distributed/experiment.py",
    "accumlib/distributed/launch.py",
    "accumlib/distributed/comm.py",
    "accumlib/distributed/cli.py",
)
MUTANTS = [
    # the loop
    Mutant(
        "the window's item count not all-reduced (each rank divides by its own)",
        P,
        "        dist.all_reduce(n)  # N: every rank's items",
        "        # N: every rank's items",
    ),
    Mutant(
        "DDP's average over ranks forgotten (1/N, not R/N)",
        P,
        "scale = world / int(n) if",
        "scale = 1.0 / int(n) if",
    ),
    Mutant(
        "no_sync over the last micro-batch too (never all-reduced)",
        P,
        "defer = j < len(window) - 1",
        "defer = j < len(window)",
    ),
    Mutant(
        "the default no_sync around the backward only",
        P,
        '    no_sync: str = "forward+backward",\n',
        '    no_sync: str = "backward",\n',
    ),
    Mutant("per-rank counts by default", P, "global_counts: bool = True", "global_counts: bool = False"),
    Mutant("shards of different lengths not refused", P, "    if int(n[0]) != -int(n[1]):", "    if False:"),
    Mutant(
        "the shard-length check sums lengths instead of taking the max",
        P,
        "op=dist.ReduceOp.MAX",
        "op=dist.ReduceOp.SUM",
    ),
    Mutant("an unknown no_sync accepted", P, '    check_choice("no_sync", no_sync, NO_SYNC)\n', ""),
    Mutant(
        "count_items not checked against the losses",
        P,
        "                check_count(count_items(batch), losses)\n",
        "",
    ),
    Mutant("gradients not zeroed after the step", P, "        optimizer.zero_grad(set_to_none=True)\n", ""),
    Mutant(
        "the logged loss is this rank's (loss sums not all-reduced)",
        P,
        "    dist.all_reduce(loss_sums)",
        "    pass",
    ),
    Mutant(
        "the logged loss divided by this rank's items", P, "counts.append(int(n))", "counts.append(n_local)"
    ),
    # the experiment and its verdict
    Mutant(
        "the oracle over this rank's window, not every rank's",
        E,
        "batches = [b for w in union for b in w]",
        "batches = list(window)",
    ),
    Mutant("the mean of rank means not divided by the world size", E, "(flat / world).split(", "flat.split("),
    Mutant(
        "the parameter spread measured on this rank only (rank 0 against itself)",
        E,
        'mine["spread"].append(max(float((p - every[0]).abs().max()) for p in every))',
        'mine["spread"].append(float((flat - every[0]).abs().max()))',
    ),
    Mutant(
        "the per-rank counts variant computes global counts",
        E,
        '"per-rank counts": dict(no_sync="forward+backward", global_counts=False)',
        '"per-rank counts": dict(no_sync="forward+backward", global_counts=True)',
    ),
    Mutant(
        "shard_loader drops the tail instead of padding",
        E,
        "shuffle=False, drop_last=False",
        "shuffle=False, drop_last=True",
    ),
    Mutant(
        "shard_loader ignores the batch size asked for",
        E,
        "batch_size=batch_size or task.batch_size",
        "batch_size=task.batch_size",
    ),
    Mutant(
        "an unknown variant accepted", E, 'check_choice("variant", self.variant, tuple(VARIANTS))', "None"
    ),
    Mutant(
        "run_specs does not pass its timeout on",
        E,
        "world_size=world_size, timeout=timeout, port=port)\n        with open",
        "world_size=world_size, port=port)\n        with open",
    ),
    Mutant(
        "DDPReport: the tolerance itself fails (< for <=)",
        E,
        "max_rel_error <= FLOAT32_RTOL for v in COMM_VARIANTS",
        "max_rel_error < FLOAT32_RTOL for v in COMM_VARIANTS",
    ),
    Mutant(
        "DDPReport: exact tolerance loosened 10x",
        E,
        "max_rel_error <= FLOAT32_RTOL for v in COMM_VARIANTS",
        "max_rel_error <= 10 * FLOAT32_RTOL for v in COMM_VARIANTS",
    ),
    Mutant(
        "DDPReport: only no_sync judged against the oracle",
        E,
        "for v in COMM_VARIANTS)\n",
        'for v in ("no_sync",))\n',
    ),
    Mutant(
        "DDPReport: parameters may differ by rounding",
        E,
        "max(r.param_spread) == 0.0 for r",
        "max(r.param_spread) <= FLOAT32_RTOL for r",
    ),
    Mutant("DDPReport: k rounds on any step, not all", E, "k_rounds = all(", "k_rounds = any("),
    Mutant(
        "DDPReport: k rounds counted against k, not the window's m",
        E,
        "c[0] == m * ref_c[0]",
        "c[0] == self.accum_steps * ref_c[0]",
    ),
    Mutant(
        "DDPReport: the per-rank floor itself counts (>= for >)",
        E,
        '"per-rank counts"].max_rel_error > PER_RANK_MIN_ERROR',
        '"per-rank counts"].max_rel_error >= PER_RANK_MIN_ERROR',
    ),
    Mutant(
        "DDPReport: the per-rank floor lowered to one rounding tolerance",
        E,
        "PER_RANK_MIN_ERROR = 10 * FLOAT32_RTOL",
        "PER_RANK_MIN_ERROR = FLOAT32_RTOL",
    ),
    Mutant(
        "DDPReport: one rank must show the per-rank mistake too",
        E,
        "wrong = self.world_size == 1 or ",
        "wrong = ",
    ),
    Mutant(
        "a run's error is its best rank's, not its worst",
        E,
        "max((max(step) for step in self.rel_errors)",
        "max((min(step) for step in self.rel_errors)",
    ),
    # the launcher
    Mutant(
        "timeout=0 accepted",
        L,
        'check_float("timeout", timeout, low=0, low_open=True)',
        'check_float("timeout", timeout, low=0)',
    ),
    Mutant(
        "the launch's timeout read in minutes",
        L,
        "deadline = time.monotonic() + timeout",
        "deadline = time.monotonic() + 60 * timeout",
    ),
    Mutant(
        "the launch's timeout read in milliseconds",
        L,
        "deadline = time.monotonic() + timeout",
        "deadline = time.monotonic() + timeout / 1000",
    ),
    Mutant(
        "the ranks' collective timeout read in milliseconds",
        L,
        "world_size=world_size, timeout=datetime.timedelta(seconds=timeout)\n",
        "world_size=world_size, timeout=datetime.timedelta(milliseconds=timeout)\n",
    ),
    Mutant(
        "the per-rank memory bound dropped",
        L,
        "        limit = min(limit, max(1, available // RANK_MEMORY_BYTES))\n",
        "        pass\n",
    ),
    Mutant(
        "available memory's kB read as bytes",
        L,
        'int(info["MemAvailable"].split()[0]) * 1024',
        'int(info["MemAvailable"].split()[0])',
    ),
    Mutant("free memory read, not available memory", L, 'info["MemAvailable"]', 'info["MemFree"]'),
    Mutant(
        "a rank's memory bound in KiB, not MiB",
        L,
        "RANK_MEMORY_BYTES = 512 * 2**20",
        "RANK_MEMORY_BYTES = 512 * 2**10",
    ),
    Mutant(
        "no rank at all when memory is short",
        L,
        "max(1, available // RANK_MEMORY_BYTES)",
        "available // RANK_MEMORY_BYTES",
    ),
    Mutant("one rank per core", L, "limit = RANKS_PER_CORE * cores", "limit = cores"),
    Mutant(
        "a world size at the machine's limit refused",
        L,
        "if world_size > (most := max_world_size()):",
        "if world_size >= (most := max_world_size()):",
    ),
    Mutant(
        "port 0 accepted",
        L,
        'check_int("port", port, low=1, high=65535)',
        'check_int("port", port, low=0, high=65535)',
    ),
    Mutant("a closure accepted", L, ' or "<locals>" in qualname', ""),
    Mutant(
        "gloo left to pick its own interface",
        L,
        '    if interface:\n        os.environ["GLOO_SOCKET_IFNAME"]',
        '    if False:\n        os.environ["GLOO_SOCKET_IFNAME"]',
    ),
    Mutant("a user's GLOO_SOCKET_IFNAME overridden", L, '        or "GLOO_SOCKET_IFNAME" in environ\n', ""),
    Mutant(
        "ranks left running after the launch",
        L,
        "        finally:\n            _stop(ctx.processes)\n",
        "        finally:\n            pass\n",
    ),
    Mutant(
        "the ranks' stderr not copied back",
        L,
        "            _replay_stderr(log_dir, world_size)\n",
        "            pass\n",
    ),
    Mutant(
        "a rank killed by a signal: what it printed dropped",
        L,
        'mp.ProcessExitedException(\n                f"{err.msg}{tails}"',
        'mp.ProcessExitedException(\n                f"{err.msg}"',
    ),
    Mutant(
        "ranks outlive a killed launcher (no death signal)",
        L,
        "        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)\n",
        "        pass\n",
    ),
    # the all-reduce counter
    Mutant("bytes counted as elements", C, "buf.numel() * buf.element_size()", "buf.numel()"),
    Mutant(
        "take() does not start again from zero", C, "        self.calls = self.bytes = 0\n", "        pass\n"
    ),
    Mutant(
        "a plain module accepted by count_allreduce",
        C,
        "    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):\n        raise",
        "    if False:\n        raise",
    ),
    # the command line
    Mutant("--timeout not passed to the experiment", X, "            timeout=args.timeout,\n", ""),
    Mutant("exit status 0 whatever the verdict", X, "return 0 if report.ok else 1", "return 0"),
]
