"""``torchrun --nproc-per-node 2 -m accumlib run -- SCRIPT.py``: one verdict for a DDP job, judged in place
on every rank (each rank's gradient sums all-reduced at the step, ``accumlib/_verify/inplace_job.py``) and
printed once, by rank 0. Real gloo processes on 127.0.0.1, bounded in time, killed with their group.

The script is accumlib's own (a token-level DDP loop with ragged counts per rank, the window's tokens
all-reduced); its one-line broken twins are named with the right code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _procs import free_port, run_job

SCRIPT = """\
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 32)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
accum, steps = 2, 3
for step in range(steps):
    window = []
    for _ in range(accum):
        x = torch.randint(0, 32, (2, 8), generator=g)
        y = torch.randint(0, 32, (2, 8), generator=g)
        y[:, int(torch.randint(1, 8, (1,), generator=g)) :] = -100  # ragged: padding masked
        window.append((x, y))
    n = torch.tensor(sum(int((y != -100).sum()) for _, y in window))
    n_local = n.clone()
    dist.all_reduce(n)  # the job's tokens in this window
    for i, (x, y) in enumerate(window):
        with model.no_sync() if i < accum - 1 else torch.enable_grad():
            loss = F.cross_entropy(model(x).transpose(1, 2), y, ignore_index=-100, reduction="sum")
            (loss * world / n).backward()  # DDP averages over ranks: times R, over the job's N
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
dist.destroy_process_group()
"""
BACKWARD = "            (loss * world / n).backward()  # DDP averages over ranks: times R, over the job's N\n"


def torchrun(folder: Path, script: str, timeout: float = 150) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "-m", "accumlib", "run", "--json", "r.json", "--",
           script]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_job(cmd, timeout=timeout, cwd=folder, env=env)


@pytest.mark.parametrize(
    "name, new, code",
    [
        ("correct.py", BACKWARD, None),
        # each rank divides by its own count: the mean of the ranks' means
        ("per_rank.py", "            (loss / n_local).backward()\n", "per-rank-mean"),
        # DDP's mean over ranks not undone: every step 1/R of the true gradient
        ("no_world.py", "            (loss / n).backward()\n", "misscaled"),
        # the ranks never exchange gradients: each steps its own, the ranks drift apart
        ("no_ddp.py", BACKWARD, "ranks-diverged"),
    ],
)
def test_a_ddp_job_is_judged_once_for_the_whole_job(tmp_path, name, new, code):
    assert SCRIPT.count(BACKWARD) == 1
    (tmp_path / name).write_text(SCRIPT.replace(BACKWARD, new))
    if name == "no_ddp.py":  # no gradient sync at all: each rank steps its own window's gradient
        wrapped = "model = DDP(torch.nn.Sequential("
        assert SCRIPT.count(wrapped) == 1
        text = SCRIPT.replace(wrapped, "model = (torch.nn.Sequential(").replace(
            "with model.no_sync() if i < accum - 1 else torch.enable_grad():", "if True:"
        )
        (tmp_path / name).write_text(text)
    status, out = torchrun(tmp_path, name)
    report = json.loads((tmp_path / "r.json").read_text())
    assert out.count("verdict: ") == 1  # one report for the job, by rank 0
    assert len(report["steps"]) == 3 and report["items_stepped"] == sum(r["items"] for r in report["steps"])
    if code is None:
        assert status == 0 and report["ok"] and not report["findings"], out[-3000:]
        assert all(r["rel_error"] < 1e-4 for r in report["steps"])
    else:
        assert status != 0 and code in {f["code"] for f in report["findings"]}, out[-3000:]
    if code == "misscaled":
        assert all(abs(r["factor"] - 0.5) < 1e-4 for r in report["steps"])  # 1/R, R = 2
