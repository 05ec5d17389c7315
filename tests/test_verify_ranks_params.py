"""verify(..., ranks="all") on a job whose ranks average their gradients by hand, without DDP: right
only if every rank starts from the same parameters (DDP broadcasts rank 0's; a hand-written loop must).
Ranks that hold different parameters apply the same averaged gradient to different weights, so their
models drift apart with no gradient ever differing: ranks-diverged, read from the parameters.

Both loops run in one launch of 2 gloo ranks on 127.0.0.1 (two interpreters: ~6 s on 2 cores)."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

import accumlib
from accumlib.distributed import launch

K = 2
LAUNCH_TIMEOUT_S = 240


def averaged_by_hand(broadcast: bool):
    def loop(model, opt, loader):
        import torch.distributed as dist

        world = dist.get_world_size()
        if broadcast:  # what DDP does at construction
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        sampler = DistributedSampler(loader.dataset, shuffle=False)
        batches = list(
            DataLoader(
                loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
            )
        )
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = torch.tensor(float(sum(len(y) for _, y in window)))
            dist.all_reduce(n)  # the job's item count
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") * world / n).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def _run(rank, world, out):
    task = accumlib.get_task("mlp-digits")
    results = {}
    for name, broadcast in (("broadcast", True), ("own-init", False)):
        report = accumlib.verify(
            averaged_by_hand(broadcast),
            model=task.make_model(rank),
            dataset=accumlib.data.digits(64),
            item_losses=task.item_losses,
            accum_steps=K,
            batch_size=8,
            ranks="all",
        )
        results[name] = dict(
            codes=sorted(report.codes), steps=[list(r.codes) for r in report.steps], text=str(report)
        )
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(results, fh)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks_params")
    launch(_run, (str(out),), world_size=2, timeout=LAUNCH_TIMEOUT_S)
    assert not multiprocessing.active_children()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_ranks_averaging_by_hand_from_one_start_are_ok(job):
    assert job[0]["broadcast"]["codes"] == [], job[0]["broadcast"]["text"]
    assert job[0]["broadcast"]["text"] == job[1]["broadcast"]["text"]


def test_ranks_that_start_from_different_parameters_are_diverged_though_their_gradients_agree(job):
    own = job[0]["own-init"]
    assert own["codes"] == ["ranks-diverged"], own["text"]
    assert all(codes == ["ranks-diverged"] for codes in own["steps"]), own["text"]
    # the gradients agree bit for bit; the parameters do not
    assert "|G_r - G_0| / |G_0| up to 0.00e+00" in own["text"]
