"""One loop per bug: each makes ``accumlib.verify`` find exactly one finding code (its name).

Written the way people write them (criterion means, ``loss / K``, ``(i + 1) % K``) so the
table of codes (docs/verify.md) and ``tests/test_gallery.py`` show every code on a loop that has it.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from accumlib.batches import windows
from accumlib.data import count_tokens
from accumlib.tasks import token_losses

from ._common import CLIP, K


def bug_unscaled_sum(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()  # never divided by K
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()


def bug_tail_misscaled(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0 or i + 1 == len(loader):  # the short tail is still divided by K
            optimizer.step()
            optimizer.zero_grad()


def bug_zero_grad_inside_window(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()  # wipes the window's earlier micro-batches
        (F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()


def bug_no_zero_grad(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()  # no zero_grad: every window keeps the ones before it


def bug_early_step(model, optimizer, loader):
    for x, y in loader:
        (F.cross_entropy(model(x), y) / K).backward()
        optimizer.step()  # every micro-batch
        optimizer.zero_grad()


def bug_late_step(model, optimizer, loader):
    """One step per epoch: each micro-batch's loss / K is right for a window of K, but all 16 share one
    step, a batch 4 x the one asked for (c = m / K = 4 follows from the window: no misscale)."""
    for x, y in loader:
        (F.cross_entropy(model(x), y) / K).backward()
    optimizer.step()  # once, after the loop, not every K micro-batches
    optimizer.zero_grad()


def bug_scheduler_per_micro_batch(model, optimizer, loader):
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / K).backward()
        # torch rightly warns (scheduler before optimizer); the bug is on show here
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler", UserWarning)
            scheduler.step()  # per micro-batch: the schedule runs K times too fast
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()


def bug_clip_per_micro_batch(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # clips a partial sum
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()


def bug_clip_before_unscale(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(loader):
        scaler.scale(F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # sees S x the gradient
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()


def bug_scale_changed_inside_window(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(loader):
        scaler.scale(F.cross_entropy(model(x), y) / K).backward()
        scaler.update(scaler.get_scale() * 2)  # the scale doubles between the window's backwards
        if (i + 1) % K == 0:
            scaler.step(optimizer)  # unscale_ divides the window's sum by the last scale only
            scaler.update()
            optimizer.zero_grad()


def bug_logged_loss_scaled(model, optimizer, loader):
    total, n = 0.0, 0
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
        total, n = total + loss.item() * len(y), n + len(y)  # the divided loss
    return total / n


def bug_misscaled(model, optimizer, loader):
    """Divides by 1.04 x the window's item count: every step 4% too small, nothing else wrong."""
    for window in windows(loader, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / (1.04 * n)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def bug_labels_before_shift(model, optimizer, loader):
    """A causal LM's window divided by its labels counted before the shift: N + S for N predicted tokens
    in S sequences (transformers 5.23's Trainer does this for GPT2LMHeadModel): every step x N/(N+S)."""
    for window in windows(loader, K):
        count = sum(count_tokens(b) + b[0].shape[0] for b in window)  # one label too many per sequence
        for batch in window:
            (token_losses(model, batch).sum() / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def bug_constant_divisor(model, optimizer, loader):
    """Every window divided by one fixed token budget, not its own token count N_t: step t is scaled by
    c_t = N_t / 320 (0.934, 1.072, 1.241, 1.131 here). verify v2 took the one c < 1 for a clip and said OK."""
    budget = 320  # e.g. max length x micro-batch size x K, fixed when the loop was written
    for window in windows(loader, K):
        for batch in window:
            (token_losses(model, batch).sum() / budget).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def bug_frozen_inside_window(model, optimizer, loader):
    """Gradual unfreezing done at a micro-batch, not at a step: the first layer joins halfway through
    window 0, so its gradient there holds half the window's items while the rest holds all of them."""
    first = list(model.parameters())[:2]
    for t, window in enumerate(windows(loader, K)):
        n = sum(len(y) for _, y in window)
        for j, (x, y) in enumerate(window):
            for p in first:
                p.requires_grad_(t > 0 or j >= K // 2)
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
