"""`benchmarks/verify_scale.py` keeps working on its own: ``--quick`` on a tiny MLP prints the table.

Checks the printed table's columns, that both loops were measured with the verdict each must
give, and that the figures are finite, the time ratios positive. Never checks memory or speed
against the goals: benchmarks print figures, they are not timed tests (and this machine may be busy).
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "verify_scale.py"
COLUMNS = (
    "model",
    "loop",
    "verdict",
    "loop alone: extra peak, time",
    "verify's extra peak",
    "x parameter bytes",
    "goal <= 2x + activations",
    "verify / loop time [range]",
    "goal <= 1.2x",
    "oracle",
    "recompute oracle: extra peak, time",
    "verify's extra peak, glibc's mmap threshold fixed (x parameter bytes)",
)


def _load():
    spec = importlib.util.spec_from_file_location("accumlib_verify_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look the module up there
    spec.loader.exec_module(module)
    return module


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify_scale") / "figures.json"
    # one child process for all four measurements at --quick (~12 s on a 2-core machine: most of it imports)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_prints_the_table_with_every_column(quick_run):
    stdout, _ = quick_run
    assert "| " + " | ".join(COLUMNS) + " |" in stdout
    for model in ("MLP 6,922", "GPT 3,616"):  # the tiny models of --quick, named by their parameter counts
        assert f"| {model} | correct | ok |" in stdout
        assert f"| {model} | never-divided | unscaled-sum |" in stdout
    assert "verify_scale_memory" in stdout and "verify_scale_time" in stdout


def test_both_loops_measured_with_finite_figures(quick_run):
    _, res = quick_run
    rows = {(r["model"].split()[0], r["loop"]): r for r in res["rows"]}
    assert list(rows) == [(m, loop) for m in ("MLP", "GPT") for loop in ("correct", "never-divided")]
    for r in rows.values():
        assert "verify_error" not in r and "error" not in r, r
        for f in (
            "alone_s",
            "verify_s",
            "time_ratio",
            "alone_extra_peak_bytes",
            "verify_extra_peak_bytes",
            "extra_over_params",
        ):
            assert _finite(r[f]), (f, r)
        assert r["alone_s"] > 0 and r["verify_s"] > 0 and r["time_ratio"] > 0
        assert r["verdict_as_expected"], r
        assert r["verify_steps"] == r["steps"]  # the run is a whole number of windows: one step each
        assert r["oracle"] == "in-place" and _finite(r["recompute_ratio"]), r  # both oracles measured
    for m in ("MLP", "GPT"):
        assert rows[m, "correct"]["ok"] and not rows[m, "never-divided"]["ok"]
    # QUICK: 32-64-64-10
    assert res["param_count"] == sum(a * b + b for a, b in zip((32, 64, 64), (64, 64, 10)))
    assert _finite(res["activation_bytes"]) and res["activation_bytes"] > 0
    # GPT_QUICK: 1 block of width 16 over a vocabulary of 11 and 8 positions, the head tied to the embedding
    d, v, t = 16, 11, 8
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert res["models"]["GPT 3,616"]["param_count"] == v * d + t * d + block + 2 * d == 3616


def test_quick_never_claims_a_goal(quick_run):
    # a tiny MLP's resident memory is the interpreter's noise: --quick measures nothing for real
    _, res = quick_run
    assert {g["met"] for g in res["goals"].values()} == {None}


def test_rejects_unknown_cases_and_steps():
    vs = _load()
    with pytest.raises(SystemExit):
        vs.main(["--cases", "correct,typo"])
    with pytest.raises(SystemExit):
        vs.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        vs.main(["--models", "MLP,CNN"])
