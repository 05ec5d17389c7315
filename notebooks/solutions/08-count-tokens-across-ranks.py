"""Solution of lesson 8's exercise: normalize by the tokens of EVERY rank's window, then let DDP average.

Every rank all-reduces its token count before the first backward (one number per window), so all
ranks divide by the same N; multiplying by R undoes DDP's mean over ranks: each token weighs R/N * 1/R = 1/N.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from accumlib_course.lessons import distributed

K = distributed.EXERCISE_K  # micro-batches per rank per optimizer step
PAD = -100  # target of a padding position: not a token


def train_fn(model, optimizer, loader):
    ddp = DDP(model)  # DDP all-reduces the ranks' gradients and takes their mean
    sampler = DistributedSampler(loader.dataset, shuffle=False)  # this rank's share of the items
    shard = DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
    )
    window = []
    for batch in shard:
        window.append(batch)
        if len(window) < K:
            continue
        n_rank = sum(int((targets != PAD).sum()) for _, targets in window)  # tokens in this rank's window
        n_global = torch.tensor(float(n_rank))
        dist.all_reduce(n_global)  # every rank's tokens: the same N on every rank, before the first backward
        for j, (inputs, targets) in enumerate(window):
            last = j == len(window) - 1
            with contextlib.nullcontext() if last else ddp.no_sync():  # all-reduce once, in the last backward
                keep = targets != PAD
                token_losses = F.cross_entropy(ddp(inputs)[keep], targets[keep], reduction="none")
                loss = token_losses.sum() * dist.get_world_size() / n_global
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window = []
