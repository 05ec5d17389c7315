"""verify v4: "exact" means what float rounding of this run allows (issue 27).

torchtune 0.6.1's full-finetune recipe (Alpaca's ``train_on_input: True``) multiplies each
micro-batch's token mean by its labels counted before the shift (N_j + S_j for N_j shifted labels
in S_j sequences) and divides the window by their sum: each micro-batch is weighted
(N_j+S_j)/N_j x sum N / sum(N+S). On ~250-token sequences that is 1e-5 to 3e-5 off the true
gradient, under the fixed float32 tolerance (1e-4) that verify used to apply, while the correct loop
on the same data is at float rounding. The truth is computed here from the gradient each loop's
optimizer saw (captured in the loop) and ``accumlib.true_gradient`` over the same window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import accumlib
from accumlib import get_task
from accumlib.data import IGNORE_INDEX, TokenSequences, pad_collate
from accumlib.models import TinyLM
from accumlib.tolerances import FLOAT32_RTOL, ROUNDING_FLOOR

TASK = get_task("lm-tokens")
K, B = 4, 4
DATA = TokenSequences(2 * K * B, min_len=230, max_len=270, seed=1)  # two windows of long sequences


def model():
    torch.manual_seed(0)
    return TinyLM(max_len=272)


def loop(before_shift, seen):
    def train(net, opt, loader):
        total = 0
        for i, (x, y) in enumerate(loader):
            n = int((y != IGNORE_INDEX).sum())
            w = n + x.shape[0] if before_shift else n  # one more label per sequence before the shift
            logits = net(x)
            mean = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX
            )
            (mean * w).backward()
            total += w
            if (i + 1) % K == 0:
                for p in net.parameters():
                    p.grad.div_(total)
                if not seen:
                    seen.append([p.grad.detach().clone() for p in net.parameters()])
                opt.step()
                opt.zero_grad()
                total = 0

    return train


def rel(a, b):
    """||a - b|| / ||b|| over every parameter, in float64 (accumlib.compare)."""
    return accumlib.compare(a, b).rel_error


def run(before_shift, seen):
    return accumlib.verify(
        loop(before_shift, seen),
        model=model(),
        dataset=DATA,
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=B,
        collate_fn=pad_collate,
    )


def test_weights_counted_before_the_shift_are_named_under_the_fixed_tolerance_and_the_twin_passes():
    window = [pad_collate([DATA[i] for i in range(j, j + B)]) for j in range(0, K * B, B)]
    truth = list(accumlib.true_gradient(model(), window, TASK.item_losses, merge=TASK.merge).values())
    right, wrong = [], []
    ok, bad = run(False, right), run(True, wrong)
    # the truth, independently of verify: the bug sits under the old fixed tolerance, above rounding
    off, exact = rel(wrong[0], truth), rel(right[0], truth)
    assert 3 * ROUNDING_FLOOR < off < FLOAT32_RTOL, off
    assert exact < ROUNDING_FLOOR / 4, exact
    assert ok.ok and ok.codes == set(), str(ok)
    assert bad.codes == {"mean-of-means"} and not bad.ok, str(bad)
    text = next(f for f in bad.findings if f.code == "mean-of-means").message
    assert "labels counted before the shift" in text
    assert abs(bad.steps[0].rel_error - off) <= 0.05 * off  # verify reads the run's own error
