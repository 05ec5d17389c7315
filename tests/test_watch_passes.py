"""Several epochs under ``accumlib.watch`` (``accumlib run``): a pass's short last window is its tail, not
an early step, wherever the pass ends (watch.py ``_passes``, which reads the DataLoader the run draws from).

Before: the engine knew only where the run ended, so a correct three-epoch loop with a stepped tail each
epoch read ``early-step`` at every tail, the last one included (44 items in micro-batches of 4 and k = 4:
windows 4, 4, 3 per pass, the run's 33 micro-batches leaving 1, not 3, as "the tail"). Each verdict here
is checked against the test's own truth (``accumlib.true_gradient`` at the window's first parameters, over
the micro-batches the model was fed), and each correct loop has a broken twin.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import accumlib
from accumlib._verify.watch import watch
from accumlib.tolerances import FIT_RTOL, FLOAT32_RTOL

K, B, ITEMS = 4, 4, 44  # 11 micro-batches a pass: windows of 4, 4 and a tail of 3


def _item_losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(ITEMS, 5, generator=g), torch.randint(0, 3, (ITEMS,), generator=g))


def run(loop, epochs: int = 3):
    """``loop(model, opt, loader, epochs)`` under watch on a shuffled loader; the report and, per step, the
    test's own ||G - g*|| / ||g*||."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    loader = DataLoader(_data(), batch_size=B, shuffle=True, generator=torch.Generator().manual_seed(1))
    state, truth = {"start": copy.deepcopy(model), "window": []}, []

    def fed(module, args):
        if module is model:
            state["window"].append(args[0])

    def before(opt, args, kwargs):
        xs = torch.cat(state["window"])
        ys = torch.cat([_labels[id(x)] for x in state["window"]])
        t = accumlib.true_gradient(state["start"], [(xs, ys)], _item_losses)
        G = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        T = torch.cat([t[name].reshape(-1) for name, _ in model.named_parameters()])
        truth.append(float((G - T).norm() / T.norm()))

    def after(opt, args, kwargs):
        state["start"], state["window"] = copy.deepcopy(model), []

    _labels: dict[int, torch.Tensor] = {}

    def labelled():  # the labels of each input the model is fed, found by the input tensor itself
        for _ in range(epochs):
            for x, y in loader:
                _labels[id(x)] = y
                yield x, y

    model.register_forward_pre_hook(fed)
    with watch(accum_steps=K) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.register_step_pre_hook(before)
        opt.register_step_post_hook(after)
        loop(model, opt, loader, epochs, labelled)
    return seen.report, truth


def per_pass(early_at: int | None = None):
    """The correct loop: each window's summed item losses over its own item count, the tail stepped as
    each pass ends. ``early_at``: also step after micro-batch ``early_at`` of every pass, each window still
    divided by its own count (the broken twin: windows 2, 2, 4, 3)."""

    def loop(model, opt, loader, epochs, labelled):
        n, it = len(loader), labelled()
        ends = sorted({*range(K, n, K), n} | ({early_at + 1} if early_at is not None else set()))
        for _ in range(epochs):
            start = 0
            for end in ends:
                for _ in range(start, end):
                    x, y = next(it)
                    (F.cross_entropy(model(x), y, reduction="sum") / (B * (end - start))).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                start = end

    return loop


def test_three_epochs_with_a_stepped_tail_each_are_ok_against_the_tests_own_truth():
    report, truth = run(per_pass())
    assert report.ok and report.codes == set(), report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * 3
    assert report.items_stepped == report.items_total == 3 * ITEMS
    assert max(truth) < FLOAT32_RTOL and max(r.rel_error for r in report.steps) < FLOAT32_RTOL


def test_a_step_inside_a_pass_is_still_early_in_every_epoch():
    report, truth = run(per_pass(early_at=1))  # windows 2, 2, 4, 3 a pass: the 2s come early
    assert not report.ok and report.codes == {"early-step"}, report
    early = next(f for f in report.findings if f.code == "early-step")
    assert early.steps == (0, 1, 4, 5, 8, 9)
    assert max(truth) < FLOAT32_RTOL  # each window's own gradient is right; the steps come too soon


@pytest.mark.parametrize("epochs", [1, 2])
def test_accelerates_prefetching_loader_ends_its_passes_at_their_tails(epochs):
    """Accelerate's prepared DataLoader draws one micro-batch ahead. Its accumulate() divides every
    micro-batch by k, the tail's 3 too: each pass's tail is misscaled (as gallery "accelerate-tail" is;
    equal micro-batches here, so no mean-of-means), never an early step."""
    from accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with watch(accum_steps=K) as seen:
        acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        net, opt, loader = acc.prepare(model, opt, DataLoader(_data(), batch_size=B, shuffle=True))
        for _ in range(epochs):
            for x, y in loader:
                with acc.accumulate(net):
                    acc.backward(F.cross_entropy(net(x), y))
                    opt.step()
                    opt.zero_grad()
    report = seen.report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * epochs, report
    assert report.codes == {"tail-misscaled"}, report
    tails = next(f for f in report.findings if f.code == "tail-misscaled").steps
    assert tails == tuple(3 * e + 2 for e in range(epochs))


def rounded_down(stop_after: int | None = None):
    """Each epoch cut to whole windows (the pass's last 3 micro-batches never drawn), after a probe of one
    batch (``next(iter(loader))``, no step). ``stop_after``: the loop's own step budget, which ends the run
    inside a pass (a max_steps: nothing is left for a next pass)."""

    def loop(model, opt, loader, epochs, labelled):
        next(iter(loader))
        steps = 0
        for _ in range(epochs):
            it = iter(loader)
            for _ in range(len(loader) // K):
                for _ in range(K):
                    x, y = next(it)
                    (F.cross_entropy(model(x), y, reduction="sum") / (B * K)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                if steps == stop_after:
                    return

    return loop


def _run_plain(loop, epochs=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    loader = DataLoader(_data(), batch_size=B, shuffle=True)
    with watch(accum_steps=K) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loop(model, opt, loader, epochs, None)
    return seen.report


def test_epochs_rounded_down_to_whole_windows_drop_each_passes_tail():
    report = _run_plain(rounded_down())
    assert not report.ok and report.codes == {"tail-dropped"}, report
    said = next(f for f in report.findings if f.code == "tail-dropped").message
    # passes 1 and 2 left 3 micro-batches each for the next pass; the probe took no step, so it is no pass
    assert said.startswith("6 micro-batches were never drawn") and "(of 11 micro-batches)" in said, said
    assert all(r.rel_error < FLOAT32_RTOL for r in report.steps)  # each step's own gradient is right
    assert report.items_stepped == 96 and report.items_total is None  # the undrawn items: not counted as 0


def test_windows_drawn_from_a_fresh_shuffled_iterator_each_are_sampling_not_a_dropped_tail():
    """Each window draws its k micro-batches from a new shuffled iterator (random batches, as an
    iteration-based loop samples): every pass is left with 7 of its 11 undrawn, more than a window, which
    is no epoch's tail. The same loop's windows are exact."""

    def loop(model, opt, loader, epochs, labelled):
        for _ in range(6):
            it = iter(loader)
            for _ in range(K):
                x, y = next(it)
                (F.cross_entropy(model(x), y, reduction="sum") / (B * K)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    report = _run_plain(loop)
    assert report.ok and report.codes == set(), report


def test_an_evaluation_stopped_early_between_epochs_is_no_training_pass():
    """After each epoch, an evaluation of the same data under no_grad that stops 2 batches short (fewer
    than a window, as a dropped tail is): that pass closes no step, so leaving it unfinished drops nothing;
    the training passes each end at their tails."""
    correct = per_pass()

    def loop(model, opt, loader, epochs, labelled):
        for _ in range(epochs):
            correct(model, opt, loader, 1, lambda: iter(loader))
            with torch.no_grad():
                for i, (x, _) in enumerate(loader):
                    model(x)
                    if i == len(loader) - 3:  # 9 of 11 drawn
                        break

    report = _run_plain(loop)
    assert report.ok and report.codes == set(), report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * 3


def test_a_run_that_ends_inside_its_first_pass_is_no_dropped_tail_under_watch():
    """The loop's own step budget ends the run inside a pass: nothing began after it, so nothing was left
    for a next pass (verify(train_fn), which hands out the data, names this tail-dropped)."""
    report = _run_plain(rounded_down(stop_after=1))
    assert report.ok and report.codes == set(), report


def test_lightnings_prefetching_fetcher_ends_its_passes_at_their_tails():
    """Lightning's Trainer(accumulate_grad_batches=4) over two epochs: its data fetcher draws one batch ahead,
    it closes each epoch's 3-micro-batch window and divides each micro-batch by k: the tails are misscaled
    (c = 3/4, as gallery "lightning-tail"), never early."""
    import logging
    import warnings

    import lightning.pytorch as pl

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    log = logging.getLogger("lightning.pytorch")
    level = log.level
    try:
        with warnings.catch_warnings(), watch() as seen:
            warnings.simplefilter("ignore")  # Lightning's advice on workers and loggers
            log.setLevel(logging.WARNING)
            trainer = pl.Trainer(
                max_epochs=2,
                accumulate_grad_batches=K,
                accelerator="cpu",
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
            trainer.fit(Lit(), DataLoader(_data(), batch_size=B, shuffle=True))
    finally:
        log.setLevel(level)
    report = seen.report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * 2, report
    assert report.codes == {"tail-misscaled"}, report
    assert next(f for f in report.findings if f.code == "tail-misscaled").steps == (2, 5)
    # c = 3/4 exactly in arithmetic; float32 gradients put it within FIT_RTOL on any CPU
    assert [r.factor for r in report.steps] == pytest.approx([1.0, 1.0, 0.75] * 2, rel=FIT_RTOL)


def test_accum_steps_read_from_a_tied_run_is_the_longer_window():
    """No accum_steps given: k is read from the run, the most common window length, the longer on a tie.
    Windows 4, 2, 4, 2 (no DataLoader, so no pass ends): k = 4, and the 2s are the early steps. (Read as 2,
    the 4s would be late instead: the loop meant 4, as its longer windows show.)"""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    data = _data()
    xs, ys = data.tensors
    with watch() as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        at = 0
        for m in (4, 2, 4, 2):
            for _ in range(m):
                x, y = xs[at : at + B], ys[at : at + B]
                at += B
                (F.cross_entropy(model(x), y, reduction="sum") / (B * m)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    report = seen.report
    assert report.accum_steps == 4, report
    assert report.codes == {"early-step"}, report
    assert next(f for f in report.findings if f.code == "early-step").steps == (1, 3)
