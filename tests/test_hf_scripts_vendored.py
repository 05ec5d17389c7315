"""Accelerate's gradient-accumulation examples run unmodified, tiny and offline; their double-shift bug.

The examples are pinned by commit and sha256 in tests/_hf_scripts.py and read from the accelerate clone
named by ``ACCUMLIB_ACCELERATE_SRC`` (their tests skip without it). Each runs as a subprocess in its own
session, killed with its whole process group when it outlives its bound. The 2-rank runs are marked
``slow``. tests/repro_accelerate_double_shift.py needs no clone: its test always runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import _hf_scripts as hs
import pytest
import repro_accelerate_double_shift as repro
from _procs import free_port, run_bounded

HERE = Path(__file__).resolve().parent
REPRO = HERE / "repro_accelerate_double_shift.py"
SCRIPTS = sorted(hs.UPSTREAM)
needs_source = pytest.mark.skipif(hs.source() is None, reason=f"{hs.SOURCE_ENV} names no accelerate clone")
# the last line each script prints when its third epoch ends (gradient_accumulation.py: the eval metric)
LAST_LINE = {
    "gradient_accumulation": "epoch 2: {'accuracy'",
    "gradient_accumulation_for_autoregressive_models": "epoch 2:: eval perplexity",
}


def run(argv: list[str], env: dict | None = None, timeout: float = 60, cwd: Path | None = None):
    """Run ``argv`` in a new session; past ``timeout`` kill its process group and fail the test."""
    try:
        return run_bounded(argv, timeout=timeout, cwd=cwd, env=env, merge_stderr=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.output or ""
        pytest.fail(f"{argv[1:3]} ran past {timeout} s; its process group was killed\n{out[-3000:]}")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The offline caches (one HF_HOME for the module) and the pinned scripts copied out of the clone."""
    tmp = tmp_path_factory.mktemp("hf_scripts")
    built = hs.workdir(tmp)
    if hs.source() is not None:
        built["scripts"] = {name: hs.script(name, tmp) for name in SCRIPTS}
    return built


def result(out: str) -> dict:
    """The repro's ``RESULT {json}`` line."""
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def expected_per_step(lengths: list[int]) -> list[tuple[int, int]]:
    """(N, S) per optimizer step from the texts' token counts alone, independent of the repro's collate.

    A row of L tokens gives L - 1 counted labels after the example's shift, of which the loss's own shift
    scores L - 2: N sums max(L - 2, 0), S counts the rows with L >= 2. A step takes BATCH * GA rows.
    """
    per = repro.BATCH * repro.GA
    groups = [lengths[i : i + per] for i in range(0, len(lengths), per)]
    return [(sum(max(n - 2, 0) for n in g), sum(n >= 2 for n in g)) for g in groups]


def assert_double_shift(found: dict, lengths: list[int]) -> None:
    """Each step: counts as computed independently, c = N/(N+S) < 1 to float32 rounding, control c = 1."""
    steps = found["steps"]
    assert [(s["N"], s["S"]) for s in steps] == expected_per_step(lengths)
    for s in steps:
        n, extra = expected_per_step(lengths)[s["step"]]
        assert s["num_items"] == n + extra
        assert s["c"] == pytest.approx(n / (n + extra), rel=1e-5) and s["c"] < 1 - 1e-3
        assert s["resid"] < 1e-5  # a pure rescaling of the true gradient, nothing else
        assert s["c_control"] == pytest.approx(1.0, rel=1e-5)  # shift_labels: no second shift


def test_repro_measures_the_double_shift_factor():
    out = run([sys.executable, str(REPRO)], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "the model learns the token two ahead" in out.stdout
    lengths = [len(t.split()) for t in repro.local_texts()]  # word-level tokenizer: one token a word
    assert_double_shift(result(out.stdout), lengths)


@needs_source
def test_pinned_scripts_are_the_upstream_files_at_their_commit():
    for name, pin in hs.UPSTREAM.items():
        data = hs.upstream_bytes(name, hs.source())
        assert hs.sha256(data) == pin["sha256"], name
        assert hs.sha256(data + b"\n") != pin["sha256"]  # the negative: one more byte is another file


@needs_source
def test_repro_with_the_scripts_own_dataloaders(work):
    script = work["scripts"]["gradient_accumulation_for_autoregressive_models"]
    out = run([sys.executable, str(REPRO), "--script", str(script)], env=work["env"], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    texts = [t for t in hs.wikitext_rows()["train"] if t]  # the script drops empty lines, keeps the order
    assert_double_shift(result(out.stdout), [len(t.split()) for t in texts])


def _skip_without_evaluate(name: str, env: dict) -> None:
    if name == "gradient_accumulation" and not hs.has_evaluate(env):
        pytest.skip("gradient_accumulation.py imports evaluate, which is not installed")


@needs_source
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_tiny_offline_on_one_process(work, name, tmp_path):
    _skip_without_evaluate(name, work["env"])
    out = run(hs.command(name, work["scripts"][name]), env=work["env"], timeout=90, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    assert LAST_LINE[name] in out.stdout


@needs_source
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_on_two_gloo_ranks(work, name, tmp_path):
    _skip_without_evaluate(name, work["env"])
    argv = hs.launch(hs.command(name, work["scripts"][name]), ranks=2, port=free_port())
    out = run(argv, env=work["env"], timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    assert LAST_LINE[name] in out.stdout
    if name == "gradient_accumulation_for_autoregressive_models":  # 12 texts on 2 ranks: 2 steps an epoch
        assert "epoch 2 - update step 1::" in out.stdout and "update step 2::" not in out.stdout


@needs_source
def test_accumlib_run_names_the_double_shift_in_the_unmodified_script(work, tmp_path):
    """``accumlib run`` on the pinned script as it is: every step is misscaled by exactly N/(N+S), the
    factor counted here from the texts alone (``expected_per_step``), and its items are the N tokens the
    loss scores. Its twin, the correct run, is nanoGPT's (tests/test_run_nanogpt.py) and the README's."""
    name = "gradient_accumulation_for_autoregressive_models"
    argv = hs.command(name, work["scripts"][name])
    out = run(
        [sys.executable, "-m", "accumlib", "run", "--json", str(tmp_path / "r.json"), "--", *argv[1:]],
        env=work["env"] | {"PYTHONPATH": str(HERE.parent)},
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert {f["code"] for f in report["findings"]} == {"misscaled"}
    texts = [t for t in hs.wikitext_rows()["train"] if t]
    per_epoch = expected_per_step([len(t.split()) for t in texts])
    assert len(report["steps"]) == 3 * len(per_epoch)  # 3 epochs, the same order each
    for t, row in enumerate(report["steps"]):
        n, extra = per_epoch[t % len(per_epoch)]
        assert row["items"] == n
        assert row["factor"] == pytest.approx(n / (n + extra), rel=1e-5)
