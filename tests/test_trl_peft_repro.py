"""The reproductions in docs/repro/ (plain torch + the library, no accumlib) print the factors that
docs/trl-peft-bugs.md states: each script is run and its printed factor checked against the counts
it prints beside it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="trl is in the test extra")
REPRO = Path(__file__).resolve().parents[1] / "docs" / "repro"


# The three scripts run in one Python process, each as __main__ with its own captured stdout, as
# `python docs/repro/<name>.py` would run it: importing torch, transformers, TRL and PEFT once
# instead of three times saves about two thirds of this file's time (the models are tiny).
SCRIPTS = ("sft_gpt2_label_count.py", "peft_prompt_tuning_count.py", "dpo_last_micro_batch.py")
RUNNER = """
import contextlib, io, json, runpy, sys
printed = {}
for path in sys.argv[1:]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        runpy.run_path(path, run_name="__main__")
    printed[path.rsplit("/", 1)[-1]] = buffer.getvalue()
print(json.dumps(printed))
"""


@pytest.fixture(scope="module")
def printed() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, *(str(REPRO / name) for name in SCRIPTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_sft_on_gpt2_prints_n_over_n_plus_s_and_llama_1(printed):
    rows = re.findall(
        r"(\w+)\s+N=\s*(\d+) S=(\d+) num_items_in_batch=\s*(\d+) <g,g\*>/\|g\*\|\^2=([\d.]+)",
        printed["sft_gpt2_label_count.py"],
    )
    assert {r[0] for r in rows} == {"GPT2LMHeadModel", "LlamaForCausalLM"}
    for cls, n, s, nib, scale in rows:
        n, s, nib, scale = int(n), int(s), int(nib), float(scale)
        assert (nib, scale) == (
            (n + s, pytest.approx(n / (n + s), abs=2e-6))
            if cls == "GPT2LMHeadModel"
            else (n, pytest.approx(1.0, abs=2e-6))
        )


def test_peft_prompt_tuning_prints_n_over_n_minus_s(printed):
    rows = re.findall(
        r"k=(\d) N=\s*(\d+) S=(\d+) num_items_in_batch=\s*(\d+) <g,g\*>/\|g\*\|\^2=([\d.]+)",
        printed["peft_prompt_tuning_count.py"],
    )
    assert sorted({int(r[0]) for r in rows}) == [1, 4] and len(rows) == 6
    for _, n, s, nib, scale in rows:
        n, s = int(n), int(s)
        assert int(nib) == n - s and float(scale) == pytest.approx(n / (n - s), abs=2e-6)


def test_dpo_prints_a_mean_of_micro_batch_means_on_a_short_last_micro_batch(printed):
    rows = re.findall(
        r"pairs per micro-batch \[([\d, ]+)\]: \|G - g\*\|/\|g\*\| = ([\d.e+-]+), "
        r"\|G - mean of micro-batch means\|/\|g\*\| = ([\d.e+-]+)",
        printed["dpo_last_micro_batch.py"],
    )
    assert [r[0] for r in rows] == ["2, 2, 2, 2", "2, 1"]
    assert all(float(r[2]) < 1e-5 for r in rows)  # every window is the mean of its micro-batch means
    # which is the true mean only when they are equal
    assert float(rows[0][1]) < 1e-5 < 0.1 < float(rows[1][1])
