"""verify v3: loaders and samplers that drop, repeat or subsample items are understood.

A pass over the data is one DataLoader iteration: its length (``drop_last``, the sampler) says where
the pass ends, so the last window of a ``drop_last=True`` pass is a legitimate tail, not an
``early-step``; what such a pass never draws is stated (``loader-left-out``), not blamed on the loop;
a loop that stops drawing early still gets ``tail-dropped``; items drawn twice in a pass are counted.
Expected counts are computed here from the sampler itself.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import verify_digits
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Sampler

import accumlib
from accumlib.tolerances import FLOAT32_RTOL

TASK = accumlib.get_task("mlp-digits")
K, B, N = 4, 8, 110  # 110 = 13 x 8 + 6: drop_last leaves 6 out per pass; 13 micro-batches = 3 windows + 1
run = functools.partial(verify_digits, n=N, k=K, b=B)


def window_loop(make_loader, *, epochs=2, step_tail=True):
    def loop(model, opt, loader):
        dl = make_loader(loader)
        for _ in range(epochs):
            batches = list(dl)
            for s in range(0, len(batches), K):
                window = batches[s : s + K]
                if len(window) < K and not step_tail:
                    for x, y in window:  # forwarded, never stepped
                        F.cross_entropy(model(x), y).backward()
                    opt.zero_grad()
                    continue
                n = sum(len(y) for _, y in window)
                for x, y in window:
                    (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                opt.step()
                opt.zero_grad()

    return loop


def drop_last(loader):
    return DataLoader(
        loader.dataset,
        batch_size=B,
        drop_last=True,
        shuffle=True,
        collate_fn=loader.collate_fn,
        generator=torch.Generator().manual_seed(0),
    )


def test_drop_last_is_a_stated_choice_not_an_early_step():
    """Before: 'early-step' at steps 3 and 7 (the 1-micro-batch tail of each pass; the dropped 6 items
    were never drawn, so verify never saw a pass end)."""
    report = run(window_loop(drop_last))
    assert report.ok and report.codes == {"loader-left-out"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 1] * 2
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL
    assert "drop_last=True" in str(report) and "6 of 110 per pass" in str(report), str(report)
    assert "early-step" not in str(report) and "step the last, partial window" not in str(report)


def test_drop_last_with_the_tail_window_not_stepped_is_still_tail_dropped():
    report = run(window_loop(drop_last, step_tail=False, epochs=1))
    assert not report.ok and "tail-dropped" in report.codes, str(report)
    assert "8 of 104 items reached no optimizer step" in str(report), str(report)  # micro-batch 13, drawn


def test_a_loop_that_stops_drawing_early_is_tail_dropped_not_left_out():
    """Two windows of a 14-micro-batch loader, then the loop stops: the loader did not choose that."""
    report = run(window_loop(lambda loader: [b for _, b in zip(range(2 * K), loader)], epochs=1))
    assert not report.ok and report.codes == {"tail-dropped"}, str(report)
    assert "46 of 110 items" in str(report)


def test_a_sampler_with_replacement_repeats_items_and_says_so():
    seed = 3

    def replacement(loader):
        return DataLoader(
            loader.dataset,
            batch_size=B,
            collate_fn=loader.collate_fn,
            sampler=RandomSampler(
                loader.dataset, replacement=True, generator=torch.Generator().manual_seed(seed)
            ),
        )

    report = run(window_loop(replacement, epochs=1))
    drawn = list(RandomSampler(range(N), replacement=True, generator=torch.Generator().manual_seed(seed)))
    repeats, never = len(drawn) - len(set(drawn)), N - len(set(drawn))
    assert repeats > 0 and never == repeats  # 110 draws from 110 items
    assert report.ok and report.codes == {"duplicate-items", "loader-left-out"}, str(report)
    assert f"{repeats} draw(s) repeated" in str(report) and f"{never} dataset item(s) left out" in str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


class Unsized(Sampler):
    """A shuffled order with no ``__len__`` (a sampler written as a generator): its DataLoader has no
    length, so nothing says where a pass ends but the items it has drawn."""

    def __init__(self, n, seed=0):
        self.n, self.seed = n, seed

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed)).tolist())


def test_a_sampler_without_a_length_ends_its_pass_at_its_last_item():
    """The pass ends with the micro-batch that draws its 110th item, so the 2-micro-batch window there is
    the pass's tail, not an early step. Issue 27: a pass ending only past the dataset's size survived every
    test, and a probe showed early-step at steps 3 and 7."""

    def unsized(loader):
        return DataLoader(loader.dataset, batch_size=B, sampler=Unsized(N), collate_fn=loader.collate_fn)

    with pytest.raises(TypeError):
        len(unsized(DataLoader(accumlib.data.digits(N))))  # no length: verify counts items
    report = run(window_loop(unsized))
    assert report.ok and not report.codes, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2] * 2
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


class Stream(IterableDataset):
    def __init__(self, n):
        self.data = accumlib.data.digits(n)

    def __iter__(self):
        return iter(self.data[i] for i in range(len(self.data)))


def test_an_iterable_dataset_over_two_epochs_is_ok():
    """12 items, batch 2, k = 4: windows of 4 and 2 micro-batches in each of two passes. The position
    in a pass must restart at each pass end, or the second pass's tail reads as an early step."""

    def loop(model, opt, loader):
        for _ in range(2):
            batches = list(loader)
            for s in range(0, len(batches), K):
                window = batches[s : s + K]
                n = sum(len(y) for _, y in window)
                for x, y in window:
                    (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                opt.step()
                opt.zero_grad()

    report = accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=Stream(12),
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=2,
    )
    assert report.ok and not report.codes, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 2, 4, 2]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_full_pass_without_drop_last_leaves_nothing_out(shuffle):
    report = run(
        window_loop(
            lambda loader: DataLoader(
                loader.dataset, batch_size=B, shuffle=shuffle, collate_fn=loader.collate_fn
            ),
            epochs=1,
        )
    )
    assert report.ok and not report.codes, str(report)
    assert report.items_stepped == report.items_total == N
