"""Gradient accumulation for fixed-size items (one sample, one loss), in plain PyTorch.

For a window of micro-batches b_1..b_m (m <= accum_steps) holding N samples in all:

    grad (1/N) sum_i l_i  ==  sum_j grad( sum_{i in b_j} l_i / N )

N is counted over the whole window before the first backward; the last, partial window is
stepped too and divided by its own N (not by accum_steps x batch size).
"""

import torch
import torch.nn.functional as F


def train(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader, *, accum_steps: int
) -> list[float]:
    """One epoch over ``loader`` of ``(x, y)`` batches; returns each step's mean loss over its window."""
    device = next(model.parameters()).device
    logged = []
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == accum_steps:
            logged.append(_step(model, optimizer, window, device))
            window = []
    if window:  # the last, partial window: stepped too, with its own N
        logged.append(_step(model, optimizer, window, device))
    return logged


def _step(model, optimizer, window, device) -> float:
    n = sum(len(y) for _, y in window)  # the window's samples, counted before any backward
    total = torch.zeros((), device=device)
    for x, y in window:
        x, y = x.to(device), y.to(device)
        loss_sum = F.cross_entropy(model(x), y, reduction="sum")
        (loss_sum / n).backward()  # every sample weighs 1/N, whichever micro-batch holds it
        total += loss_sum.detach()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total.item() / n  # the window's mean loss: log this, not the divided loss
