"""``accumlib run`` judges nanoGPT's own train.py, unmodified, and two copies with one line dropped.

nanoGPT's files are pinned in tests/_nanogpt.py and read from the clone named by ``ACCUMLIB_NANOGPT_SRC``:
these tests skip without it. Each runs ``python -m accumlib run --json report.json -- train.py
config_tiny.py`` in a tiny work folder (7 optimizer steps of 4 micro-batches of 64 tokens, on the CPU),
bounded and killed with its process group past its time, and reads the JSON report (``Report.to_dict``).
"""

from __future__ import annotations

import json

import _nanogpt as ng
import pytest
from _nanogpt import SCALE_LINE, SKIP_REASON, ZERO_GRAD_LINE, broken_copy, make_workdir, run_under_accumlib

pytestmark = pytest.mark.skipif(ng.source() is None, reason=SKIP_REASON)
STEPS = list(range(7))  # train.py's iterations 0..max_iters (6): one optimizer step each


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """The pinned nanoGPT files and config_tiny.py, copied out of the clone once for the module."""
    return ng.script_dir(tmp_path_factory.mktemp("nanogpt_pinned"))


def judged(scripts, train, tmp_path):
    """accumlib run's exit status, its JSON report and its output (for failure messages) for ``train``."""
    work = make_workdir(tmp_path / "work", scripts)
    p = run_under_accumlib(work, train, accumlib_args=["--json", "report.json"], timeout=120)
    out = f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert (work / "report.json").is_file(), out
    return p.returncode, json.loads((work / "report.json").read_text()), out


def test_nanogpts_unmodified_train_py_is_ok_at_every_step(scripts, tmp_path):
    """train.py as upstream wrote it: each micro-batch's mean loss divided by gradient_accumulation_steps,
    gradients zeroed after each step, clipped at 1.0 (no clip acts at this size)."""
    code, report, out = judged(scripts, scripts / "train.py", tmp_path)
    assert code == 0, out
    assert report["ok"] is True and report["status"] == "ok" and report["findings"] == [], out
    assert report["accum_steps"] == 4 and report["items_stepped"] == report["items_total"] == 7 * 256
    assert [s["step"] for s in report["steps"]] == STEPS
    assert all(s["codes"] == [] and s["micro_batches"] == 4 and s["items"] == 256 for s in report["steps"])
    assert all(s["rel_error"] < 1e-4 for s in report["steps"]), [s["rel_error"] for s in report["steps"]]


def test_the_loss_left_undivided_is_an_unscaled_sum_four_times_the_true_gradient(scripts, tmp_path):
    """The loss scaling line dropped (left an empty line):

    --- train.py (nanoGPT 3adf61e)
    +++ nanogpt_broken/train.py
    @@ -301 +301 @@  (12 spaces of indentation)
    -loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation
    +
    """
    code, report, out = judged(scripts, broken_copy(scripts, tmp_path, SCALE_LINE, ""), tmp_path)
    assert code == 1, out
    assert report["status"] == "bug" and [f["code"] for f in report["findings"]] == ["unscaled-sum"], out
    assert [s["step"] for s in report["steps"]] == STEPS
    assert all(s["codes"] == ["unscaled-sum"] for s in report["steps"]), out
    # c, the factor of the best fit G ~= c g* (the clip that acted undone): the 4 micro-batch means summed
    assert all(abs(s["factor"] - 4) < 1e-4 for s in report["steps"]), [s["factor"] for s in report["steps"]]


def test_gradients_never_zeroed_leak_into_every_step_after_the_first(scripts, tmp_path):
    """The gradients' reset after each optimizer step dropped (left an empty line):

    --- train.py (nanoGPT 3adf61e)
    +++ nanogpt_broken/train.py
    @@ -314 +314 @@  (4 spaces of indentation)
    -optimizer.zero_grad(set_to_none=True)
    +
    """
    code, report, out = judged(scripts, broken_copy(scripts, tmp_path, ZERO_GRAD_LINE, ""), tmp_path)
    assert code == 1, out
    assert report["status"] == "bug" and [f["code"] for f in report["findings"]] == ["no-zero-grad"], out
    assert [s["step"] for s in report["steps"]] == STEPS
    # the first step starts from no gradient: right; every later one holds the earlier windows' too
    assert report["steps"][0]["codes"] == [] and report["steps"][0]["rel_error"] < 1e-4, out
    assert all(s["codes"] == ["no-zero-grad"] for s in report["steps"][1:]), out
    assert report["findings"][0]["steps"] == STEPS[1:]


def test_nanogpt_on_two_gloo_ranks_is_one_verdict_for_the_job(scripts, tmp_path):
    """torchrun --nproc-per-node 2 -m accumlib run -- train.py: nanoGPT's DDP path (ddp_copy: the three
    lines that hard-code CUDA, nothing else), no_sync on all but each window's last micro-batch; each step
    holds the job's 2 x 2 micro-batches of 64 tokens. Judged in place on both ranks, printed once."""
    work = make_workdir(tmp_path / "work", scripts)
    train = ng.ddp_copy(scripts, tmp_path)
    argv = ng.torchrun_under_accumlib_command(train=train, accumlib_args=["--json", "report.json"])
    p = ng.run(argv, cwd=work, timeout=180)
    out = f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert p.returncode == 0 and p.stdout.count("verdict: ") == 1, out
    report = json.loads((work / "report.json").read_text())
    assert report["ok"] and report["findings"] == [] and [s["step"] for s in report["steps"]] == STEPS
    assert all(s["items"] == 256 and s["rel_error"] < 1e-4 for s in report["steps"]), out
