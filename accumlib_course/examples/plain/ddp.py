"""Gradient accumulation under DistributedDataParallel, counted in tokens over every rank, in plain PyTorch.

``model`` is wrapped in ``DistributedDataParallel`` and ``loader`` reads this rank's shard (a
``DistributedSampler``); batches are ``(input_ids, labels)`` as in ``tokens`` (labels shifted, -100
on padding). For a window of micro-batches on each of R ranks, N_r tokens on rank r:

    N = all_reduce(sum_r N_r);   each rank's backward: R * sum_{i in b_j} l_i / N

DDP averages the ranks' gradients, (1/R) sum_r R O_r / N = (1/N) sum_r O_r: the gradient of the mean
token loss over every rank's window. Only the window's last backward synchronizes (``no_sync`` on the
others); the last, partial window is stepped too and divided by its own N.

    dist.init_process_group("nccl")  # or "gloo" on the CPU; under torchrun
    model = DistributedDataParallel(model)
    loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset), collate_fn=collate)
    train(model, optimizer, loader, accum_steps=4)
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE_INDEX = -100  # the label of padding: cross_entropy skips it, and so does the count


def train(
    model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    loader,
    *,
    accum_steps: int,
) -> list[float]:
    """One epoch over this rank's ``(input_ids, labels)`` batches; returns each step's mean token loss."""
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
    n = sum((labels != IGNORE_INDEX).sum() for _, labels in window).to(device, torch.float32)
    dist.all_reduce(n)  # the window's tokens on every rank: all ranks divide by the same N
    scale = dist.get_world_size() / n  # times R: DDP divides the summed gradient by R
    total = torch.zeros((), device=device)
    for j, (input_ids, labels) in enumerate(window):
        input_ids, labels = input_ids.to(device), labels.to(device)
        if j < len(window) - 1:
            with model.no_sync():  # gradients add up locally; no communication
                loss_sum = _backward(model, input_ids, labels, scale)
        else:
            loss_sum = _backward(model, input_ids, labels, scale)  # this backward all-reduces the window
        total += loss_sum
    dist.all_reduce(total)  # for the log only: the loss summed over every rank's window
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (total / n).item()


def _backward(model, input_ids, labels, scale) -> torch.Tensor:
    logits = model(input_ids)
    loss_sum = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    (loss_sum * scale).backward()
    return loss_sum.detach()
