"""``accelerate launch --multi_gpu --num_processes 2 -m accumlib run -- SCRIPT.py``: Accelerate's own launcher
starts ``accumlib run`` as a module on each rank (it starts ranks as torchrun does, through torch's elastic
agent), and the job gets one verdict, printed by rank 0. Real gloo processes on 127.0.0.1, bounded in time,
killed with their group.

On a machine without a GPU, Accelerate's ``--multi_gpu`` processes join a process group only with
``ACCELERATE_USE_CPU=1`` in their environment (``--cpu`` picks the one-process launcher instead;
accelerate/state.py ``_prepare_backend``): the test sets it, as a CPU user of Accelerate has to.

The script is a plain ``Accelerator(gradient_accumulation_steps=2)`` loop; its one-line broken twin (the
micro-batch's summed loss) is named with its code and its factor.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from _procs import free_port, run_job

pytest.importorskip("accelerate")

SCRIPT = """\
import torch
import torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(48, 8, generator=g), torch.randint(0, 4, (48,), generator=g)
data = torch.utils.data.TensorDataset(x, y)
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    with accelerator.accumulate(model):
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
state = accelerator.process_index, accelerator.num_processes, accelerator.distributed_type
print("rank %d of %d %s" % state, flush=True)
accelerator.end_training()  # destroys the process group: verify's exchange runs before it
"""
LOSS = "        loss = F.cross_entropy(model(x), y)\n"
# 48 items over 2 ranks in micro-batches of 4, 2 per window: 3 optimizer steps of 16 items
STEPS, ITEMS = 3, 48


def launch(folder: Path, script: str, timeout: float = 150, use_cpu: bool = True) -> tuple[int, str]:
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate, "the accelerate command is installed with accelerate"
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
           "--main_process_port", str(free_port()),
           "-m", "accumlib", "run", "--json", "r.json", "--", script]  # fmt: skip
    env = {
        **{k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"},
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(folder / "hf"),  # no accelerate config of the user's is read
    } | ({"ACCELERATE_USE_CPU": "1"} if use_cpu else {})
    return run_job(cmd, timeout=timeout, cwd=folder, env=env)


@pytest.mark.parametrize(
    "name, new, code",
    [
        ("correct.py", LOSS, None),
        # the summed loss: accumulate() divides it by 2 micro-batches and DDP by 2 ranks, so each step's
        # gradient is 16 items / 4 = 4 times the true one (no longer the raw sum: misscaled, c = 4)
        ("summed.py", '        loss = F.cross_entropy(model(x), y, reduction="sum")\n', "misscaled"),
    ],
)
def test_accelerate_launch_starts_accumlib_run_on_every_rank_and_one_verdict_comes_back(
    tmp_path, name, new, code
):
    assert SCRIPT.count(LOSS) == 1
    (tmp_path / name).write_text(SCRIPT.replace(LOSS, new))
    status, out = launch(tmp_path, name)
    # both ranks ran in one process group (not two one-process runs side by side)
    assert out.count("of 2 DistributedType.MULTI_CPU") == 2, out[-3000:]
    assert out.count("verdict: ") == 1, out[-3000:]  # one report for the job, by rank 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["steps"]) == STEPS and report["items_stepped"] == ITEMS, out[-3000:]
    # each rank's window: 2 micro-batches; the job's: 16 items from both ranks
    assert all(r["micro_batches"] == 2 and r["items"] == 16 for r in report["steps"])
    if code is None:
        assert status == 0 and report["ok"] and not report["findings"], out[-3000:]
        assert all(r["rel_error"] < 1e-4 for r in report["steps"])  # float32 rounding of a 16-item mean
    else:
        assert status == 1 and not report["ok"], out[-3000:]
        assert code in {f["code"] for f in report["findings"]}, out[-3000:]
        assert all(abs(r["factor"] - 4) < 1e-4 for r in report["steps"]), report["steps"]


def test_without_accelerate_use_cpu_each_rank_trains_alone_on_all_the_data(tmp_path):
    """Accelerate 1.15's inconsistency on a machine without a GPU, reproduced: under ``--multi_gpu``
    without ``ACCELERATE_USE_CPU``, ``_prepare_backend`` finds no backend and says ``DistributedType.NO``
    (one process: no DDP wrap, no sharded loader), yet ``PartialState.__init__`` still initialises a
    process group of 2 (its branch for every backend but CPU, state.py line 244). Each rank steps
    all 48 items alone. accumlib judges the group it finds: each step's window is both ranks' (the same
    8 items twice, 16), and each rank's gradient is that window's mean, so the job is ok, with 96 items
    stepped where 48 exist. (Ranks fed different data would step apart: ``ranks-diverged``, tested in
    test_run_ranks.py.) If this test fails, Accelerate changed: re-read the README's launch paragraph."""
    (tmp_path / "correct.py").write_text(SCRIPT)
    status, out = launch(tmp_path, "correct.py", use_cpu=False)
    assert out.count("of 1 DistributedType.NO") == 2, out[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert status == 0 and report["ok"], out[-3000:]
    assert len(report["steps"]) == 2 * STEPS and report["items_stepped"] == 2 * ITEMS
