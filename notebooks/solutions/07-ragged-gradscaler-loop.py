"""Solution of lesson 7's exercise: the seed question's GradScaler loop, stepping the ragged last window right.

Collect a window's micro-batches, count its items N, then backward each micro-batch's summed loss / N:
every item weighs 1/N in its own window, the last, shorter window included.
"""

import torch
import torch.nn.functional as F


def train_fn(model, optimizer, loader):
    iters_to_accumulate = 4
    scaler = torch.amp.GradScaler("cpu")
    window = []
    for i, (x, y) in enumerate(loader):
        window.append((x, y))
        if len(window) == iters_to_accumulate or i + 1 == len(loader):
            n_items = sum(len(yb) for _, yb in window)
            for xb, yb in window:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(xb), yb, reduction="sum") / n_items
                scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            window = []
