"""verify v4: the micro-batches judged are the ones the model received (issue 27).

A dataset whose ``__getitem__`` is random (data augmentation, as every image training script has)
and a loop that builds its own DataLoader over ``loader.dataset`` with its own collate: verify must
not read the items again to rebuild the batch (a second read is a second augmentation). Truth, from
the loop itself: the inputs it fed and the gradient its optimizer saw, against the true large-batch
gradient of exactly those inputs (``accumlib.true_gradient``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import accumlib
from accumlib import get_task
from accumlib.tolerances import FLOAT32_RTOL

TASK = get_task("mlp-digits")
K, B = 4, 8


class Augmented(Dataset):
    """digits with fresh noise on every read: no two reads of an item agree."""

    def __init__(self):
        self.data = torch.utils.data.Subset(TASK.make_dataset(), range(96))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i]
        return x + 0.5 * torch.randn_like(x), y


def own_loader_loop(divide_by, fed):
    def train(model, opt, loader):
        mine = DataLoader(loader.dataset, batch_size=B, shuffle=True)  # its own sampler and collate
        for i, (x, y) in enumerate(mine):
            (F.cross_entropy(model(x), y, reduction="sum") / divide_by).backward()
            if len(fed) < K:
                fed.append((x, y))
            if (i + 1) % K == 0:
                if len(fed) == K:
                    fed.append([p.grad.detach().clone() for p in model.parameters()])
                opt.step()
                opt.zero_grad()

    return train


def rel(a, b):
    """||a - b|| / ||b|| over every parameter, in float64 (accumlib.compare)."""
    return accumlib.compare(a, b).rel_error


def run(loop):
    return accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=Augmented(),
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=B,
    )


def test_a_correct_loop_over_augmented_items_is_ok_and_its_wrong_twin_named():
    torch.manual_seed(0)
    fed: list = []
    report = run(own_loader_loop(K * B, fed))
    truth = list(accumlib.true_gradient(TASK.make_model(0), fed[:K], TASK.item_losses).values())
    assert rel(fed[K], truth) < FLOAT32_RTOL  # the loop is right on what it fed, by the loop's own record
    assert report.ok and report.codes == set(), str(report)
    assert all(row.rel_error < FLOAT32_RTOL for row in report.steps)
    wrong: list = []
    bad = run(own_loader_loop(B, wrong))  # each micro-batch's mean never divided by k
    wrong_truth = list(accumlib.true_gradient(TASK.make_model(0), wrong[:K], TASK.item_losses).values())
    assert abs(rel(wrong[K], wrong_truth) - (K - 1)) < 1e-3  # k x the true gradient: rel err k - 1
    assert bad.codes == {"unscaled-sum"}, str(bad)
