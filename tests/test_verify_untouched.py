"""verify never changes the caller's objects, even through what points back at them: a forward
patched on the instance (TRL's fused head: a closure over the original's bound forward), a hook that
closes over the model, a function attribute whose default argument is a layer, a partial over a
parameter. verify's copy must run on its own weights, so the caller's model keeps its weights, its
counters and an empty .grad, and the verdict is the oracle's."""

from __future__ import annotations

import copy
import functools
import types

import torch
import torch.nn.functional as F

import accumlib
from accumlib.tolerances import FLOAT32_RTOL

K = 4


class Patched(torch.nn.Module):
    """A digits classifier whose pieces refer back to the instance in every way copy.deepcopy misses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.out = torch.nn.Linear(64, 16), torch.nn.Linear(16, 10)
        self.gain = torch.nn.Parameter(torch.tensor(1.5))
        self.calls = 0
        self.act = functools.partial(torch.mul, self.gain)  # a partial over a parameter
        self.head = lambda h, layer=self.out: layer(h)  # a default argument bound to a layer
        owner = self

        def count(module, args):  # a hook closing over the model
            owner.calls += 1

        self.register_forward_pre_hook(count)

    def forward(self, x):
        return self.head(torch.tanh(self.act(self.body(x))))


def patched():
    model = Patched()
    original = model.forward  # as TRL's add_fused_lm_head does: the original bound forward, in a closure
    model.forward = types.MethodType(lambda self, x: original(x) * self.gain, model)
    inner = model.body.forward  # and on a submodule, as Accelerate's hooks do
    model.body.forward = types.MethodType(lambda self, x: inner(x) + self.bias, model.body)
    return model


def losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def windows(model, opt, loader, divide=True):
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        for x, y in window:
            (
                F.cross_entropy(model(x), y, reduction="sum") / n if divide else F.cross_entropy(model(x), y)
            ).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_the_callers_patched_model_is_untouched_and_the_copy_judged():
    model, data = patched(), accumlib.data.digits(110)
    before = copy.deepcopy(model.state_dict())
    items = [t.clone() for t in data.tensors]
    report = accumlib.verify(
        windows, model=model, dataset=data, item_losses=losses, accum_steps=K, batch_size=8
    )
    assert report.ok and not report.codes and max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(
        report
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert model.calls == 0  # no forward of verify's ran the caller's hook
    assert all(torch.equal(a, b) for a, b in zip(items, data.tensors))
    naive = accumlib.verify(
        lambda m, o, dl: windows(m, o, dl, divide=False),
        model=model,
        dataset=data,
        item_losses=losses,
        accum_steps=K,
        batch_size=8,
    )
    assert naive.codes == {"unscaled-sum"}, str(naive)
    assert all(p.grad is None for p in model.parameters()) and model.calls == 0


def torch_as_it_is():
    """What verify patches or hooks in torch for the run (clipping, GradScaler, schedulers, DataLoader
    iteration, the global optimizer-step hook), as it is now."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    from torch.utils.data import DataLoader

    return (
        torch.nn.utils.clip_grad_norm_,
        torch.nn.utils.clip_grad.clip_grad_norm_,
        torch.amp.GradScaler.step,
        torch.amp.GradScaler.scale,
        torch.optim.lr_scheduler.LRScheduler.step,
        DataLoader.__iter__,
        list(_global_optimizer_pre_hooks),
    )


def test_torch_is_left_as_verify_found_it_after_a_run_a_max_steps_stop_and_an_error():
    before = torch_as_it_is()

    def broken(model, opt, loader):
        windows(model, opt, list(loader)[:K])
        raise KeyError("user bug")

    runs = [dict(fn=windows), dict(fn=windows, max_steps=1), dict(fn=broken)]
    for kw in runs:
        fn = kw.pop("fn")
        try:
            accumlib.verify(
                fn,
                model=patched(),
                dataset=accumlib.data.digits(64),
                item_losses=losses,
                accum_steps=K,
                batch_size=8,
                **kw,
            )
        except KeyError:
            assert fn is broken
        assert torch_as_it_is() == before, fn.__name__
