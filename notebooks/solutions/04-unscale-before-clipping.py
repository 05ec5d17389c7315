"""Solution of lesson 4's exercise: unscale once per window, then clip the true gradient.

After the window's last scaled backward, .grad holds S x g; scaler.unscale_ divides it by S in place,
so clip_grad_norm_ compares the true norm |g| with max_norm. scaler.step then does not unscale again.
"""

import torch
import torch.nn.functional as F


def train_fn(model, optimizer, loader):
    k = 4
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y) / k
        scaler.scale(loss).backward()
        if (i + 1) % k == 0:
            scaler.unscale_(optimizer)  # .grad now holds the true window gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
