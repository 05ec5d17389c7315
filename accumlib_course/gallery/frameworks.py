"""Framework loops: Hugging Face Accelerate's ``accumulate()`` and Lightning's
``accumulate_grad_batches``, each run for real (imported on call, so the gallery loads without them).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from ._common import CLIP, K


def accelerate_loop(model, optimizer, loader):
    """Hugging Face Accelerate: prepare() + accumulate(); backward divides by gradient_accumulation_steps."""
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()


def lightning_loop(model, optimizer, loader):
    """PyTorch Lightning: Trainer(accumulate_grad_batches=K, gradient_clip_val=...); steps via a closure."""
    import lightning.pytorch as pl

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer

    log = logging.getLogger("lightning.pytorch")
    level = log.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and loggers, not about accumulation
        log.setLevel(logging.WARNING)  # and its banner (GPU available: ...), restored below
        trainer = pl.Trainer(
            max_epochs=1,
            accumulate_grad_batches=K,
            gradient_clip_val=CLIP,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(Lit(), loader)
        finally:
            log.setLevel(level)
