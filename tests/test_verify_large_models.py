"""A model over a million parameters: the oracle takes each micro-batch's gradient one tensor at a
time (a hook per parameter) and its dot products a chunk at a time, not whole as for a small model.
The verdicts must be the same as on the small path: exact where the loop is right, each bug named."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accumlib
from accumlib._verify.window_oracle import CHUNK, SMALL
from accumlib.tolerances import FLOAT32_RTOL

K, WIDE = 4, 1100


def wide():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, WIDE),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDE, 1000),
        torch.nn.Tanh(),
        torch.nn.Linear(1000, 10),
    )


def losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def loop(model, opt, loader, *, divide=True, zero=True, bf16=False, scaler_init=None, before_step=None):
    scaler = torch.amp.GradScaler("cpu", init_scale=scaler_init) if scaler_init else None
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        for x, y in window:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = (
                    F.cross_entropy(model(x), y, reduction="sum") / n
                    if divide
                    else F.cross_entropy(model(x), y)
                )
            (scaler.scale(loss) if scaler else loss).backward()
        if before_step is not None:
            before_step(model)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if zero:
            opt.zero_grad(set_to_none=True)


def run(oracle="auto", **kw):
    return accumlib.verify(
        lambda m, o, dl: loop(m, o, dl, **kw),
        model=wide(),
        dataset=accumlib.data.digits(48),
        item_losses=losses,
        accum_steps=K,
        batch_size=8,
        oracle=oracle,
    )


def test_the_model_is_over_the_small_path_and_a_chunk():
    sizes = [p.numel() for p in wide().parameters()]
    assert sum(sizes) > SMALL and max(sizes) > CHUNK


@pytest.mark.parametrize(
    "kw, codes",
    [
        ({}, set()),
        ({"scaler_init": 2.0**10}, set()),  # the replay divides GradScaler's scale out, tensor by tensor
        ({"bf16": True}, set()),
        ({"divide": False}, {"unscaled-sum"}),
        ({"zero": False}, {"no-zero-grad"}),
    ],
    ids=["exact", "gradscaler", "bf16", "naive", "no-zero-grad"],
)
def test_a_large_model_gets_the_small_models_verdicts(kw, codes):
    report = run(**kw)
    assert report.codes == codes, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 2]
    if not codes and not kw.get("bf16"):
        assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)


@pytest.mark.parametrize("oracle", ["auto", "recompute"])
def test_a_change_to_grad_past_a_large_tensors_first_chunk_is_seen(oracle):
    """Before each step the loop doubles the gradient of the 1.1M-entry weight past its first CHUNK entries:
    only the second chunk of that tensor is wrong, where no fingerprint looks. Both oracles read the same
    error, which the step's Gram matrix finds only if it sums every chunk."""

    def tail_doubled(model):
        with torch.no_grad():
            model[2].weight.grad.view(-1)[CHUNK:] *= 2

    assert wide()[2].weight.numel() > CHUNK
    report = run(oracle, before_step=tail_doubled)
    assert not report.ok, str(report)
    assert report.oracle == ("in-place" if oracle == "auto" else "recompute")
    assert all(r.rel_error > 1e-3 for r in report.steps), str(report)
