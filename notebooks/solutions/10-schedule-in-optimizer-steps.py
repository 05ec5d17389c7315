"""Solution of lesson 10's exercise: warmup and total counted in optimizer steps, the scheduler stepped once
per step.

The loader holds 24 micro-batches; with k = 4 that is 6 optimizer steps, the length of the schedule.
Warmup is 2 optimizer steps. ``scheduler.step()`` sits beside ``optimizer.step()``.
"""

import math

import torch.nn.functional as F

from accumlib_course.lessons import your_own_project as your_project


def train_fn(model, optimizer, loader):
    k = 4
    total = math.ceil(len(loader) / k)  # optimizer steps in the epoch, a partial last window included
    scheduler = your_project.linear_warmup(optimizer, warmup_steps=2, total_steps=total)
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / k  # six full windows of 4 x 8: each mean weighs 1/k
        loss.backward()
        if (i + 1) % k == 0 or i + 1 == len(loader):
            optimizer.step()
            scheduler.step()  # the schedule counts optimizer steps
            optimizer.zero_grad()
