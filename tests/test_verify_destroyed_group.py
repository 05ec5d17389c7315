"""verify v4: a script that destroys its process group as it ends is still judged (issue 27).

Accelerate 1.15's ``Accelerator.end_training()`` calls ``torch.distributed.destroy_process_group``
(``accelerator.py:3448`` -> ``state.py:855``); many torchrun scripts end with the same call. verify's
end-of-run exchange between the ranks used to run after the loop returned, on a group that no longer
existed: a ``ValueError`` traceback, not a verdict. Now the exchange runs just before the group goes.
Real gloo ranks on 127.0.0.1; each case re-creates the group (a file store) for the next one.

Cases, each with the verdict its twin gets:
- Accelerate's own documented accumulation loop ending in ``end_training()``: ok (equal micro-batches,
  so its mean / k is exact);
- a DDP loop whose ranks divide by their own item counts (``per-rank-mean``), ending in
  ``torch.distributed.destroy_process_group()``: named, as without the destroy;
- the correct DDP loop with the same ending: ok.
"""

from __future__ import annotations

import json

import pytest
import torch

import accumlib
from accumlib.distributed import launch

LAUNCH_TIMEOUT_S = 300
ITEMS = 64  # even: no DistributedSampler padding


def _accelerate_ending(model, optimizer, loader):
    import torch.nn.functional as F
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    accelerator.end_training()  # destroys the process group


def _ddp_ending(name, task):
    from accumlib_course.examples.ddp_loops import LOOPS

    loop = LOOPS[name](task)

    def train(model, optimizer, loader):
        out = loop(model, optimizer, loader)
        torch.distributed.destroy_process_group()
        return out

    return train


def _cases(rank, world, out):
    import torch.distributed as dist

    results = {}
    digits, tokens = accumlib.get_task("mlp-digits"), accumlib.get_task("lm-tokens")
    runs = {
        "accelerate": (_accelerate_ending, digits, 2, "auto"),
        "per-rank-mean": (_ddp_ending("per-rank-mean", tokens), tokens, tokens.accum_steps, "auto"),
        "correct": (_ddp_ending("correct", tokens), tokens, tokens.accum_steps, "auto"),
        "correct-recompute": (_ddp_ending("correct", tokens), tokens, tokens.accum_steps, "recompute"),
    }
    for n, (name, (train, task, k, oracle)) in enumerate(runs.items()):
        data = torch.utils.data.Subset(task.make_dataset(), range(ITEMS))
        try:
            report = accumlib.verify(
                train,
                model=task.make_model(0),
                dataset=data,
                item_losses=task.item_losses,
                accum_steps=k,
                batch_size=task.batch_size,
                collate_fn=task.collate_fn,
                ranks="all",
                oracle=oracle,
            )
            results[name] = dict(
                codes=sorted(report.codes), ok=report.ok, text=str(report), oracle=report.oracle
            )
        except Exception as err:  # noqa: BLE001 -- reported to the test, which fails on it
            results[name] = dict(error=f"{type(err).__name__}: {err}")
        results[name]["destroyed"] = not dist.is_initialized()
        if not dist.is_initialized():  # the next case (and launch's own ending) needs a group
            dist.init_process_group("gloo", init_method=f"file://{out}/store{n}", rank=rank, world_size=world)
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(results, fh)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("destroyed")
    launch(_cases, (str(out),), world_size=2, timeout=LAUNCH_TIMEOUT_S)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(
    "name, codes, oracle",
    [
        ("accelerate", [], "in-place"),
        ("per-rank-mean", ["per-rank-mean"], "in-place"),
        ("correct", [], "in-place"),
        ("correct-recompute", [], "recompute"),
    ],
)
def test_a_loop_that_destroys_its_group_is_judged_on_every_rank(job, name, codes, oracle):
    for rank, results in enumerate(job):
        case = results[name]
        assert case["destroyed"], (rank, name)  # the loop really destroyed the group
        assert "error" not in case, (rank, case.get("error"))
        assert case["codes"] == codes, (rank, case["text"])
        assert case["ok"] == (not codes)
        # the end-of-run exchange ran inside destroy_process_group: it names the oracle the run had
        assert case["oracle"] == oracle, (rank, case["oracle"])
    assert job[0][name]["text"] == job[1][name]["text"]  # every rank reports alike
