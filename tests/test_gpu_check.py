"""`make gpu-check` (tools/gpu_check.py) runs end to end without a GPU: its `--dry-run` is the same four parts
on the CPU at the smallest sizes, so a broken script is found here, not in the few minutes a GPU is lent.

Each run is a subprocess, as on the device machine, bounded in time. What the CUDA run itself finds can
only be known on a GPU; these tests check that every part ran, wrote its figures and gave the verdicts it
must give, the negative ones included (the clip before unscale_ is not ok, the never-divided loop is named).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import _docs
import pytest
import torch

from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "gpu_check.py"
# the dry run takes about 50 s on a 2-core machine shared with other work (30 s idle); 8x that is a hang
DRY_RUN_LIMIT_S = 420

pytestmark = pytest.mark.slow


def run(*args: str, prelude: str = "", timeout: float = DRY_RUN_LIMIT_S) -> subprocess.CompletedProcess:
    """The script as the Makefile runs it, optionally after ``prelude`` (Python run first, same process)."""
    code = f"{prelude}\nimport runpy, sys\nsys.argv = {[str(SCRIPT), *args]!r}\n"
    code += "runpy.run_path(sys.argv[0], run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def dry(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    proc = run("--dry-run", "--out", str(out))
    return proc, json.loads((out / "gpu_check.json").read_text()), out


def script() -> Any:
    """tools/gpu_check.py as a module, sys.path left as it was."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def checks(result: dict, part: str) -> dict[str, dict]:
    return {c["name"]: c for c in result["parts"][part]["checks"]}


def test_the_dry_run_holds_every_check_and_says_so(dry):
    proc, result, out = dry
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["exit_status"] == 0 and result["verdict"] == "every check held"
    assert result["mode"] == "dry run on the CPU" and result["environment"]["device"] == "cpu"
    assert set(result["parts"]) == {"a", "b", "c", "d"}
    for part in result["parts"].values():
        assert part["checks"] and part["seconds"] > 0
        assert {c["status"] for c in part["checks"]} == {"held"}
    table = (out / "gpu_check.md").read_text()
    for title in ("reference table", "lessons", "mixed precision", "verify at size"):
        assert title in table
    assert "every check held" in proc.stdout


def test_part_a_reports_every_reference_loop_with_its_verdict(dry):
    _, result, _ = dry
    rows = checks(result, "a")
    loops = {name.split(" on ")[0] for name in rows if " on " in name}
    assert loops == {"naive", "normalized", "ragged", "amp", "large_batch"}
    naive = rows["naive on mlp-digits"]["figures"]
    # the negative: verify's code for it, in the JSON's list form
    assert naive["verdict"] == naive["expected"] == ["unscaled-sum"] and naive["max_rel_error"] > 1
    assert rows["ragged on mlp-digits"]["figures"]["max_rel_error"] <= FLOAT32_RTOL


def test_part_b_calls_every_lesson_computation_and_judges_its_claims(dry):
    rows = checks(dry[1], "b")
    assert set(rows) == set(script().LESSONS)
    for name, row in rows.items():
        claims = {k: v for k, v in row["figures"].items() if k not in ("seconds", "args")}
        assert claims, f"{name} judged no claim"
        assert row["figures"]["seconds"] >= 0
    # the dry run's smaller arguments are what it ran
    assert rows["why_accumulate.lr_sweep"]["figures"]["args"]["lrs"] == [0.05, 0.1, 0.2]
    assert rows["mixed_precision.autocast_dtype"]["figures"]["float16 on CUDA, bfloat16 on the CPU"] == (
        "torch.bfloat16"
    )
    window = rows["mixed_precision.compute"]["figures"]
    assert window["clip before unscale_: off"] > 0.9 > BF16_RTOL > window["unscale_ then clip: close"]


def test_part_c_names_clip_before_unscale_and_passes_the_correct_loop(dry):
    rows = checks(dry[1], "c")
    assert len(rows) == 4  # float16 and bfloat16, each with the correct and the buggy order
    for name, row in rows.items():
        fig = row["figures"]
        if name.startswith("clip-before-unscale"):
            assert fig["ok"] is False and "clip-before-unscale" in fig["codes"]  # the negative
            assert fig["report"]["findings"][0]["code"] == "clip-before-unscale"
        else:
            assert fig["ok"] is True and fig["codes"] == []
        assert len(fig["report"]["steps"]) == 4


def test_part_d_measures_verify_beside_the_loop_alone(dry):
    rows = checks(dry[1], "d")
    size = rows["GPT-2 small's size"]["figures"]
    assert size["k"] == 8 and size["parameters"] > 0 and size["activation_bytes"] > 0
    correct, buggy = (
        rows["verify, correct loop, k = 8"]["figures"],
        rows["verify, never-divided loop, k = 8"]["figures"],
    )
    for fig in (correct, buggy):
        assert fig["loop_alone_s"] > 0 and fig["verify_s"] > 0
        assert fig["time_ratio"] == pytest.approx(fig["verify_s"] / fig["loop_alone_s"])
        assert fig["verify_peak_bytes"] is None  # CUDA memory only; the CPU rehearsal states none
        assert fig["steps_judged"] == size["steps"]
    assert correct["ok"] is True and correct["codes"] == []
    assert buggy["ok"] is False and "unscaled-sum" in buggy["codes"]


def test_the_gpt2_small_shape_has_gpt2_smalls_parameter_count():
    with torch.device("meta"):  # shapes only: no memory, no time
        model = script().GPT()
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # GPT-2 small, tied head


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_it_refuses_with_its_own_exit_status(tmp_path):
    proc = run("--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 3
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_missing_package_skips_by_name_and_exits_4(tmp_path):
    block = (
        "import importlib.abc, sys\n"
        "class NoMatplotlib(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'matplotlib':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name='matplotlib')\n"
        "sys.meta_path.insert(0, NoMatplotlib())\n"
    )
    proc = run("--dry-run", "--parts", "b", "--out", str(tmp_path), prelude=block, timeout=180)
    assert proc.returncode == 4, proc.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["environment"]["packages"]["matplotlib"] is False
    rows = result["parts"]["b"]["checks"]
    assert {c["status"] for c in rows} == {"skipped"}
    assert all("'matplotlib'" in c["why"] for c in rows)
    assert "Traceback" not in proc.stderr


def test_the_readmes_gpu_figures_are_the_committed_h100_runs():
    """README's "On a GPU" figures are read off benchmarks/results/gpu-check-h100.json, the H100 run."""
    import re

    root = REPO
    run = json.loads((root / "benchmarks/results/gpu-check-h100.json").read_text())
    readme = _docs.text()
    section = readme.split("## On a GPU: make gpu-check", 1)[1].split("\n## ", 1)[0]
    assert run["mode"] == "CUDA" and run["exit_status"] == 0 and run["environment"]["device"] in section
    held = 0
    for key, part in run["parts"].items():
        n = sum(c["status"] == "held" for c in part["checks"])
        assert all(c["status"] == "held" for c in part["checks"])
        held += n
        assert re.search(rf"\| {key}\. [^|]+\| {n} \| 0 \| {part['seconds']:.1f} \|", section), key
    assert f"{held} in {round(run['seconds'])} s" in section
    d = {c["name"]: c["figures"] for c in run["parts"]["d"]["checks"]}
    correct = next(v for k, v in d.items() if "correct" in k)
    broken = next(v for k, v in d.items() if "never-divided" in k)
    assert correct["ok"] and not broken["ok"] and broken["codes"] == ["unscaled-sum"]
    for fig in (f"{correct['time_ratio']:.2f}x", f"{broken['time_ratio']:.2f}x"):
        assert fig in section
    assert f"{correct['verify_peak_bytes'] / 1e9:.2f} GB" in section
    assert f"{correct['loop_alone_peak_bytes'] / 1e9:.2f} GB" in section
    assert f"{correct['extra_over_param_bytes']:.2f}x" in section


def test_the_readmes_h100_figures_of_the_in_place_engine_are_the_committed_run():
    """README's in-place engine figures on the H100 are read off benchmarks/results/run-cost-h100.txt."""
    text = (REPO / "benchmarks/results/run-cost-h100.txt").read_text()
    run = json.loads(next(line for line in text.splitlines() if line.startswith('{"rows"')))
    row = run["rows"][0]
    readme = _docs.text()
    # up to the next paragraph, the kernel memory's
    para = readme[readme.index("**The in-place engine**") : readme.index("**Kernel memory")]
    para = " ".join(para.split())
    assert row["device"] in para and row["verdict_ok"] and row["extra_over_params"] == 1.0
    assert f"{row['parameters'] / 1e6:.1f}M parameters" in para
    assert f"{row['micro_batch'][0]} x {row['micro_batch'][1]} tokens" in para
    q = row["ratio_quartiles"]
    assert f"{row['ratio']:.2f}x on the H100 (quartiles {q[0]:.2f} to {q[1]:.2f})" in para
    bench = json.loads((REPO / "benchmarks/results/latest.json").read_text())["sections"]["run_cost"]["rows"][
        0
    ]
    cq = bench["ratio_quartiles"]
    assert f"{bench['ratio']:.2f}x the loop alone" in para
    assert f"{bench['repeats']} interleaved pairs, quartiles {cq[0]:.2f} to {cq[1]:.2f}" in para
