"""DDP accumulation on real processes (gloo, 127.0.0.1) against the oracle.

One spawned group of 2 ranks runs every configuration once (module fixture); the tests
then assert on what it recorded at every optimizer step on every rank:
- the rank's gradient against ``true_gradient`` (float64) over the union of every rank's window,
- the all-reduce calls and bytes the DDP communication hook counted,
- the spread of parameters across ranks after the step.
"""

import multiprocessing
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessRaisedException

from accumlib import get_task
from accumlib.distributed import ddp_accumulate, free_port, launch
from accumlib_course.distributed import FLOAT32_RTOL, VARIANTS, RunSpec, ddp_experiment, run_specs
from accumlib_course.distributed.experiment import PER_RANK_MIN_ERROR

WORLD = 2
# One spawned run: ~10 s on an idle 2-core machine (torch + DDP's torch._dynamo import in each
# rank), ~40 s when other jobs load the cores; 180 s only bounds a hang.
SPAWN_TIMEOUT_S = 180
K = 3  # lm-tokens gives each rank 8 micro-batches: windows of 3, 3 and a ragged tail of 2

SPECS = {(v, "lm-tokens"): RunSpec(v, "lm-tokens", accum_steps=K) for v in VARIANTS}
# mlp-digits: 55 rows per rank in 7 micro-batches (last one 7 rows), k=4 -> windows 4 and 3;
# both ranks hold equal counts, so per-rank normalization is exact here (the mistake hides).
SPECS[("no_sync", "mlp-digits")] = RunSpec("no_sync", "mlp-digits", accum_steps=4)
SPECS[("per-rank counts", "mlp-digits")] = RunSpec("per-rank counts", "mlp-digits", accum_steps=4)


@pytest.fixture(scope="module")
def runs():
    start = time.monotonic()
    results = run_specs(list(SPECS.values()), world_size=WORLD, timeout=SPAWN_TIMEOUT_S)
    print(
        f"\none spawned run of {len(SPECS)} configurations on {WORLD} ranks: {time.monotonic() - start:.1f} s"
    )
    assert not multiprocessing.active_children()
    return dict(zip(SPECS, results))


def n_params(task: str) -> int:
    return sum(p.numel() for p in get_task(task).make_model(0).parameters())


@pytest.mark.parametrize("task", ["lm-tokens", "mlp-digits"])
def test_every_rank_gets_the_large_batch_gradient_at_every_step(runs, task):
    r = runs[("no_sync", task)]
    assert len(r.rel_errors) == {"lm-tokens": 3, "mlp-digits": 2}[task]
    assert r.window_batches[-1] < r.spec.accum_steps  # the ragged tail is stepped, not dropped
    for step in r.rel_errors:
        assert len(step) == WORLD
        assert max(step) <= FLOAT32_RTOL, step


def test_token_counts_differ_across_ranks(runs):
    # the premise of the per-rank-count test: ranks hold different numbers of items per window
    items = runs[("no_sync", "lm-tokens")].window_items
    assert all(len(set(step)) == WORLD for step in items), items


def test_ranks_hold_identical_parameters_after_every_step(runs):
    for key, r in runs.items():
        assert r.param_spread == [0.0] * len(r.rel_errors), key


def test_logged_loss_is_the_global_window_mean(runs):
    # float32 sums of a few hundred token losses against the same losses summed in float64
    for key, r in runs.items():
        assert r.logged == pytest.approx(r.oracle_loss, rel=FLOAT32_RTOL), key


def test_no_sync_all_reduces_one_round_of_buckets_per_step(runs):
    ref, every = runs[("no_sync", "lm-tokens")], runs[("every micro-batch", "lm-tokens")]
    param_bytes = 4 * n_params("lm-tokens")  # float32: every gradient travels once per round
    for s, m in enumerate(ref.window_batches):
        assert len(set(ref.calls[s])) == 1 and len(set(every.calls[s])) == 1  # every rank sends the same
        assert ref.calls[s][0] >= 1 and ref.bytes[s][0] == param_bytes
        assert every.calls[s][0] == m * ref.calls[s][0]  # k rounds without no_sync (m on the tail)
        assert every.bytes[s][0] == m * param_bytes
    assert every.window_batches == [K, K, 2]


def test_no_sync_around_backward_only_saves_nothing(runs):
    ref, late = runs[("no_sync", "lm-tokens")], runs[("no_sync on backward only", "lm-tokens")]
    every = runs[("every micro-batch", "lm-tokens")]
    assert late.calls == every.calls and late.bytes == every.bytes
    assert sum(c[0] for c in late.calls) > sum(c[0] for c in ref.calls)
    # the waste is communication only: the gradient is still the large-batch one
    assert late.max_rel_error <= FLOAT32_RTOL and every.max_rel_error <= FLOAT32_RTOL


def test_per_rank_counts_are_wrong_on_token_counts(runs):
    wrong, ref = runs[("per-rank counts", "lm-tokens")], runs[("no_sync", "lm-tokens")]
    for step in wrong.rel_errors:
        assert min(step) > PER_RANK_MIN_ERROR, step
    # and it is exactly the mistake described: DDP's average of per-rank means
    assert max(max(s) for s in wrong.rel_to_rank_means) <= FLOAT32_RTOL
    assert min(min(s) for s in ref.rel_to_rank_means) > PER_RANK_MIN_ERROR


def test_per_rank_counts_hide_when_every_rank_holds_as_many_items(runs):
    r = runs[("per-rank counts", "mlp-digits")]
    assert all(len(set(step)) == 1 for step in r.window_items)
    assert r.max_rel_error <= FLOAT32_RTOL


def test_world_size_one_in_an_existing_group():
    # what torchrun hands a script: an initialized group; world size 1 here, in this process
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        report = ddp_experiment(accum_steps=3)
    finally:
        dist.destroy_process_group()
    assert report.world_size == 1 and report.ok
    assert report.results["no_sync"].max_rel_error <= FLOAT32_RTOL
    # one rank: its count is the global count
    assert report.results["per-rank counts"].max_rel_error <= FLOAT32_RTOL
    assert report.results["every micro-batch"].calls_per_step == 3 * report.results["no_sync"].calls_per_step


# ---- launching: failures, time limits, bad settings ------------------------------------


def _fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here for its peer until the collective timeout


def _sleep(rank, world_size):
    time.sleep(600)


def _sleep_briefly(rank, world_size):
    time.sleep(5)


def test_a_failing_rank_fails_the_launch_with_its_traceback_and_leaves_nothing():
    start = time.monotonic()
    with pytest.raises(ProcessRaisedException, match="rank 1 fails on purpose") as info:
        launch(_fail_on_rank_1, world_size=WORLD, timeout=SPAWN_TIMEOUT_S)
    assert "Traceback" in str(info.value) and "_fail_on_rank_1" in str(info.value)
    assert "rank 1 failed first" in str(info.value)  # the cause first, not rank 0's lost connection
    assert info.value.error_index == 1
    assert not multiprocessing.active_children()
    assert time.monotonic() - start < 60  # rank 0 was stopped, not left to its collective timeout


def test_a_launch_past_its_timeout_is_stopped():
    # the ranks would finish by themselves in seconds: a timeout read in any larger unit lets them
    with pytest.raises(TimeoutError, match="timeout=2"):
        launch(_sleep_briefly, world_size=WORLD, timeout=2)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True])
def test_world_size_must_be_a_positive_integer(world_size):
    with pytest.raises(ValueError, match=r"world_size must be .*>= 1 \(got"):
        launch(_sleep, world_size=world_size)
    with pytest.raises(ValueError, match="world_size"):
        run_specs([RunSpec()], world_size=world_size)


@pytest.mark.parametrize("accum_steps", [0, -2])
def test_accum_steps_must_be_at_least_one(accum_steps):
    with pytest.raises(ValueError, match=rf"accum_steps must be an integer >= 1 \(got {accum_steps}\)"):
        RunSpec(accum_steps=accum_steps)


def test_a_port_in_use_is_refused_before_spawning():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port must be free on 127.0.0.1 .*\(got {port}, in use"):
            launch(_sleep, world_size=WORLD, port=port)
    assert not multiprocessing.active_children()


def test_functions_from_a_notebook_or_a_closure_are_refused():
    with pytest.raises(ValueError, match="fn must be a module-level function importable"):
        launch(lambda rank, world: None, world_size=WORLD)


def test_the_loop_refuses_a_model_without_ddp():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match="model must be wrapped in DistributedDataParallel"):
        ddp_accumulate(model, torch.optim.SGD(model.parameters(), lr=0.1), [], None, accum_steps=2)


def _abort_on_rank_0(rank, world_size):
    import os
    import sys

    if rank == 0:
        print("rank 0 about to abort", file=sys.stderr, flush=True)
        os.abort()  # like a C++ std::terminate inside gloo: no Python traceback is written
    time.sleep(600)


def test_a_rank_killed_by_a_signal_fails_the_launch_with_what_it_printed():
    from torch.multiprocessing import ProcessExitedException

    with pytest.raises(ProcessExitedException, match="SIGABRT") as info:
        launch(_abort_on_rank_0, world_size=WORLD, timeout=SPAWN_TIMEOUT_S)
    assert "rank 0's last stderr lines:\nrank 0 about to abort" in str(info.value)
    assert info.value.error_index == 0
    assert not multiprocessing.active_children()


def _squared_errors(model, batch):
    x, y = batch
    return (model(x).squeeze(-1) - y) ** 2


def _shard(rank):
    """4 micro-batches; rank 0's hold 2 rows each, rank 1's one: the ranks' item counts differ."""
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(2 - rank, 3, generator=g), torch.randn(2 - rank, generator=g)) for _ in range(4)]


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


LR, DEFAULTS_K = 0.1, 2


def _loop_with_its_defaults(rank, seen):
    """ddp_accumulate as a user calls it: only accum_steps given."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumlib_course.distributed import count_allreduce

    model = DDP(_linear())
    counter = count_allreduce(model)
    logged = ddp_accumulate(
        model,
        torch.optim.SGD(model.parameters(), lr=LR),
        _shard(rank),
        _squared_errors,
        accum_steps=DEFAULTS_K,
    )
    seen["defaults"] = dict(
        logged=logged,
        calls=counter.take()[0],
        params=[p.detach().reshape(-1).tolist() for p in model.module.parameters()],
    )


def _refusals(rank, seen):
    """What the loop refuses inside a process group."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    calls = {
        # shards of different lengths: 4 micro-batches on rank 0, 3 on rank 1
        "uneven": lambda: ddp_accumulate(
            model, opt, _shard(rank)[: 4 - rank], _squared_errors, accum_steps=2
        ),
        "no_sync": lambda: ddp_accumulate(
            model, opt, _shard(rank), _squared_errors, accum_steps=2, no_sync="sometimes"
        ),
        "count": lambda: ddp_accumulate(
            model, opt, _shard(rank), _squared_errors, accum_steps=2, count_items=lambda b: 3
        ),
    }
    for name, call in calls.items():
        try:
            call()
        except ValueError as err:
            seen[name] = str(err)


def _spread_of_a_drifted_rank(rank, seen):
    """run_one's parameter spread when rank 1's first parameter is off by 1 from the start of the loop."""
    from accumlib_course.distributed import experiment

    loop = experiment.ddp_accumulate

    def drifting(ddp, *args, **kwargs):
        if rank == 1:
            with torch.no_grad():
                next(ddp.module.parameters()).add_(1.0)
        return loop(ddp, *args, **kwargs)

    g = torch.Generator().manual_seed(0)
    # 32 digit-shaped rows stand in for the digits (whose loading imports scikit-learn: 10 s a rank
    # under load)
    rows = torch.utils.data.TensorDataset(
        torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    )
    experiment.ddp_accumulate = drifting
    try:  # 16 rows a rank in micro-batches of 8, one per step: 2 steps
        spec = RunSpec("no_sync", "mlp-digits", accum_steps=1, oracle=False)
        seen["spread"] = experiment.run_one(spec, datasets={"mlp-digits": rows}).param_spread
    finally:
        experiment.ddp_accumulate = loop


def _in_every_rank(rank, world_size, out):
    """What a rank sees, computes and refuses; written to ``out.<rank>`` as JSON."""
    import json
    import os
    import sys

    print(f"a warning from rank {rank}", file=sys.stderr, flush=True)
    seen = {"ifname": os.environ.get("GLOO_SOCKET_IFNAME", "<unset>")}
    _loop_with_its_defaults(rank, seen)
    _refusals(rank, seen)
    _spread_of_a_drifted_rank(rank, seen)
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(seen, fh)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """One launch: what each rank recorded, and what the launcher copied to its stderr."""
    import contextlib
    import io
    import json
    import os

    out = tmp_path_factory.mktemp("ranks") / "seen"
    stderr = io.StringIO()
    had = os.environ.pop("GLOO_SOCKET_IFNAME", None)  # the ranks must pick it themselves
    try:
        with contextlib.redirect_stderr(stderr):
            launch(_in_every_rank, (str(out),), world_size=WORLD, timeout=SPAWN_TIMEOUT_S)
    finally:
        if had is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = had
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)], stderr.getvalue()


def test_what_ranks_print_to_stderr_is_copied_to_the_callers_stderr(ranks):
    _, err = ranks
    assert "[rank 0] a warning from rank 0" in err and "[rank 1] a warning from rank 1" in err


def test_gloo_is_pinned_to_loopback_in_the_ranks(ranks):
    # gloo otherwise binds to the address the hostname resolves to, which need not be
    # the loopback the rendezvous uses
    seen, _ = ranks
    assert [s["ifname"] for s in seen] == ["lo"] * WORLD


def test_shards_of_different_lengths_are_refused_on_every_rank(ranks):
    # a rank with fewer micro-batches would leave its peers waiting in a collective
    seen, _ = ranks
    assert [s.get("uneven") for s in seen] == [
        "loader must yield the same number of micro-batches on every rank (got between 3 and 4)"
    ] * WORLD


def test_the_loop_refuses_an_unknown_no_sync_and_a_wrong_item_count(ranks):
    seen, _ = ranks
    for rank, s in enumerate(seen):
        assert (
            s.get("no_sync")
            == "no_sync must be one of 'forward+backward', 'backward', 'never' (got 'sometimes')"
        )
        assert (
            s.get("count") == "count_items must agree with item_losses: count_items said 3 items, "
            f"item_losses returned {2 - rank}"
        )


def test_the_loop_with_its_defaults_steps_the_large_batch_gradient_with_one_all_reduce_per_step(ranks):
    """The oracle: SGD on the mean squared error over both ranks' windows, in float64."""
    seen, _ = ranks
    model, shards = _linear().double(), [_shard(r) for r in range(WORLD)]
    start = [p.detach().clone().reshape(-1) for p in model.parameters()]
    oracle_loss = []
    for s in range(len(shards[0]) // DEFAULTS_K):
        window = [b for shard in shards for b in shard[s * DEFAULTS_K : (s + 1) * DEFAULTS_K]]
        x, y = torch.cat([b[0] for b in window]).double(), torch.cat([b[1] for b in window]).double()
        model.zero_grad()
        loss = _squared_errors(model, (x, y)).mean()
        loss.backward()
        oracle_loss.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    want = torch.cat([p.detach().reshape(-1) - p0 for p, p0 in zip(model.parameters(), start)])
    for s in seen:
        d = s["defaults"]
        got = torch.cat([torch.tensor(p, dtype=torch.float64) for p in d["params"]]) - torch.cat(start)
        # the update SGD made, against the oracle's
        assert float((got - want).norm() / want.norm()) <= FLOAT32_RTOL
        assert d["logged"] == pytest.approx(oracle_loss, rel=FLOAT32_RTOL)
        assert d["calls"] == len(oracle_loss)  # no_sync: one all-reduce (one bucket: 4 parameters) per step


def test_the_parameter_spread_sees_a_rank_that_drifted(ranks):
    # rank 0 reports the spread: rank 1's parameters, gathered, are 1 off its own at every step
    seen, _ = ranks
    spread = seen[0]["spread"]
    assert len(spread) == 2 and all(0.5 < s < 1.5 for s in spread), spread


def test_gloo_interface_rule():
    from accumlib.distributed.launch import gloo_interface

    assert gloo_interface("gloo", "127.0.0.1", {}) == "lo"
    assert gloo_interface("gloo", "localhost", {}) == "lo"
    # the user's choice stays
    assert gloo_interface("gloo", "127.0.0.1", {"GLOO_SOCKET_IFNAME": "eth1"}) is None
    assert gloo_interface("gloo", "192.0.2.1", {}) is None  # not loopback: peers may be elsewhere
    assert gloo_interface("nccl", "127.0.0.1", {}) is None


def test_a_world_size_the_machine_cannot_hold_is_refused_before_spawning():
    from accumlib.distributed.launch import max_world_size

    most = max_world_size()
    assert 1 <= most
    with pytest.raises(
        ValueError, match=rf"world_size must be <= {most} on this machine .* \(got {most + 1}\)"
    ):
        launch(_sleep, world_size=most + 1)
    assert not multiprocessing.active_children()


def _write_pid_and_sleep(rank, world_size, out):
    import os
    import signal

    # torch's spawn asks for SIGINT when the parent dies, which a rank inside C++ (an import,
    # a gloo collective) does not act on; ignoring it here stands in for that rank
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(f"{out}.{rank}", "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)


def test_ranks_die_with_a_killed_launcher(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "pid"
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from accumlib.distributed import launch\nimport test_distributed as t\n"
        f"launch(t._write_pid_and_sleep, ({str(out)!r},), world_size=2, timeout=600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while not all((tmp_path / f"pid.{r}").exists() for r in range(WORLD)):
            assert time.monotonic() < deadline and parent.poll() is None, "the ranks never started"
            time.sleep(0.2)
        time.sleep(0.5)  # the files are written; let the pids be read whole
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(WORLD)]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"  # a zombie has died; only its reaping waits for init

    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [p for p in pids if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"ranks {survivors} outlived their launcher"
