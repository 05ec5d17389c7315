"""Gradient accumulation for a causal language model, counted in tokens, in plain PyTorch.

Each batch is ``(input_ids, labels)`` with the labels already shifted by the collate (position t
holds the token after input t) and -100 on padding, so the items are the labels that are not -100.
For a window of micro-batches b_1..b_m (m <= accum_steps) holding N such tokens in all:

    grad (1/N) sum_i l_i  ==  sum_j grad( sum_{i in b_j} l_i / N )

N is counted over the whole window before the first backward (a micro-batch's mean divided by k
weighs tokens by the length of the micro-batch that holds them); the last, partial window is
stepped too and divided by its own N.
"""

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # the label of padding: cross_entropy skips it, and so does the count


def train(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader, *, accum_steps: int
) -> list[float]:
    """One epoch over ``loader`` of ``(input_ids, labels)`` batches; returns each step's mean token loss."""
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
    n = sum(int((labels != IGNORE_INDEX).sum()) for _, labels in window)  # tokens, before any backward
    total = torch.zeros((), device=device)
    for input_ids, labels in window:
        input_ids, labels = input_ids.to(device), labels.to(device)
        logits = model(input_ids)  # [batch, time, vocab]; labels are already shifted
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        (loss_sum / n).backward()  # every token weighs 1/N of its window
        total += loss_sum.detach()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total.item() / n  # the window's mean token loss
