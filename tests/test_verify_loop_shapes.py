"""verify follows a loop whatever shape its data handling takes: lengths read before iterating, a
dataset swept for its items' lengths (a length-grouped sampler), the last micro-batch run inside
``optimizer.step(closure)``, a large batch on a loader that draws ahead, a window's forwards run
before its one backward, and a second forward of a micro-batch already used. Each correct loop must be
exact against the oracle; each buggy one must get its own code and no other."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import exact, verify_digits
from torch.utils.data import DataLoader

import accumlib
from accumlib import get_task
from accumlib.tolerances import FLOAT32_RTOL

K, B = 4, 8
TASK = get_task("mlp-digits")
run = functools.partial(verify_digits, n=110)
LM = get_task("lm-tokens")


# ---- lengths read before the first micro-batch ----------------------------------------------------


def counted_from_lengths(model, opt, loader, tail_as_full=False):
    """Each window's item count computed from len(loader) and len(loader.dataset), read up front."""
    n_batches, n_items = len(loader), len(loader.dataset)
    full = n_batches - n_batches % K  # micro-batches in full windows
    for i, (x, y) in enumerate(loader):
        n = K * B if i < full or tail_as_full else n_items - full * B
        (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        if (i + 1) % K == 0 or i + 1 == n_batches:
            opt.step()
            opt.zero_grad(set_to_none=True)


def test_lengths_read_before_iterating_leave_the_windows_as_drawn():
    report = run(counted_from_lengths)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [
        4,
        4,
        4,
        2,
    ] and report.items_stepped == report.items_total == 110
    # the 14-item tail divided by 32
    wrong = run(lambda m, o, dl: counted_from_lengths(m, o, dl, tail_as_full=True))
    assert wrong.codes == {"misscaled"} and [r.codes for r in wrong.steps][:3] == [()] * 3, str(wrong)
    assert wrong.steps[3].norm_ratio == pytest.approx(14 / 32, rel=FLOAT32_RTOL)  # |G| / |g*| from the oracle


def length_grouped(model, opt, loader, divide=True):
    """The Trainer's length-grouped sampler, by hand: every item read for its length (by index, up to
    len(loader.dataset)) before a batch is drawn, then batches of similar lengths through
    loader.collate_fn."""
    lengths = [len(loader.dataset[i]) for i in range(len(loader.dataset))]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = DataLoader(
        loader.dataset, batch_size=LM.batch_size, sampler=order, collate_fn=loader.collate_fn
    )
    assert len(batches) == len(loader)
    window = []
    for b in batches:
        window.append(b)
        if len(window) < K:
            continue
        n = sum(LM.count_items(w) for w in window)
        for w in window:
            losses = LM.item_losses(model, w)
            (losses.sum() / n if divide else losses.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        window = []


def run_lm(fn):
    return accumlib.verify(
        fn,
        model=LM.make_model(0),
        dataset=LM.make_dataset(),
        item_losses=LM.item_losses,
        accum_steps=K,
        batch_size=LM.batch_size,
        collate_fn=LM.collate_fn,
    )


def test_a_length_sweep_before_a_length_grouped_sampler_is_not_a_micro_batch():
    """64 sequences, 16 micro-batches of 4: the sweep's 64 reads are not the first micro-batch's items."""
    report = run_lm(length_grouped)
    assert exact(report), str(report)
    assert report.items_stepped == report.items_total and len(report.steps) == 4, str(report)
    naive = run_lm(lambda m, o, dl: length_grouped(m, o, dl, divide=False))
    assert naive.codes == {"unscaled-sum"}, str(naive)


# ---- the last micro-batch inside optimizer.step(closure) --------------------------------------------


def closure_loop(model, opt, loader, *, keyword=False, divide=True, returned=None):
    """Lightning's shape in plain torch: the window's last forward and backward run inside the closure."""
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window) if divide else len(window[0][1])

        def loss_of(x, y, n=n):  # bound now: each window its own n
            return F.cross_entropy(model(x), y, reduction="sum") / (n if divide else len(y))

        for x, y in window[:-1]:
            loss_of(x, y).backward()

        def closure(last=window[-1]):
            loss = loss_of(*last)
            loss.backward()
            return loss

        out = opt.step(closure=closure) if keyword else opt.step(closure)
        if returned is not None:
            returned.append(out)
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "keyword"])
def test_the_last_micro_batch_inside_the_step_closure_counts(keyword):
    returned = []
    report = run(lambda m, o, dl: closure_loop(m, o, dl, keyword=keyword, returned=returned))
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2], str(report)
    # the closure's loss, handed back
    assert all(isinstance(x, torch.Tensor) and x.dim() == 0 for x in returned)
    naive = run(lambda m, o, dl: closure_loop(m, o, dl, keyword=keyword, divide=False))
    assert naive.codes == {"unscaled-sum"}, str(naive)
    assert [r.micro_batches for r in naive.steps] == [4, 4, 4, 2]


# ---- a large batch on a loader that draws ahead ------------------------------------------------------


def drawing_ahead(model, opt, loader, zero=True):
    """k = 1, one big batch per step; the next batch is drawn before this one's backward (nanoGPT)."""
    data = iter(loader)
    nxt = next(data, None)
    while nxt is not None:
        x, y = nxt
        loss = F.cross_entropy(model(x), y)
        nxt = next(data, None)
        loss.backward()
        opt.step()
        if zero:
            opt.zero_grad(set_to_none=True)


def test_a_large_batch_loop_on_a_loader_that_draws_ahead():
    report = run(drawing_ahead, k=1, b=32)
    assert exact(report), str(report)
    assert [(r.micro_batches, r.items) for r in report.steps] == [(1, 32)] * 3 + [(1, 14)]
    leaky = run(lambda m, o, dl: drawing_ahead(m, o, dl, zero=False), k=1, b=32)
    assert leaky.codes == {"no-zero-grad"}, str(leaky)


def merged_drawing_ahead(model, opt, loader):
    """The large-batch loop: a window's micro-batches merged into one forward, with the next window's first
    micro-batch already drawn when the merged forward runs."""
    data = iter(loader)
    ahead = [next(data)]
    while ahead:
        window = ahead + [b for _, b in zip(range(K - 1), data)]
        ahead = [b for _, b in zip(range(1), data)]
        x, y = torch.cat([x for x, _ in window]), torch.cat([y for _, y in window])
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_a_merged_window_is_matched_to_the_oldest_micro_batches_drawn():
    report = run(merged_drawing_ahead)
    assert exact(report), str(report)
    assert [(r.micro_batches, r.items) for r in report.steps] == [(4, 32)] * 3 + [(2, 14)]


def test_a_prefetching_worker_loader_is_refused_not_misjudged():
    """Worker processes cannot report what they read: refused by name, whichever collate the loop uses."""

    def loop(model, opt, loader):
        drawing_ahead(model, opt, DataLoader(loader.dataset, batch_size=32, num_workers=2, prefetch_factor=2))

    with pytest.raises(RuntimeError, match="num_workers"):
        run(loop, k=1, b=32)


# ---- forwards and backwards in other orders -----------------------------------------------------------


def forwards_then_one_backward(model, opt, loader, zero=True):
    """Every forward of a window first, then one backward of the window's summed losses."""
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        (sum(F.cross_entropy(model(x), y, reduction="sum") for x, y in window) / n).backward()
        opt.step()
        if zero:
            opt.zero_grad(set_to_none=True)


def test_a_windows_forwards_before_its_one_backward_are_one_group():
    report = run(forwards_then_one_backward)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]
    # one group, fitted once against .grad before the window: what leaked is told from the window's own share
    leaky = run(lambda m, o, dl: forwards_then_one_backward(m, o, dl, zero=False))
    assert leaky.codes == {"no-zero-grad"}, str(leaky)


def test_an_evaluation_forward_on_data_of_the_loops_own_is_not_a_micro_batch():
    """A validation forward on 20 held-out rows between steps: fewer rows than the 3 micro-batches drawn
    next (24), more than 2 (16): it matches no run of them, so it takes none of them."""
    held_out = accumlib.data.digits(130)[110:][0]

    def loop(model, opt, loader, divide=True):
        batches = list(loader)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window) if divide else len(window[0][1])
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / (n if divide else len(y))).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                model(held_out)

    report = run(loop)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2] and report.items_stepped == 110
    naive = run(lambda m, o, dl: loop(m, o, dl, divide=False))
    assert naive.codes == {"unscaled-sum"}, str(naive)


def test_a_second_forward_of_a_used_micro_batch_is_not_a_new_one():
    """Accuracy logged with a second forward after the backward: the micro-batch counts once."""

    def loop(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                with torch.no_grad():
                    model(x).argmax(1).eq(y).float().mean()
            opt.step()
            opt.zero_grad(set_to_none=True)

    report = run(loop)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 2]


# ---- a pass left open --------------------------------------------------------------------------------


def test_a_new_pass_after_one_left_open_has_its_own_tail():
    """A budget of one window, checked after the next micro-batch was drawn: the first pass stops at 5 of 14
    micro-batches. The next pass begins afresh, so its short last window (2 = 14 mod 4) is its legitimate
    tail."""

    def windows(model, opt, batches):
        batches = list(batches)
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def loop(model, opt, loader):
        first = []
        for i, b in enumerate(loader):
            if i == K:
                break
            first.append(b)
        windows(model, opt, first)
        windows(model, opt, loader)

    report = run(loop)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 4, 2]


def test_a_length_sweep_by_iteration_then_the_loops_own_padding_is_followed():
    """The loop iterates loader.dataset for lengths (Python's sequence protocol: it ends at an IndexError),
    then
    draws batches grouped by length with a collate of its own that pads to a multiple of 8: they match none of
    verify's by shape, so verify takes the items the loop just read, the sweep's reads excluded."""
    from accumlib.data import IGNORE_INDEX, PAD_ID, pad_collate

    def pad_to_8(seqs):
        inputs, targets = pad_collate(seqs)
        extra = -inputs.shape[1] % 8
        return F.pad(inputs, (0, extra), value=PAD_ID), F.pad(targets, (0, extra), value=IGNORE_INDEX)

    def loop(model, opt, loader, divide=True):
        lengths = [len(s) for s in loader.dataset]
        assert len(lengths) == 64
        by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
        batches = list(
            DataLoader(loader.dataset, batch_size=LM.batch_size, sampler=by_length, collate_fn=pad_to_8)
        )
        for s in range(0, len(batches), K):
            window = batches[s : s + K]
            n = sum(LM.count_items(b) for b in window)
            for b in window:
                losses = LM.item_losses(model, b)
                (losses.sum() / n if divide else losses.mean()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    report = run_lm(loop)
    assert exact(report) and report.items_stepped == report.items_total, str(report)
    assert run_lm(lambda m, o, dl: loop(m, o, dl, divide=False)).codes == {"unscaled-sum"}


def test_a_batch_samplers_drop_last_is_named_as_why_items_were_left_out():
    """Accelerate and the Trainer build their DataLoader from a batch_sampler, which keeps drop_last and the
    batch size (the loader's own say False and None): 110 items in batches of 8, 6 left out by design."""
    from torch.utils.data import BatchSampler, SequentialSampler

    def loop(model, opt, loader):
        batches = BatchSampler(SequentialSampler(loader.dataset), batch_size=B, drop_last=True)
        own = DataLoader(loader.dataset, batch_sampler=batches, collate_fn=loader.collate_fn)
        assert (own.drop_last, own.batch_size) == (False, None)
        forwards_then_one_backward(model, opt, own)

    report = run(loop)
    assert report.ok and report.codes == {"loader-left-out"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 4, 1]
    assert "drop_last=True with batch_size 8" in str(report) and "6 of 110 per pass" in str(report), str(
        report
    )
