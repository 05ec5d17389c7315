"""The loops ``accumlib.watch``'s tests run, and the oracle they are judged against: the test's own truth,
``accumlib.true_gradient`` on a copy of the model at the window's first parameters, over the micro-batches
the model was fed (found by the input tensor itself), with the per-item loss the test names.

Tolerance: the engine's reference is O / N, summed from the run's own per-micro-batch gradients in
float32; the test's truth is the merged window's gradient, a different float32 summation order, so
the two agree to ~1e-6 relative (FLOAT32_RTOL is the project's stated bound, 1e-4).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

import accumlib
from accumlib._verify.watch import watch
from accumlib.tolerances import FLOAT32_RTOL

PAD, V = -100, 11


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(x.clamp(min=0))))


def item_losses(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    keep = y != PAD
    return F.cross_entropy(model(x)[keep], y[keep], reduction="none")


def micro_batches(n: int = 10, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Padded token micro-batches whose token counts differ (2 rows, 1 to 7 tokens each)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, V, (2, 7), generator=g)
        y = torch.randint(0, V, (2, 7), generator=g)
        lengths = torch.randint(1, 8, (2,), generator=g)
        y[torch.arange(7)[None, :] >= lengths[:, None]] = PAD
        out.append((x, y))
    return out


def run(loop, k: int = 4, n: int = 10, truth_losses=None, **watch_kw):
    """Run ``loop(model, opt, batches, k)`` under watch; return the report and the test's own figures per
    step: ||G - g*|| / ||g*||, G as the optimizer saw it, g* the merged window's true gradient of
    ``truth_losses`` (default: ``item_losses``, cross-entropy over the unmasked tokens)."""
    model, batches = TinyLM(), micro_batches(n)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = [name for name, _ in model.named_parameters()]
    state = {"start": copy.deepcopy(model), "window": []}
    truth = []
    index = {id(x): i for i, (x, _) in enumerate(batches)}

    def forwarded(module, args):  # which micro-batch the model was fed, by the input tensor itself
        if module is model:  # not the copies the truth is computed on (deepcopy keeps the hook)
            state["window"].append(batches[index[id(args[0])]])

    def before(optimizer, args, kwargs):
        if state["window"]:
            t = accumlib.true_gradient(state["start"], state["window"], truth_losses or item_losses)
            G = torch.cat(
                [(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in model.parameters()]
            )
            T = torch.cat([t[name].reshape(-1) for name in names])
            truth.append(float((G - T).norm() / T.norm()))

    def after(optimizer, args, kwargs):
        state["start"], state["window"] = copy.deepcopy(model), []

    hooks = [
        opt.register_step_pre_hook(before),
        opt.register_step_post_hook(after),
        model.register_forward_pre_hook(forwarded),
    ]
    with watch(**watch_kw) as w:
        loop(model, opt, batches, k)
    for h in hooks:
        h.remove()
    return w.report, truth


def per_window_sum(model, opt, batches, k, before_step=None):
    """Correct: each window's tokens counted first, every token weighed 1/N (accumlib.ragged).
    ``before_step(model)``: what a variant does to .grad between the window's last backward and the step."""
    batches = list(batches)
    for s in range(0, len(batches), k):
        window = batches[s : s + k]
        n = sum(int((y != PAD).sum()) for _, y in window)
        for x, y in window:
            (F.cross_entropy(model(x).transpose(1, 2), y, ignore_index=PAD, reduction="sum") / n).backward()
        if before_step is not None:
            before_step(model)
        opt.step()
        opt.zero_grad()


def mean_over_k(model, opt, batches, k, zero_inside=False, zero=True, clip=False, tail=True):
    """The textbook loop: each micro-batch's mean over its tokens, divided by k."""
    batches = list(batches)
    for i, (x, y) in enumerate(batches):
        (F.cross_entropy(model(x).transpose(1, 2), y, ignore_index=PAD) / k).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if zero_inside and i % k == 1:
            opt.zero_grad()
        if (i + 1) % k == 0 or (tail and i + 1 == len(batches)):
            opt.step()
            if zero:
                opt.zero_grad()


def assert_figures(report, truth):
    """Every step the report judged has the test's own relative error (to float32 rounding)."""
    assert len(report.steps) == len(truth)
    for row, t in zip(report.steps, truth):
        assert math.isclose(row.rel_error, t, rel_tol=1e-3, abs_tol=FLOAT32_RTOL), (row.rel_error, t)
