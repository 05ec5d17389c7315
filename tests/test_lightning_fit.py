"""accumlib.lightning.verify_fit on real Lightning Trainer.fit runs (the digits MLP).

110 digits in micro-batches of 8 make 13 micro-batches of 8 and one of 6; with
accumulate_grad_batches=4 the last window holds 2 (8 + 6 digits). Lightning divides every
training_step loss by 4 and steps on the final batch too, so that window gets
(1/4)(mean_8 + mean_6): tail-misscaled, and its two micro-batches weighted alike (mean-of-means).
With 128 digits every window is full, and exact.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import accumlib
from accumlib.tolerances import FLOAT32_RTOL

pl = pytest.importorskip("lightning.pytorch", reason="lightning is in the notebooks and test extras")
from accumlib.lightning import verify_fit  # noqa: E402
from accumlib_course.examples.lightning_digits import Digits, item_losses  # noqa: E402

K = 4


def loader(n: int = 110, **kw) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(accumlib.data.digits(n), batch_size=8, **kw)


class CallsSelf(Digits):
    """The other way to write training_step: through self(x), not self.model(x)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


@pytest.mark.parametrize("module", [Digits, CallsSelf])
def test_lightning_divides_the_last_window_by_k(module):
    report = verify_fit(
        module(), loader(), item_losses=item_losses, accumulate_grad_batches=K, accelerator="cpu"
    )
    assert report.codes == {"tail-misscaled", "mean-of-means"}, str(report)
    assert [(r.micro_batches, r.items) for r in report.steps] == [(4, 32), (4, 32), (4, 32), (2, 14)]
    assert all(r.rel_error <= FLOAT32_RTOL for r in report.steps[:3])  # full windows are exact
    (tail,) = [f for f in report.findings if f.code == "tail-misscaled"]
    # 1/k each, not 8/14 and 6/14
    assert tail.steps == (3,) and "weighted [0.25, 0.25], items [8, 6]" in tail.message
    assert report.steps[3].rel_error > 0.5  # about half the true gradient


def test_full_windows_are_exact():
    """The negative control: 128 digits, 16 micro-batches, 4 full windows."""
    report = verify_fit(Digits(), loader(128), item_losses=item_losses, accumulate_grad_batches=K)
    assert report.ok and not report.codes, str(report)
    assert len(report.steps) == 4


def test_clipping_shuffling_and_bf16_keep_the_verdict():
    """The user's gradient_clip_val and precision take part, and a shuffled loader is followed by
    its indices; the tail is the same bug whatever order the digits come in."""
    g = torch.Generator().manual_seed(3)
    report = verify_fit(
        Digits(),
        loader(shuffle=True, generator=g),
        item_losses=item_losses,
        accumulate_grad_batches=K,
        gradient_clip_val=0.5,
        precision="bf16-mixed",
    )
    assert report.codes == {"tail-misscaled", "mean-of-means"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]
    assert {r.judged_against for r in report.steps} == {
        "bfloat16 replay"
    }  # judged in the loop's own precision
    assert any(r.clip < 1 for r in report.steps)  # the clip acted, and was compared like with like


def test_max_steps_judges_two_steps():
    report = verify_fit(Digits(), loader(), item_losses=item_losses, accumulate_grad_batches=K, max_steps=2)
    assert len(report.steps) == 2 and report.codes == {"partial-run"} and report.ok, str(report)


def test_the_users_module_and_loader_are_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Lightning writes lightning_logs/ and checkpoints/ here by default
    module = Digits()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    data = loader(shuffle=True, generator=g)
    gen_state = g.get_state()
    rng = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    log = logging.getLogger("lightning.pytorch")
    monkeypatch.setattr(log, "level", log.level)  # put back after the test
    log.setLevel(logging.DEBUG)  # the user's choice, whatever earlier runs left

    report = verify_fit(
        module,
        data,
        item_losses=item_losses,
        accumulate_grad_batches=K,
        max_epochs=10,
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"))],
    )

    assert len(report.steps) == 4  # one epoch, whatever max_epochs said
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert module._trainer is None and all(p.grad is None for p in module.parameters())
    assert type(module).training_step is Digits.training_step and "training_step" not in vars(module)
    assert torch.equal(g.get_state(), gen_state)  # the loader's own generator never drew
    assert (
        torch.equal(torch.get_rng_state(), rng[0])
        and (np.random.get_state()[1] == rng[1]).all()
        and random.getstate() == rng[2]
    )
    assert list(tmp_path.iterdir()) == []  # no logs, no checkpoints
    assert log.level == logging.DEBUG  # Lightning's banner was silenced for the run only


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: verify_fit(Digits(), [loader()], item_losses=item_losses),
            TypeError,
            r"train_dataloaders must be one torch.utils.data.DataLoader.*\(got list\)",
        ),
        (
            lambda: verify_fit(torch.nn.Linear(2, 2), loader(), item_losses=item_losses),
            TypeError,
            r"module must be a LightningModule .*\(got Linear\)",
        ),
        (
            lambda: verify_fit(Digits(), loader(), item_losses=None),
            TypeError,
            r"item_losses must be callable .*\(got None of type NoneType\)",
        ),
        (
            lambda: verify_fit(Digits(), loader(), item_losses=item_losses, devices=2),
            ValueError,
            r"trainer_kwargs must run one process on one device .*\(got devices=2, num_nodes=1\)",
        ),
        (
            lambda: verify_fit(Digits(), loader(), item_losses=item_losses, max_steps=-1),
            ValueError,
            r"max_steps must be None or an integer >= 1 \(got -1\)",
        ),
        (
            lambda: verify_fit(
                Digits(),
                torch.utils.data.DataLoader(accumlib.data.digits(16), batch_sampler=[[0, 1], [2, 3]]),
                item_losses=item_losses,
            ),
            ValueError,
            r"train_dataloaders must batch with batch_size.*\(got batch_size=None",
        ),
    ],
)
def test_bad_input_is_refused_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()
