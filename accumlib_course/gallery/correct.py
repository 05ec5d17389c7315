"""Correct loops in the shapes people write (enumerate, an inner for, nanoGPT's prefetch, AMP with
clipping and a scheduler, a clip of their own): ``accumlib.verify`` must pass each of them.
"""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F

from accumlib.batches import windows

from ._common import CLIP, K


def correct_enumerate(model, optimizer, loader):
    """enumerate + (i + 1) % K, every item weighted 1/N of its window, the tail stepped."""
    sizes = [len(y) for _, y in loader]  # item counts per micro-batch, known before training
    for i, (x, y) in enumerate(loader):
        start = i - i % K
        n = sum(sizes[start : start + K])
        (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        if (i + 1) % K == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return None


def correct_inner_for(model, optimizer, loader):
    """An inner for over each window's micro-batches; logs the true mean item loss."""
    total, items = 0.0, 0
    for window in windows(loader, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            losses = F.cross_entropy(model(x), y, reduction="none")
            (losses.sum() / n).backward()
            total, items = total + losses.sum().item(), items + len(y)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total / items


def correct_nanogpt(model, optimizer, loader):
    """nanoGPT: fetch the next batch before backward; loss / K (equal micro-batches); clip after unscale."""
    data = iter(loader)
    x, y = next(data)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(len(loader) // K):
        for _ in range(K):
            loss = F.cross_entropy(model(x), y) / K
            x, y = next(data, (x, y))  # prefetch while the backward runs
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the true, unscaled window gradient
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def correct_amp_clip_scheduler(model, optimizer, loader):
    """autocast + GradScaler + clipping + a per-step scheduler + tqdm, exact on a ragged tail."""
    from tqdm import tqdm  # plain tqdm: the notebook flavour imports widgets

    scaler = torch.amp.GradScaler("cpu")
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    bar = tqdm(total=len(loader), file=io.StringIO())
    for window in windows(loader, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                losses = F.cross_entropy(model(x), y, reduction="none")
            scaler.scale(losses.float().sum() / n).backward()
            bar.update()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()  # once per window, after the step
        optimizer.zero_grad(set_to_none=True)
    bar.close()


def clip_by_total_norm(params, max_norm):
    """A clip of one's own, as fairseq and DeepSpeed write them (no torch.nn.utils call to see)."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    for g in grads:
        g.mul_(coef)
    return total


def correct_own_clip(model, optimizer, loader):
    """Correct windows, clipped with the loop's own function: verify must say what it assumed."""
    for window in windows(loader, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        clip_by_total_norm(list(model.parameters()), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def correct_gradual_unfreezing(model, optimizer, loader):
    """The first layer frozen for the first window, unfrozen at a step: every window's gradient is the
    large batch's over the parameters that train in it (verify's oracle follows requires_grad)."""
    first = list(model.parameters())[:2]
    for t, window in enumerate(windows(loader, K)):
        for p in first:
            p.requires_grad_(t > 0)  # between steps, right after zero_grad: never inside a window
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def correct_drop_last(model, optimizer, loader):
    """A loader of its own with drop_last=True: each pass leaves the last, partial micro-batch out by
    design; every window it does draw is stepped, the short last one divided by its own items."""
    dl = torch.utils.data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, drop_last=True, collate_fn=loader.collate_fn
    )
    for window in windows(dl, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def correct_with_replacement(model, optimizer, loader):
    """Items sampled with replacement: some drawn twice in a pass, some never; each draw weighs as one
    item."""
    sampler = torch.utils.data.RandomSampler(
        loader.dataset, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    dl = torch.utils.data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
    )
    for window in windows(dl, K):
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
