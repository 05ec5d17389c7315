"""The distributed module's judgements and refusals that need no process group: fast, in-process.

- ``DDPReport.ok`` holds at each of its limits and fails just past each one;
- ``shard_loader`` gives each rank DistributedSampler's interleaved, padded shard;
- ``launch`` (and what calls it) refuses bad settings before it spawns anything;
- ``max_world_size`` bounds ranks by usable cores and by available memory.
"""

from __future__ import annotations

import builtins
import importlib
import io
import math
import multiprocessing
import os

import pytest
import torch

from accumlib import get_task
from accumlib.distributed import check_port, launch, shard_loader
from accumlib.tolerances import FLOAT32_RTOL
from accumlib_course.distributed import (
    COMM_VARIANTS,
    VARIANTS,
    DDPReport,
    RunResult,
    RunSpec,
    count_allreduce,
    ddp_experiment,
    run_specs,
)
from accumlib_course.distributed.cli import main as ddp_main
from accumlib_course.distributed.experiment import PER_RANK_MIN_ERROR

# the module (the package's name `launch` is the function)
launch_module = importlib.import_module("accumlib.distributed.launch")


def _rank_fn(rank, world_size):  # importable; never runs: every call below is refused before spawning
    raise AssertionError("spawned")


# ---- DDPReport.ok: each limit, and just past it ------------------------------------------


def report(world_size: int = 2, **changes) -> DDPReport:
    """A report that is ok: 2 steps of 3 and 2 micro-batches; each no_sync window sends 2 buckets.

    ``changes`` maps a variant to the RunResult fields to replace for it."""
    base = {
        "no_sync": dict(calls=[[2, 2], [2, 2]]),
        "every micro-batch": dict(calls=[[6, 6], [4, 4]]),  # m rounds of buckets: 3 x 2, then 2 x 2
        "no_sync on backward only": dict(calls=[[6, 6], [4, 4]]),
        "per-rank counts": dict(calls=[[2, 2], [2, 2]], rel_errors=[[0.1, 0.1], [0.1, 0.1]]),
    }
    results = {}
    for v in VARIANTS:
        fields = (
            dict(rel_errors=[[0.0] * world_size] * 2, param_spread=[0.0, 0.0], window_batches=[3, 2])
            | base[v]
        )
        fields["bytes"] = [[100 * c for c in step] for step in fields["calls"]]  # 100 bytes a bucket
        results[v] = RunResult(RunSpec(v, "mlp-digits", 3), world_size, **(fields | changes.get(v, {})))
    return DDPReport(world_size, 3, "mlp-digits", results)


def just_above(x: float) -> float:
    return math.nextafter(x, math.inf)


def test_the_ddp_report_holds_at_each_limit():
    assert report().ok
    # at the tolerance
    at = {v: dict(rel_errors=[[0.0, FLOAT32_RTOL], [FLOAT32_RTOL, 0.0]]) for v in COMM_VARIANTS}
    at["per-rank counts"] = dict(rel_errors=[[just_above(PER_RANK_MIN_ERROR)] * 2] * 2)  # just past its floor
    assert report(**at).ok


@pytest.mark.parametrize("variant", COMM_VARIANTS)
def test_the_ddp_report_fails_just_past_the_tolerance_on_any_rank_and_step(variant):
    assert not report(**{variant: dict(rel_errors=[[0.0, 0.0], [0.0, just_above(FLOAT32_RTOL)]])}).ok


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_ddp_report_fails_when_ranks_hold_different_parameters(variant):
    # any spread at all: ranks that start equal and all-reduce the same gradient stay bitwise equal
    assert not report(**{variant: dict(param_spread=[0.0, 1e-30])}).ok


@pytest.mark.parametrize(
    "calls",
    [[[6, 6], [3, 3]], [[6, 6], [5, 5]], [[2, 2], [2, 2]]],
    ids=["one round short", "one call too many", "no_sync's count"],
)
def test_the_ddp_report_wants_m_rounds_of_buckets_without_no_sync(calls):
    assert not report(**{"every micro-batch": dict(calls=calls)}).ok


def test_the_ddp_report_wants_the_per_rank_mistake_visible_above_rounding():
    # at the floor
    assert not report(**{"per-rank counts": dict(rel_errors=[[PER_RANK_MIN_ERROR] * 2] * 2)}).ok
    # a few float32 roundings is noise, not the mistake shown
    assert not report(**{"per-rank counts": dict(rel_errors=[[2 * FLOAT32_RTOL] * 2] * 2)}).ok
    # and the largest step decides: one step far off is the mistake shown
    assert report(**{"per-rank counts": dict(rel_errors=[[0.0, 0.0], [0.0, 0.1]])}).ok


def test_one_rank_needs_no_per_rank_mistake():
    # on one rank the rank's own count is the global count: per-rank counts are exact there
    exact = {"per-rank counts": dict(rel_errors=[[0.0]] * 2)}
    assert report(world_size=1, **exact).ok
    assert not report(world_size=2, **{"per-rank counts": dict(rel_errors=[[0.0, 0.0]] * 2)}).ok


# ---- shard_loader ---------------------------------------------------------------------------


def test_each_rank_gets_an_interleaved_shard_padded_to_equal_length():
    task, data = get_task("mlp-digits"), torch.utils.data.TensorDataset(torch.arange(5))
    shards = [
        [int(i) for (b,) in shard_loader(task, r, 2, batch_size=2, dataset=data) for i in b] for r in range(2)
    ]
    assert shards == [[0, 2, 4], [1, 3, 0]]  # rank 1 repeats item 0 so that both take as many steps
    assert [len(shard_loader(task, r, 2, batch_size=2, dataset=data)) for r in range(2)] == [2, 2]
    # without batch_size, the task's: 16 items per rank in micro-batches of 8
    assert (
        len(shard_loader(task, 0, 2, dataset=torch.utils.data.TensorDataset(torch.arange(32))))
        == 16 // task.batch_size
    )


# ---- launch's settings: refused before anything is spawned ----------------------------------


@pytest.mark.parametrize("timeout", [0, -1.0, "60", None, math.nan])
def test_a_timeout_must_be_a_positive_number_of_seconds(timeout):
    with pytest.raises(ValueError, match=rf"timeout must be a number > 0 \(got {timeout!r}\)"):
        launch(_rank_fn, world_size=2, timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a number > 0"):
        run_specs([RunSpec()], world_size=2, timeout=timeout)
    assert not multiprocessing.active_children()


def test_the_command_line_timeout_reaches_the_launcher(capsys):
    assert ddp_main(["--timeout", "0"]) == 2
    assert "timeout must be a number > 0 (got 0.0)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"timeout must be a number > 0 \(got 0\)"):
        ddp_experiment(timeout=0)


@pytest.mark.parametrize("verdict", ["ok", "FAILED"])
def test_the_command_line_passes_its_settings_and_exits_by_the_verdict(verdict, monkeypatch, capsys):
    import accumlib_course.distributed

    asked = {}

    def experiment(**kwargs):
        asked.update(kwargs)
        return (
            report() if verdict == "ok" else report(**{"no_sync": dict(rel_errors=[[0.0, 0.5], [0.0, 0.0]])})
        )

    monkeypatch.setattr(accumlib_course.distributed, "ddp_experiment", experiment)
    status = ddp_main(
        [
            "--world-size",
            "3",
            "--accum-steps",
            "5",
            "--task",
            "mlp-digits",
            "--timeout",
            "7.5",
            "--port",
            "4321",
        ]
    )
    assert asked == dict(world_size=3, accum_steps=5, task="mlp-digits", timeout=7.5, port=4321)
    assert status == {"ok": 0, "FAILED": 1}[verdict]
    assert capsys.readouterr().out.rstrip().endswith(f"verdict: {verdict}")
    assert (
        ddp_main(["--json"]) == status and f'"ok": {str(verdict == "ok").lower()}' in capsys.readouterr().out
    )


def test_functions_from_a_closure_are_refused():
    def local(rank, world_size):
        pass

    with pytest.raises(ValueError, match=r"fn must be a module-level function importable .*<locals>"):
        launch(local, world_size=2)


@pytest.mark.parametrize("port", [0, 65536, True, "8080", 80.0])
def test_a_port_must_be_an_integer_in_range(port):
    with pytest.raises(
        ValueError,
        match=rf"port must be an integer between 1 and 65535 \(got {port!r}"
        rf"( of type {type(port).__name__})?\)",
    ):
        check_port(port)


def test_a_world_size_the_machine_just_holds_is_not_refused(monkeypatch):
    monkeypatch.setattr(launch_module, "max_world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"world_size must be <= 2 on this machine .*\(got 3\)"):
        launch(_rank_fn, world_size=3)
    # 2 passes the bound: the next check (fn importable) is the one that refuses the lambda
    with pytest.raises(ValueError, match="fn must be a module-level function"):
        launch(lambda rank, world: None, world_size=2)


def test_a_model_without_ddp_cannot_be_counted():
    with pytest.raises(TypeError, match=r"model must be a DistributedDataParallel module \(got Linear\)"):
        count_allreduce(torch.nn.Linear(2, 1))


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match=r"variant must be one of .*\(got 'no-sync'\)"):
        RunSpec("no-sync")


@pytest.mark.parametrize("batch_size", [0, 2.0, "8"])
def test_a_run_spec_batch_size_must_be_none_or_a_positive_integer(batch_size):
    with pytest.raises(ValueError, match=r"batch_size must be None or an integer >= 1 \(got "):
        RunSpec(batch_size=batch_size)
    assert RunSpec(batch_size=None).batch_size is None and RunSpec(batch_size=1).batch_size == 1


# ---- max_world_size: cores and memory ---------------------------------------------------------

GIB_KB = 2**20  # /proc/meminfo counts kB


@pytest.fixture
def machine(monkeypatch):
    """Fake the usable cores and /proc/meminfo that max_world_size reads."""

    def set_machine(cores: int, meminfo: str) -> int:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        real_open = builtins.open
        monkeypatch.setattr(
            launch_module,
            "open",
            lambda path, *a, **kw: (
                io.StringIO(meminfo) if path == "/proc/meminfo" else real_open(path, *a, **kw)
            ),
            raising=False,
        )
        return launch_module.max_world_size()

    return set_machine


def meminfo(available_kb: int) -> str:
    return (
        f"MemTotal:       {64 * GIB_KB} kB\nMemFree:        {64 * GIB_KB} kB\n"
        f"MemAvailable:   {available_kb} kB\n"
    )


def test_ranks_are_bounded_by_available_memory(machine):
    # the bound is 0.5 GiB per rank, pinned on purpose: a rank's measured peak is 0.35 GB
    assert machine(4, meminfo(2 * GIB_KB)) == 4
    assert machine(4, meminfo(2 * GIB_KB - 1)) == 3  # one kB short of the fourth rank
    assert machine(4, meminfo(GIB_KB // 4)) == 1  # too little memory for one rank still allows one


def test_ranks_are_bounded_by_usable_cores(machine):
    # 8 ranks per core, pinned on purpose: start-up dominates beyond
    assert machine(1, meminfo(64 * GIB_KB)) == 8
    assert machine(3, meminfo(64 * GIB_KB)) == 24
    assert machine(2, "MemTotal:       1024 kB\n") == 16  # no MemAvailable (old kernel): cores only
