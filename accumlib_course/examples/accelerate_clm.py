"""The training loop of transformers' ``examples/pytorch/language-modeling/run_clm_no_trainer.py``,
on a tiny Llama built from its config, checked with plain ``accumlib.verify``.

``train`` is that script's loop as it stands: ``Accelerator(gradient_accumulation_steps=k)``,
``with accelerator.accumulate(model)``, the model's own ``outputs.loss`` (the mean over the
micro-batch's predicted tokens) and ``accelerator.backward(loss)``, which divides it by k.
Every window is then a mean of k micro-batch means, not the mean over its tokens:

    g  =  (1/k) sum_j (1/n_j) sum_{i in j} grad l_i      where the truth is   (1/N) sum_i grad l_i

right only when every micro-batch holds the same number of predicted tokens (the script's
``group_texts`` makes equal blocks; padded data does not), and wrong for the ragged last window,
which Accelerate steps at the end of the loader but still divides by k.

``train_counted`` is the same loop done the way Accelerate's guide on variable-size inputs
describes: draw the window first, count its tokens N, backward ``sum / N`` (times k, which
``accelerator.backward`` divides out again), so ``g = (1/N) sum_i grad l_i`` in every window.

    >>> import accumlib
    >>> from accumlib_course.examples import accelerate_clm as ex
    >>> report = accumlib.verify(ex.train, **ex.verify_args())      # doctest: +SKIP
    >>> sorted(report.codes)                                        # doctest: +SKIP
    ['mean-of-means', 'tail-misscaled']
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from accumlib.batches import windows
from accumlib_course.examples.data import IGNORE_INDEX, collate, token_sequences

K = 4  # gradient_accumulation_steps
BATCH = 2  # per_device_train_batch_size: 22 sequences make windows of 4, 4 and 3 micro-batches
VOCAB = 64


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """A one-layer LlamaForCausalLM from its config (nothing downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


def item_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss the model averages, per item: cross-entropy of every predicted token (the causal shift)."""
    logits = (
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    )
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE_INDEX
    return F.cross_entropy(logits[keep], targets[keep], reduction="none")


def _accelerator() -> Any:
    from accelerate import Accelerator

    return Accelerator(gradient_accumulation_steps=K, cpu=True)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> None:
    """run_clm_no_trainer.py's epoch: Accelerate's ``accumulate`` over the model's mean loss."""
    from transformers import get_scheduler

    accelerator = _accelerator()
    lr_scheduler = get_scheduler(
        "linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=math.ceil(len(loader) / K)
    )
    # prepared too: Accelerate's scheduler steps only when its optimizer does
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader, lr_scheduler)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss  # the micro-batch's mean over its own predicted tokens
            accelerator.backward(loss)  # divided by k, whatever the window holds
            optimizer.step()  # Accelerate steps only at the end of a window or of the loader
            lr_scheduler.step()
            optimizer.zero_grad()


def train_counted(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> None:
    """The same epoch, each window divided by its own predicted-token count N."""
    from transformers import get_scheduler

    accelerator = _accelerator()
    lr_scheduler = get_scheduler(
        "linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=math.ceil(len(loader) / K)
    )
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader, lr_scheduler)
    model.train()
    # k micro-batches at a time, the tail too: tokens counted before backward
    for window in windows(loader, K):
        n = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in window)  # after the shift
        n = int(accelerator.gather(torch.tensor(n, device=accelerator.device)).sum())  # all processes' tokens
        for i, batch in enumerate(window):
            last = i == len(window) - 1
            # sync (all-reduce) only on the window's last backward; one process needs no no_sync
            ctx = (
                accelerator.no_sync(model)
                if not last and accelerator.num_processes > 1
                else contextlib.nullcontext()
            )
            with ctx:
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits.float()
                summed = F.cross_entropy(
                    logits[:, :-1].flatten(0, 1),
                    batch["labels"][:, 1:].flatten(),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                # sum / N for this process's share; x k x processes because backward divides by k and
                # DDP averages
                accelerator.backward(summed / n * K * accelerator.num_processes)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()


def verify_args() -> dict[str, Any]:
    """``accumlib.verify``'s arguments for these loops: a fresh tiny Llama, the variable-length data
    (22 sequences, micro-batches of 2, k = 4: windows of 4, 4 and 3), and AdamW as the script uses."""
    return dict(
        model=tiny_llama(),
        dataset=token_sequences(vocab=VOCAB),
        item_losses=item_losses,
        accum_steps=K,
        batch_size=BATCH,
        collate_fn=collate,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )


def reset_accelerate() -> None:
    """Accelerate keeps one process-wide state; each ``Accelerator`` above joins it. Clear it
    between runs that need a different configuration (tests do, before and after)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


__all__ = [
    "BATCH",
    "K",
    "VOCAB",
    "item_losses",
    "reset_accelerate",
    "tiny_llama",
    "train",
    "train_counted",
    "verify_args",
]
