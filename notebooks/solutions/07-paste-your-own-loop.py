"""Solution of lesson 7's exercise, for the loop the cell starts with (your own loop has its own fixes).

Two fixes, both about what counts as a step: the warmup scheduler steps once per optimizer step, so
every micro-batch of a window sees one learning rate, as in the large batch; and the logged loss is
the undivided micro-batch mean, weighted by its items, so the epoch loss is the mean item loss.
"""

import torch
import torch.nn.functional as F


def train_fn(model, optimizer, loader):
    accum_steps = 4
    # warmup, in steps
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)
    scaler = torch.amp.GradScaler("cpu")
    running_loss, n_items = 0.0, 0
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mean = F.cross_entropy(model(x), y)
        scaler.scale(mean / accum_steps).backward()  # the division reaches backward ...
        if (step + 1) % accum_steps == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()  # once per optimizer step: a window sees one learning rate
            optimizer.zero_grad()
        running_loss += mean.item() * len(y)  # ... the log does not
        n_items += len(y)
    return running_loss / n_items
