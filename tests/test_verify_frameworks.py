"""verify on real Accelerate and Lightning loops beyond the gallery: mixed precision, an optimizer
the framework's user builds inside the loop. (The gallery covers the plain and clipped cases.)"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import K
from conftest import verify_digits as run

import accumlib

TASK = accumlib.get_task("mlp-digits")


@pytest.fixture
def fresh_accelerate():
    """Accelerate keeps one process-wide state; a different mixed_precision needs it reset (before and
    after)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def accelerate_bf16(model, optimizer, loader):
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True, mixed_precision="bf16")
    # autocast now wraps model.forward
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()


@pytest.mark.parametrize("n, codes", [(128, set()), (110, {"tail-misscaled", "mean-of-means"})])
def test_accelerate_mixed_precision(fresh_accelerate, n, codes):
    report = run(accelerate_bf16, n=n)
    assert report.codes == codes, str(report)
    # bf16 forward: the steps are close, not exact (so the bf16 tolerance was applied, and needed)
    full = [r.rel_error for r in report.steps if r.micro_batches == K]
    assert max(full) <= accumlib.tolerances.BF16_RTOL and max(full) > accumlib.tolerances.FLOAT32_RTOL


def lightning_own_adam_bf16(model, optimizer, loader):
    import lightning.pytorch as pl

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            # the usual Lightning way: not verify's optimizer
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pl.Trainer(
                max_epochs=1,
                accumulate_grad_batches=K,
                precision="bf16-mixed",
                accelerator="cpu",
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            ).fit(Lit(), loader)
    finally:
        log.setLevel(level)


def test_lightning_own_optimizer_and_bf16():
    report = run(lightning_own_adam_bf16, n=110)
    assert report.codes == {"tail-misscaled", "mean-of-means"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]
