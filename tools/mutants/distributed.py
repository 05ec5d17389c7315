"""Mutants of accumlib/distributed/: the DDP loop, the loopback launcher, the all-reduce counter, the
experiment and its verdict, and `accumlib ddp`.

The in-process checks come first: a mutant they catch stops there (-x) before any rank is spawned.
tests/test_verify_ranks.py and tests/test_lesson_08.py also launch ranks, but through accumlib/_verify
and the notebook; they add minutes and no mutant here needs them.
"""

from mutate import Mutant

TESTS = ["tests/test_distributed_checks.py", "tests/test_distributed.py"]

MUTANTS = [
    # the loop
    Mutant(
        "the window's item count not all-reduced (each rank divides by its own)",
        "delete",
        "n = torch.tensor(n_local, device=where)\ndist.all_reduce(n)",
        node="dist.all_reduce(n)",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "DDP's average over ranks forgotten (1/N, not R/N)",
        "replace",
        "world / int(n)",
        "1.0",
        node="world",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "no_sync over the last micro-batch too (never all-reduced)",
        "drop-term",
        "defer = j < len(window) - 1",
        "1",
        node="len(window) - 1",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "the default no_sync around the backward only",
        "constant",
        "'forward+backward'",
        "'backward'",
        at=0,
        within="ddp_accumulate",
        killers=(
            "tests/test_distributed.py::test_the_loop_with_its_defaults_steps_the_large_batch_gradient_with_one_all_reduce_per_step",
        ),
    ),
    Mutant(
        "per-rank counts by default",
        "constant",
        "True",
        "False",
        at=0,
        within="ddp_accumulate",
        killers=(
            "tests/test_distributed.py::test_the_loop_with_its_defaults_steps_the_large_batch_gradient_with_one_all_reduce_per_step",
        ),
    ),
    Mutant(
        "shards of different lengths not refused",
        "replace",
        "int(n[0]) != -int(n[1])",
        "False",
        killers=("tests/test_distributed.py::test_shards_of_different_lengths_are_refused_on_every_rank",),
    ),
    Mutant(
        "the shard-length check sums lengths instead of taking the max",
        "replace",
        "dist.all_reduce(n, op=dist.ReduceOp.MAX)",
        "dist.ReduceOp.SUM",
        node="dist.ReduceOp.MAX",
        killers=("tests/test_distributed.py::test_shards_of_different_lengths_are_refused_on_every_rank",),
    ),
    Mutant(
        "an unknown no_sync accepted",
        "delete",
        "check_choice('no_sync', no_sync, NO_SYNC)",
        killers=(
            "tests/test_distributed.py::test_the_loop_refuses_an_unknown_no_sync_and_a_wrong_item_count",
        ),
    ),
    Mutant(
        "count_items not checked against the losses",
        "delete",
        "losses = checked_losses(item_losses, model, to_device(batch, device))\n"
        "check_count(count_items(batch), losses)",
        node="check_count(count_items(batch), losses)",
        killers=(
            "tests/test_distributed.py::test_the_loop_refuses_an_unknown_no_sync_and_a_wrong_item_count",
        ),
    ),
    Mutant(
        "gradients not zeroed after the step",
        "delete",
        "optimizer.zero_grad(set_to_none=True)\nsums.append(total)",
        node="optimizer.zero_grad(set_to_none=True)",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "the logged loss is this rank's (loss sums not all-reduced)",
        "replace",
        "dist.all_reduce(loss_sums)",
        "pass",
        killers=("tests/test_distributed.py::test_logged_loss_is_the_global_window_mean",),
    ),
    Mutant(
        "the logged loss divided by this rank's items",
        "replace",
        "counts.append(int(n))",
        "n_local",
        node="int(n)",
        killers=("tests/test_distributed.py::test_logged_loss_is_the_global_window_mean",),
    ),
    # the experiment and its verdict
    Mutant(
        "the oracle over this rank's window, not every rank's",
        "replace",
        "[b for w in union for b in w]",
        "list(window)",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "the mean of rank means not divided by the world size",
        "drop-factor",
        "flat / world",
        "world",
        killers=("tests/test_distributed.py::test_per_rank_counts_are_wrong_on_token_counts",),
    ),
    Mutant(
        "the parameter spread measured on this rank only (rank 0 against itself)",
        "replace",
        "max((float((p - every[0]).abs().max()) for p in every))",
        "float((flat - every[0]).abs().max())",
        killers=("tests/test_distributed.py::test_the_parameter_spread_sees_a_rank_that_drifted",),
    ),
    Mutant(
        "the per-rank counts variant computes global counts",
        "constant",
        "dict(no_sync='forward+backward', global_counts=False)",
        "True",
        node="False",
        killers=("tests/test_distributed.py::test_per_rank_counts_are_wrong_on_token_counts",),
    ),
    Mutant(
        "shard_loader drops the tail instead of padding",
        "constant",
        "DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)",
        "True",
        node="False",
        at=1,
        killers=(
            "tests/test_distributed_checks.py::test_each_rank_gets_an_interleaved_shard_padded_to_equal_length",
        ),
    ),
    Mutant(
        "shard_loader ignores the batch size asked for",
        "drop-clause",
        "DataLoader(dataset, batch_size=batch_size or task.batch_size, sampler=sampler, "
        "collate_fn=task.collate_fn)",
        "batch_size",
        node="batch_size or task.batch_size",
        killers=(
            "tests/test_distributed_checks.py::test_each_rank_gets_an_interleaved_shard_padded_to_equal_length",
        ),
    ),
    Mutant(
        "an unknown variant accepted",
        "replace",
        "check_choice('variant', self.variant, tuple(VARIANTS))",
        "None",
        killers=("tests/test_distributed_checks.py::test_an_unknown_variant_is_refused",),
    ),
    Mutant(
        "run_specs does not pass its timeout on",
        "replace",
        "launch(worker, ([asdict(s) for s in specs], out), world_size=world_size, timeout=timeout, "
        "port=port)",
        "launch(worker, ([asdict(s) for s in specs], out), world_size=world_size, port=port)",
        killers=("tests/test_distributed_checks.py::test_a_timeout_must_be_a_positive_number_of_seconds",),
    ),
    Mutant(
        "DDPReport: the tolerance itself fails (< for <=)",
        "compare",
        "self.results[v].max_rel_error <= FLOAT32_RTOL",
        "<",
        killers=("tests/test_distributed_checks.py::test_the_ddp_report_holds_at_each_limit",),
    ),
    Mutant(
        "DDPReport: exact tolerance loosened 10x",
        "replace",
        "self.results[v].max_rel_error <= FLOAT32_RTOL",
        "10 * FLOAT32_RTOL",
        node="FLOAT32_RTOL",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_fails_just_past_the_tolerance_on_any_rank_and_step",
        ),
    ),
    Mutant(
        "DDPReport: only no_sync judged against the oracle",
        "replace",
        "(self.results[v].max_rel_error <= FLOAT32_RTOL for v in COMM_VARIANTS)",
        "('no_sync',)",
        node="COMM_VARIANTS",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_fails_just_past_the_tolerance_on_any_rank_and_step",
        ),
    ),
    Mutant(
        "DDPReport: parameters may differ by rounding",
        "replace",
        "max(r.param_spread) == 0.0",
        "max(r.param_spread) <= FLOAT32_RTOL",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_fails_when_ranks_hold_different_parameters",
        ),
    ),
    Mutant(
        "DDPReport: k rounds on any step, not all",
        "replace",
        "all((c[0] == m * ref_c[0] for c, m, ref_c in zip(self.results['every micro-batch'].calls, "
        "ref.window_batches, ref.calls)))",
        "any",
        node="all",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_wants_m_rounds_of_buckets_without_no_sync",
        ),
    ),
    Mutant(
        "DDPReport: k rounds counted against k, not the window's m",
        "replace",
        "m * ref_c[0]",
        "self.accum_steps",
        node="m",
        killers=("tests/test_distributed_checks.py::test_the_ddp_report_holds_at_each_limit",),
    ),
    Mutant(
        "DDPReport: the per-rank floor itself counts (>= for >)",
        "compare",
        "self.results['per-rank counts'].max_rel_error > PER_RANK_MIN_ERROR",
        ">=",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_wants_the_per_rank_mistake_visible_above_rounding",
        ),
    ),
    Mutant(
        "DDPReport: the per-rank floor lowered to one rounding tolerance",
        "drop-factor",
        "10 * FLOAT32_RTOL",
        "10",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_wants_the_per_rank_mistake_visible_above_rounding",
        ),
    ),
    Mutant(
        "DDPReport: one rank must show the per-rank mistake too",
        "drop-clause",
        "self.world_size == 1 or self.results['per-rank counts'].max_rel_error > PER_RANK_MIN_ERROR",
        "self.world_size == 1",
        killers=("tests/test_distributed_checks.py::test_one_rank_needs_no_per_rank_mistake",),
    ),
    Mutant(
        "a run's error is its best rank's, not its worst",
        "replace",
        "max(step)",
        "min",
        node="max",
        killers=(
            "tests/test_distributed_checks.py::test_the_ddp_report_fails_just_past_the_tolerance_on_any_rank_and_step",
        ),
    ),
    # the launcher
    Mutant(
        "timeout=0 accepted",
        "replace",
        "timeout = check_float('timeout', timeout, low=0, low_open=True)\n_check_importable(fn)",
        "check_float('timeout', timeout, low=0)",
        node="check_float('timeout', timeout, low=0, low_open=True)",
        killers=("tests/test_distributed_checks.py::test_a_timeout_must_be_a_positive_number_of_seconds",),
    ),
    Mutant(
        "the launch's timeout read in minutes",
        "replace",
        "time.monotonic() + timeout",
        "60 * timeout",
        node="timeout",
        killers=("tests/test_distributed.py::test_a_launch_past_its_timeout_is_stopped",),
    ),
    Mutant(
        "the launch's timeout read in milliseconds",
        "replace",
        "time.monotonic() + timeout",
        "timeout / 1000",
        node="timeout",
        killers=("tests/test_distributed.py::test_every_rank_gets_the_large_batch_gradient_at_every_step",),
    ),
    Mutant(
        "the ranks' collective timeout read in milliseconds",
        "replace",
        "dist.init_process_group(backend, rank=rank, world_size=world_size, "
        "timeout=datetime.timedelta(seconds=timeout))",
        "datetime.timedelta(milliseconds=timeout)",
        node="datetime.timedelta(seconds=timeout)",
        killers=(
            "tests/test_distributed.py::test_a_rank_killed_by_a_signal_fails_the_launch_with_what_it_printed",
        ),
    ),
    Mutant(
        "the per-rank memory bound dropped",
        "replace",
        "limit = min(limit, max(1, available // RANK_MEMORY_BYTES))",
        "pass",
        killers=("tests/test_distributed_checks.py::test_ranks_are_bounded_by_available_memory",),
    ),
    Mutant(
        "available memory's kB read as bytes",
        "drop-factor",
        "int(info['MemAvailable'].split()[0]) * 1024",
        "1024",
        killers=("tests/test_distributed_checks.py::test_a_timeout_must_be_a_positive_number_of_seconds",),
    ),
    Mutant(
        "free memory read, not available memory",
        "constant",
        "'MemAvailable'",
        "'MemFree'",
        killers=("tests/test_distributed_checks.py::test_ranks_are_bounded_by_available_memory",),
    ),
    Mutant(
        "a rank's memory bound in KiB, not MiB",
        "constant",
        "512 * 2 ** 20",
        "10",
        node="20",
        killers=("tests/test_distributed_checks.py::test_ranks_are_bounded_by_available_memory",),
    ),
    Mutant(
        "no rank at all when memory is short",
        "replace",
        "max(1, available // RANK_MEMORY_BYTES)",
        "available // RANK_MEMORY_BYTES",
        killers=("tests/test_distributed_checks.py::test_ranks_are_bounded_by_available_memory",),
    ),
    Mutant(
        "one rank per core",
        "drop-factor",
        "RANKS_PER_CORE * cores",
        "RANKS_PER_CORE",
        killers=("tests/test_distributed_checks.py::test_ranks_are_bounded_by_usable_cores",),
    ),
    Mutant(
        "a world size at the machine's limit refused",
        "compare",
        "world_size > (most := max_world_size())",
        ">=",
        killers=(
            "tests/test_distributed_checks.py::test_a_world_size_the_machine_just_holds_is_not_refused",
        ),
    ),
    Mutant(
        "port 0 accepted",
        "constant",
        "check_int('port', port, low=1, high=65535)",
        "0",
        node="1",
        killers=("tests/test_distributed_checks.py::test_a_port_must_be_an_integer_in_range",),
    ),
    Mutant(
        "a closure accepted",
        "drop-clause",
        "module in (None, '__main__') or '<locals>' in qualname or '<lambda>' in qualname",
        "'<locals>' in qualname",
        killers=("tests/test_distributed_checks.py::test_functions_from_a_closure_are_refused",),
    ),
    Mutant(
        "gloo left to pick its own interface",
        "replace",
        "if interface:\n    os.environ['GLOO_SOCKET_IFNAME'] = interface",
        "False",
        node="interface",
        killers=("tests/test_distributed.py::test_gloo_is_pinned_to_loopback_in_the_ranks",),
    ),
    Mutant(
        "a user's GLOO_SOCKET_IFNAME overridden",
        "drop-clause",
        "backend != 'gloo' or 'GLOO_SOCKET_IFNAME' in environ or (not _loopback(host)) or ('lo' not in "
        "_interfaces())",
        "'GLOO_SOCKET_IFNAME' in environ",
        killers=("tests/test_distributed.py::test_gloo_interface_rule",),
    ),
    Mutant(
        "ranks left running after the launch",
        "replace",
        "_stop(ctx.processes)\n_replay_stderr(log_dir, world_size)",
        "pass",
        node="_stop(ctx.processes)",
        killers=("tests/test_distributed.py::test_a_launch_past_its_timeout_is_stopped",),
    ),
    Mutant(
        "the ranks' stderr not copied back",
        "replace",
        "_replay_stderr(log_dir, world_size)",
        "pass",
        killers=(
            "tests/test_distributed.py::test_what_ranks_print_to_stderr_is_copied_to_the_callers_stderr",
        ),
    ),
    Mutant(
        "a rank killed by a signal: what it printed dropped",
        "replace",
        "mp.ProcessExitedException(f'{err.msg}{tails}', err.error_index, err.error_pid, err.exit_code, "
        "err.signal_name)",
        "f'{err.msg}'",
        node="f'{err.msg}{tails}'",
        killers=(
            "tests/test_distributed.py::test_a_rank_killed_by_a_signal_fails_the_launch_with_what_it_printed",
        ),
    ),
    Mutant(
        "ranks outlive a killed launcher (no death signal)",
        "replace",
        "ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)",
        "pass",
        killers=("tests/test_distributed.py::test_ranks_die_with_a_killed_launcher",),
    ),
    # the all-reduce counter
    Mutant(
        "bytes counted as elements",
        "drop-factor",
        "buf.numel() * buf.element_size()",
        "buf.element_size()",
        killers=("tests/test_distributed.py::test_no_sync_all_reduces_one_round_of_buckets_per_step",),
    ),
    Mutant(
        "take() does not start again from zero",
        "replace",
        "self.calls = self.bytes = 0",
        "pass",
        killers=("tests/test_distributed.py::test_no_sync_all_reduces_one_round_of_buckets_per_step",),
    ),
    Mutant(
        "a plain module accepted by count_allreduce",
        "replace",
        "not isinstance(model, torch.nn.parallel.DistributedDataParallel)",
        "False",
        killers=("tests/test_distributed_checks.py::test_a_model_without_ddp_cannot_be_counted",),
    ),
    # the command line
    Mutant(
        "--timeout not passed to the experiment",
        "replace",
        "ddp_experiment(world_size=args.world_size, accum_steps=args.accum_steps, task=args.task, "
        "timeout=args.timeout, port=args.port)",
        "ddp_experiment(world_size=args.world_size, accum_steps=args.accum_steps, task=args.task, "
        "port=args.port)",
        killers=("tests/test_distributed_checks.py::test_the_command_line_timeout_reaches_the_launcher",),
    ),
    Mutant(
        "exit status 0 whatever the verdict",
        "replace",
        "0 if report.ok else 1",
        "0",
        killers=(
            "tests/test_distributed_checks.py::test_the_command_line_passes_its_settings_and_exits_by_the_verdict",
        ),
    ),
]
