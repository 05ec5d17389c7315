"""Gradient accumulation under mixed precision (autocast + GradScaler) with clipping, in plain PyTorch.

The identity of ``fixed_size``, each micro-batch's loss multiplied by the scaler's scale S. For a
window of micro-batches b_1..b_m (m <= accum_steps) holding N samples in all:

    .grad after the window  ==  S * sum_j grad( sum_{i in b_j} l_i / N )  ==  S * grad (1/N) sum_i l_i

so the window is unscaled once, after its last backward and before clipping; then one
``scaler.step`` and one ``scaler.update`` per window. N is counted before the first backward; the
last, partial window is stepped too and divided by its own N. float16 on CUDA, bfloat16 on the CPU.
"""

import torch
import torch.nn.functional as F


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader,
    *,
    accum_steps: int,
    max_norm: float = 1.0,
    scaler: torch.amp.GradScaler | None = None,
) -> list[float]:
    """One epoch over ``(x, y)`` batches; returns each step's mean loss. One ``scaler`` for every epoch."""
    device = next(model.parameters()).device
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = scaler or torch.amp.GradScaler(device.type)  # its scale is state: keep it across epochs
    logged = []
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == accum_steps:
            logged.append(_step(model, optimizer, scaler, window, device, dtype, max_norm))
            window = []
    if window:  # the last, partial window: stepped too, with its own N
        logged.append(_step(model, optimizer, scaler, window, device, dtype, max_norm))
    return logged


def _step(model, optimizer, scaler, window, device, dtype, max_norm) -> float:
    n = sum(len(y) for _, y in window)  # the window's samples, counted before any backward
    total = torch.zeros((), device=device)
    for x, y in window:
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=dtype):
            logits = model(x)
        loss_sum = F.cross_entropy(logits.float(), y, reduction="sum")  # the loss in float32
        scaler.scale(loss_sum / n).backward()  # scaled, so float16 gradients do not underflow
        total += loss_sum.detach()
    scaler.unscale_(optimizer)  # once, after the last micro-batch, so clipping sees true magnitudes
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the step if the window's gradient overflowed
    scaler.update()  # once per window: a scale change mid-window would mix scales in .grad
    optimizer.zero_grad(set_to_none=True)
    return total.item() / n
