"""The cited posts' and tutorial's loops, ported to torch and the digits MLP, line for line where they can be.

"How Gradient accumulation is implemented" is a BERT fine-tuning ``train_one_epoch`` (divides the
loss, logs the divided loss, never steps the tail); the MindSpore tutorial "Gradient Accumulation
Algorithm" has an ``Accumulator``; the blog post "Gradient Accumulation explained" steps the last
batch too; the article "Gradient Accumulation in PyTorch, GANs and other Nightmares" trains a GAN with
two optimizers (loss / n, or ``.grad / n``). Lessons 1, 2 and 6 show these loops and link the sources.
"""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ._common import K


def bert_train_one_epoch(
    model,
    optimizer,
    scheduler,
    dataloader,
    device,
    epoch,
    *,
    n_accumulate,
    criterion,
    progress=False,
    collect=True,
):
    """The BERT post's ``train_one_epoch``, line for line, with (ids, mask) -> the digits' (x, y).

    It divides the loss by ``n_accumulate`` before ``backward`` (right), steps and moves the
    scheduler every ``n_accumulate`` micro-batches (right), but adds the *divided* loss to
    ``running_loss``, so the epoch loss it reports is 1/k of the true one.
    """
    model.train()
    dataset_size = 0
    running_loss = 0.0
    bar = tqdm(enumerate(dataloader), total=len(dataloader), disable=not progress)
    for step, data in bar:
        inputs = data[0].to(device)
        targets = data[1].to(device, dtype=torch.long)
        batch_size = inputs.size(0)
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss = loss / n_accumulate
        loss.backward()
        if (step + 1) % n_accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
        running_loss += loss.item() * batch_size  # the bug: loss was divided by n_accumulate above
        dataset_size += batch_size
        epoch_loss = running_loss / dataset_size
        bar.set_postfix(Epoch=epoch, Train_Loss=epoch_loss, LR=optimizer.param_groups[0]["lr"])
    if collect:  # the post's gc.collect(); it frees nothing here and costs ~0.5 s, so compute() skips it
        gc.collect()
    return epoch_loss


def bert_style_epoch(model, optimizer, loader):
    """BERT-style epoch: divided loss, step on (step + 1) % K, scheduler per step, running_loss of the
    divided loss."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + s))
    device = next(model.parameters()).device
    return bert_train_one_epoch(
        model,
        optimizer,
        scheduler,
        loader,
        device,
        0,
        n_accumulate=K,
        criterion=torch.nn.CrossEntropyLoss(),
        collect=False,
    )


class Accumulator:
    """The MindSpore tutorial's Accumulator in torch: grads summed in inner_grads, applied every K calls."""

    def __init__(self, optimizer, accumulate_step):
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.inner_grads = [torch.zeros_like(p) for p in self.params]
        self.counter = 1  # MindSpore starts its counter at 1 and tests it before incrementing
        self.accumulate_step = accumulate_step

    def __call__(self, grads):
        for acc, g in zip(self.inner_grads, grads):
            acc.add_(g)
        if self.counter % self.accumulate_step == 0:
            for p, acc in zip(self.params, self.inner_grads):
                p.grad = acc.clone()  # self.optimizer(self.inner_grads)
            self.optimizer.step()
            for acc in self.inner_grads:
                acc.zero_()
        self.counter += 1


def mindspore_accumulator(model, optimizer, loader):
    """forward_fn divides by accumulate_step; grads come functionally; no step after the last call."""
    accumulator = Accumulator(optimizer, K)
    params = [p for p in model.parameters() if p.requires_grad]
    for x, y in loader:
        loss = F.cross_entropy(model(x), y) / K
        accumulator(torch.autograd.grad(loss, params))


def last_batch_step(model, optimizer, loader):
    """The blog post: divide by K, step on (i + 1) % K, then 'handle the last batch' with one more step."""
    optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
    if (i + 1) % K != 0:
        optimizer.step()
        optimizer.zero_grad()


def gan_loss_divided(model, optimizer, loader):
    """The GAN article's first form: loss / n_accumulation_steps inside an inner loop that draws its
    samples."""
    data = iter(loader)
    for _ in range(len(loader) // K):
        for _ in range(K):
            x, y = next(data)
            loss = F.cross_entropy(model(x), y)
            loss = loss / K
            loss.backward()  # the article's snippet leaves the backward implicit
        optimizer.step()
        optimizer.zero_grad()


def gan_grad_divided(model, optimizer, loader):
    """The GAN article's second form: undivided losses, then every .grad divided by n once per window."""
    data = iter(loader)
    for _ in range(len(loader) // K):
        for _ in range(K):
            x, y = next(data)
            F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            p.grad = p.grad / K
        optimizer.step()
        optimizer.zero_grad()
