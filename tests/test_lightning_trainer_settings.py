"""verify_fit follows the user's Trainer and DataLoader settings, and refuses the ones it cannot judge.

The digits MLP on a real ``lightning.Trainer.fit`` (CPU), as in test_lightning_fit.py: 110 digits
in micro-batches of 8 are 13 micro-batches of 8 and one of 6.
"""

from __future__ import annotations

import re

import pytest
import torch

import accumlib

pl = pytest.importorskip("lightning.pytorch", reason="lightning is in the notebooks and test extras")
from accumlib.lightning import verify_fit  # noqa: E402
from accumlib_course.examples.lightning_digits import Digits, item_losses  # noqa: E402

K = 4


def loader(n: int = 110, **kw) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(accumlib.data.digits(n), batch_size=8, **kw)


def test_without_accumulate_grad_batches_every_micro_batch_is_a_step():
    # Lightning's default is accumulate_grad_batches=1: verify must judge windows of one
    report = verify_fit(Digits(), loader(), item_losses=item_losses)
    assert report.ok and not report.codes and report.accum_steps == 1, str(report)
    assert [(r.micro_batches, r.items) for r in report.steps] == [(1, 8)] * 13 + [(1, 6)]


def test_a_loader_that_drops_its_last_batch_is_followed():
    """drop_last=True: 13 micro-batches, windows 4, 4, 4 and 1; the 6 digits left over are never drawn."""
    report = verify_fit(Digits(), loader(drop_last=True), item_losses=item_losses, accumulate_grad_batches=K)
    assert [(r.micro_batches, r.items) for r in report.steps] == [(4, 32), (4, 32), (4, 32), (1, 8)], str(
        report
    )
    # no mean-of-means: one micro-batch
    assert report.codes == {"tail-misscaled", "loader-left-out"}, str(report)
    assert report.items_stepped == 104


def test_max_steps_past_one_epoch_runs_into_the_next():
    # 4 optimizer steps an epoch; Lightning runs on until max_steps, and verify judges each
    report = verify_fit(Digits(), loader(), item_losses=item_losses, accumulate_grad_batches=K, max_steps=6)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2, 4, 4], str(report)
    assert "partial-run" in report.codes


class Seen(Digits):
    """Records the labels of every micro-batch training_step receives (on the class: verify_fit copies the
    module)."""

    labels: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        Seen.labels.append(batch[1].clone())
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("seeded", [True, False], ids=["own generator", "global generator"])
def test_lightning_trains_on_the_users_shuffled_order(seeded, tmp_path):
    """The micro-batches a plain Trainer.fit(module, loader) trains on, in that order. (A loader with
    its own generator once gave another order: the DataLoader's seed draw from it was skipped.)"""

    def shuffled():
        return loader(shuffle=True, generator=torch.Generator().manual_seed(7) if seeded else None)

    def seen(run):
        Seen.labels = []
        torch.manual_seed(7)
        run()
        return torch.cat(Seen.labels)

    mine = seen(lambda: verify_fit(Seen(), shuffled(), item_losses=item_losses, accumulate_grad_batches=K))
    plain = seen(
        lambda: pl.Trainer(
            max_epochs=1,
            accumulate_grad_batches=K,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        ).fit(Seen(), shuffled())
    )
    assert torch.equal(mine, plain)
    assert not torch.equal(plain, torch.cat([y for _, y in loader()]))  # the order is not the dataset's


def test_a_loader_on_the_global_generator_leaves_it_where_it_was():
    # the loader's seed and its permutation are drawn from torch's global generator, and put back
    module, data = Digits(), loader(shuffle=True)  # Digits() seeds the global generator itself
    torch.manual_seed(11)
    state = torch.get_rng_state()
    verify_fit(module, data, item_losses=item_losses, accumulate_grad_batches=K)
    assert torch.equal(torch.get_rng_state(), state)


class HalveGradients(pl.Callback):
    """A user's callback that changes the gradient: verify must see its effect, on a copy of it."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.calls += 1
        for p in module.parameters():
            p.grad.mul_(0.5)


def test_the_users_callback_takes_part_on_a_copy():
    callback = HalveGradients()  # one callback, not in a list: Lightning accepts both
    report = verify_fit(
        Digits(), loader(128), item_losses=item_losses, accumulate_grad_batches=K, callbacks=callback
    )
    assert not report.ok and len(report.steps) == 4, str(report)
    assert all(abs(r.norm_ratio - 0.5) < 1e-3 for r in report.steps)  # each step saw half the true gradient
    assert callback.calls == 0  # the copy ran, the user's object did not


def test_a_loader_with_workers_is_judged_like_one_without():
    # verify records each micro-batch as the main process draws it; workers would draw elsewhere
    report = verify_fit(Digits(), loader(num_workers=2), item_losses=item_losses, accumulate_grad_batches=K)
    assert report.codes == {"tail-misscaled", "mean-of-means"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]


def test_one_device_named_by_a_string_runs():
    report = verify_fit(
        Digits(), loader(128), item_losses=item_losses, accumulate_grad_batches=K, devices="1"
    )
    assert report.ok and len(report.steps) == 4, str(report)


@pytest.mark.parametrize(
    "settings",
    [dict(devices=[0, 1]), dict(devices=(0, 1)), dict(devices="2"), dict(devices=-1), dict(num_nodes=2)],
)
def test_more_than_one_process_or_device_is_refused(settings):
    with pytest.raises(
        ValueError, match=r"trainer_kwargs must run one process on one device .*\(got devices="
    ):
        verify_fit(Digits(), loader(), item_losses=item_losses, **settings)


@pytest.mark.parametrize("max_steps", [0, True, 1.5, "2"])
def test_max_steps_must_be_a_positive_integer(max_steps):
    with pytest.raises(
        ValueError, match=re.escape(f"max_steps must be None or an integer >= 1 (got {max_steps!r}")
    ):
        verify_fit(Digits(), loader(), item_losses=item_losses, max_steps=max_steps)
