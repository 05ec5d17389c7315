"""verify v4: which items a run had to step, counted per pass, not over the whole run (issue 27).

- A loop that carries its window (item count and ``.grad``) across epochs, as torchtune 0.6.1's
  full-finetune recipe does, forwards and backwards the last epoch's partial window and never steps
  it. The first epoch's copy of those items must not hide the last epoch's: ``tail-dropped``.
- An iteration-based loop (nanoGPT's: a fixed number of steps, drawing ahead, never finishing a
  pass) has no tail: the items it never drew are not dropped ones, and it is ``ok`` with a note.
- A loop that rounds its one epoch down to whole windows stops drawing less than a window before the
  pass's end: that remainder is its tail, and it is dropped.

The truth is tallied here by the loops themselves (the items each one stepped and drew), never read
back from verify.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler

import accumlib
from accumlib import get_task

TASK = get_task("mlp-digits")
B = 8
DATA = torch.utils.data.Subset(TASK.make_dataset(), range(96))  # 12 micro-batches a pass


def run(loop, k):
    return accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=DATA,
        item_losses=TASK.item_losses,
        accum_steps=k,
        batch_size=B,
    )


def carrying(epochs, k, tally, step_the_rest):
    """The window carried across epochs: summed losses, .grad divided by the window's count at the step."""

    def train(model, opt, loader):
        n = i = 0
        for _ in range(epochs):
            for x, y in loader:
                F.cross_entropy(model(x), y, reduction="sum").backward()
                n, i = n + len(y), i + 1
                tally["drawn"] += len(y)
                if i % k == 0:
                    for p in model.parameters():
                        p.grad.div_(n)
                    opt.step()
                    opt.zero_grad()
                    tally["stepped"] += n
                    n = 0
        if step_the_rest and n:  # the run's last, partial window
            for p in model.parameters():
                p.grad.div_(n)
            opt.step()
            opt.zero_grad()
            tally["stepped"] += n

    return train


def dropped(report):
    f = next((f for f in report.findings if f.code == "tail-dropped"), None)
    return f.message if f else None


def test_the_last_epochs_unstepped_tail_is_named_though_an_earlier_epoch_stepped_its_items():
    for epochs in (1, 2, 3):
        tally = {"drawn": 0, "stepped": 0}
        report = run(carrying(epochs, 5, tally, step_the_rest=False), k=5)
        lost = tally["drawn"] - tally["stepped"]
        assert lost > 0  # the loop's own tally: its last window was never stepped
        assert "tail-dropped" in report.codes and not report.ok, (epochs, str(report))
        assert dropped(report) == f"{lost} of {tally['drawn']} items reached no optimizer step", epochs
        twin = {"drawn": 0, "stepped": 0}
        fixed = run(carrying(epochs, 5, twin, step_the_rest=True), k=5)
        assert twin["drawn"] == twin["stepped"]
        assert fixed.ok and fixed.codes == set(), (epochs, str(fixed))
        assert fixed.items_stepped == fixed.items_total == twin["drawn"]


def iteration_based(steps, k, tally, replacement):
    """nanoGPT's shape: a fixed number of steps over batches drawn ahead from a sampler of its own."""

    def train(model, opt, loader):
        data = loader.dataset
        if replacement:
            sampler = RandomSampler(data, replacement=True, num_samples=10**6)
            it = iter(DataLoader(data, batch_size=B, sampler=sampler, collate_fn=loader.collate_fn))
        else:  # epochs without end, shuffled
            dl = DataLoader(data, batch_size=B, shuffle=True, collate_fn=loader.collate_fn)
            it = itertools.chain.from_iterable(iter(dl) for _ in itertools.count())
        x, y = next(it)
        for _ in range(steps):
            for _ in range(k):
                loss = F.cross_entropy(model(x), y) / k
                tally["drawn"] += len(y)
                x, y = next(it)  # the next micro-batch, drawn before this one's backward
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            tally["stepped"] += k * B

    return train


def test_an_iteration_based_loop_that_never_ends_a_pass_has_no_tail():
    """nanoGPT draws random batches with replacement: a stream, never a pass over the data to finish."""
    torch.manual_seed(0)
    tally = {"drawn": 0, "stepped": 0}
    report = run(iteration_based(2, 4, tally, replacement=True), k=4)
    assert tally["drawn"] == tally["stepped"] == 64
    assert "tail-dropped" not in report.codes, str(report)
    assert report.ok and report.codes == {"partial-run"}, report.codes
    note = next(f for f in report.findings if f.code == "partial-run").message
    assert "iteration-based loop" in note and "of its 96 items never drawn" in note


def test_a_loop_that_stops_inside_a_pass_over_the_data_drops_the_rest():
    """The same two steps drawn from passes over the data (shuffled, no replacement): the loop stopped
    an epoch early, and what it never drew is dropped (as tests/test_verify_samplers.py says too)."""
    torch.manual_seed(0)
    tally = {"drawn": 0, "stepped": 0}
    report = run(iteration_based(2, 4, tally, replacement=False), k=4)
    assert "tail-dropped" in report.codes and not report.ok, str(report)


def test_an_iteration_based_loop_past_its_first_pass_is_judged_on_what_it_drew():
    torch.manual_seed(0)
    tally = {"drawn": 0, "stepped": 0}
    report = run(iteration_based(5, 4, tally, replacement=False), k=4)  # 20 micro-batches: 1 pass + 8
    assert tally["drawn"] == tally["stepped"] == 160
    assert report.ok and "tail-dropped" not in report.codes, str(report)


def rounding_down(k, tally):
    """One epoch cut to whole windows: the pass's last len(loader) % k micro-batches never drawn."""

    def train(model, opt, loader):
        it = iter(loader)
        for _ in range(len(loader) // k):
            for _ in range(k):
                x, y = next(it)
                (F.cross_entropy(model(x), y, reduction="sum") / (k * B)).backward()
                tally["stepped"] += len(y)
            opt.step()
            opt.zero_grad()

    return train


def test_an_epoch_rounded_down_to_whole_windows_drops_its_tail():
    tally = {"stepped": 0}
    report = run(rounding_down(5, tally), k=5)  # 12 micro-batches: 10 stepped, the last 2 never drawn
    assert tally["stepped"] == 80
    assert "tail-dropped" in report.codes and not report.ok, str(report)
    assert dropped(report) == "16 of 96 items reached no optimizer step"
