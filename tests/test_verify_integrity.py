"""The structural gaps of issue 47: a run whose gradient was changed other than by its own backwards is
never passed, by any door (``verify(oracle="auto")``, ``verify(oracle="recompute")``, ``watch``).

The in-place engine vouches for a step from the run's structure: each micro-batch's weight read at its
loss node, ``.grad`` followed through fingerprints (its first ``PRINT`` entries per parameter), and its
sum O of the deposits. Each case below is built to slip past one piece of that: an edit through
``.data`` (no version counter moves) on entries the fingerprint does not cover, parameters moved inside
the window (the deposits, and so O, follow the moved parameters), a hook on a parameter (it changes the
deposit the engine sums as well), the same graph backwarded twice (each item weighs 2/N), a permutation
of ``.grad`` that keeps its norm and its fingerprinted entries. Each is never ok (a bug named, or a limit
said by name), and its twin, the same loop without the defect, is ok to float32 rounding: a check that
refuses the twin would be a false alarm, not a catch.

Two were passed before this file: parameters edited through ``.data`` or under ``torch.no_grad`` inside
a window (``watch`` on every window; ``verify`` in place on every window but its first, which the
one-window check replays), now read from a checksum of the parameters' bits at the window's first loss
call and at its step (``params-changed-inside-window``, a limit: the recompute oracle, to which verify
falls back, names the step ``unexplained``); and a hook registered on the caller's model before
``verify`` (a parameter's deepcopy drops its hooks, so the run verify judged was not the caller's; its
copy now keeps them). The rest were caught already, by the engine's sum O or by the replay.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from conftest import K, exact, verify_digits
from conftest import windows_of as windows
from torch.utils.data import DataLoader

from accumlib._verify.touched import PRINT
from accumlib._verify.watch import watch
from accumlib.tasks import get_task

TASK = get_task("mlp-digits")  # 110 items in batches of 8: windows of 4, 4, 4, 2 micro-batches
DOORS = ["auto", "recompute", "watch"]
# a step is wrong here, and one of these names it: the pattern no factor explains, a factor (twice
# backwarded: 2), or what the in-place engine cannot weigh, said by name
NAMED = {"unexplained", "misscaled", "unseen-loss", "grad-hook", "params-changed-inside-window"}


def judged(loop, door: str, before=None):
    """``loop`` on the digits task's model (seed 0) through ``door``; ``before(model)`` runs on the caller's
    model first, outside verify's call and the watched block (what the run is handed)."""
    model = TASK.make_model(0)
    if before is not None:
        before(model)
    if door != "watch":
        return verify_digits(loop, model=model, oracle=door)
    loader = DataLoader(TASK.make_dataset(), batch_size=TASK.batch_size, collate_fn=TASK.collate_fn)
    with watch(accum_steps=K, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loop(model, opt, loader)
    assert seen.report is not None
    return seen.report


def loop_with(*, between=None, last=None, after_step=None, twice=False, window=None, each=None):
    """The correct loop (each item 1/N of its window), with ``each(model)`` as a window opens,
    ``between(model)`` after its first backward, ``last(model)`` after its last one (before the step) and
    ``after_step(model)`` after its step, all only in window ``window`` (None: every window); ``twice``:
    each micro-batch's graph backwarded twice there."""

    def loop(model, opt, loader):
        for t, w in enumerate(windows(loader)):
            here = window is None or t == window
            n = sum(len(y) for _, y in w)
            if each and here:
                each(model)
            for j, (x, y) in enumerate(w):
                loss = F.cross_entropy(model(x), y, reduction="sum") / n
                if twice and here:
                    loss.backward(retain_graph=True)  # the same graph, so its items are summed twice
                loss.backward()
                if between and here and j == 0:
                    between(model)
            if last and here:
                last(model)
            opt.step()
            if after_step and here:
                after_step(model)
            opt.zero_grad(set_to_none=True)

    return loop


def weight(model) -> torch.nn.Parameter:
    return next(p for p in model.parameters() if p.dim() == 2)  # the first layer's, 64 inputs a row


def never_ok(report, step: int | None = None) -> None:
    assert not report.ok, report
    assert report.codes & NAMED, report
    if step is not None:  # the defective window's own step is the one refused
        assert report.steps[step].codes, report


def ok(report) -> None:
    assert exact(report, notes=True), report


# ---- 1. .grad edited through .data between two backwards ------------------------------------------


def rows_halved(model):
    weight(model).grad.data[1:] *= 0.5  # every row but the first: the fingerprint's entries left as they were


def tail_halved(model):
    for p in model.parameters():
        p.grad.data.view(-1)[PRINT:].mul_(0.5)  # each parameter's entries past its fingerprint


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("edit", [rows_halved, tail_halved], ids=["rows", "tail"])
def test_grad_edited_through_data_between_backwards_is_never_ok(edit, door):
    never_ok(judged(loop_with(between=edit), door))
    never_ok(judged(loop_with(between=edit, window=1), door), step=1)


# ---- 2. parameters edited through .data inside the window -----------------------------------------


def moved(model):
    for p in model.parameters():
        p.data.add_(1e-2)  # .data: no version counter moves, autograd never knows


def moved_past_print(model):
    weight(model).data.view(-1)[PRINT:].add_(1e-2)


def moved_no_grad(model):
    with torch.no_grad():
        weight(model).mul_(1.01)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("edit", [moved, moved_past_print, moved_no_grad], ids=["data", "tail", "no-grad"])
# the first window, which verify in place replays once, and another
@pytest.mark.parametrize("window", [0, 1])
def test_parameters_edited_inside_the_window_are_never_ok(edit, window, door):
    """The micro-batches after the edit see other parameters than the window's first: no one point's
    gradient. The engine's sum follows the deposits, so only a checksum of the parameters tells."""
    never_ok(judged(loop_with(between=edit, window=window), door), step=window)


def forward_then(edit):
    """The correct loop, with ``edit(model)`` between window 1's first forward and its first backward."""

    def loop(model, opt, loader):
        for t, w in enumerate(windows(loader)):
            n = sum(len(y) for _, y in w)
            for j, (x, y) in enumerate(w):
                loss = F.cross_entropy(model(x), y, reduction="sum") / n
                if t == 1 and j == 0:
                    edit(model)  # the backward reads the moved weights through the graph it saved
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


@pytest.mark.parametrize("door", DOORS)
def test_parameters_edited_between_a_forward_and_its_backward_are_never_ok(door):
    """The window opens at its first loss call, not at its first backward: edited in between, every
    backward of the window reads the moved weights, the first one halfway."""
    never_ok(judged(forward_then(moved), door), step=1)


def evaluated_then_swapped(model, opt, loader):
    """An evaluation with autograd on (its loss is never backwarded), on weights swapped in through .data
    and swapped back before the window's first forward, as an EMA evaluation does: no part of any window."""
    batches = list(loader)
    for w in windows(batches):
        kept = [p.data.clone() for p in model.parameters()]
        for p in model.parameters():
            p.data.mul_(0.9)  # the "averaged" weights
        F.cross_entropy(model(batches[0][0]), batches[0][1])  # computed with grad on, never backwarded
        for p, k in zip(model.parameters(), kept):
            p.data.copy_(k)
        n = sum(len(y) for _, y in w)
        for x, y in w:
            (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("door", DOORS)
def test_parameters_swapped_for_an_evaluation_before_the_window_are_ok(door):
    """The twin: the loss call that opens a window's checksum is the one its first backward reaches."""
    ok(judged(evaluated_then_swapped, door))


@pytest.mark.parametrize("door", DOORS)
def test_parameters_edited_between_windows_are_ok(door):
    """The twin: the same edit right after the step (a max-norm constraint, weight averaging) is no part
    of any window: every micro-batch of the next window sees the edited parameters alike."""
    ok(judged(loop_with(after_step=moved), door))
    ok(judged(loop_with(), door))


# ---- 3. a user's hook on a parameter ---------------------------------------------------------------


def hooked(model):
    weight(model).register_hook(lambda g: g * 2)


def assigned(model):
    weight(model)._backward_hooks = OrderedDict({0: lambda g: g * 2})  # no register_hook call to see


def post_accumulate(model):
    def doubled(p):  # .grad doubled after each backward's deposit: a compound factor per micro-batch
        p.grad.mul_(2)

    weight(model).register_post_accumulate_grad_hook(doubled)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(
    "hook", [hooked, assigned, post_accumulate], ids=["register_hook", "assigned", "post-accumulate"]
)
def test_a_hook_on_a_parameter_before_the_run_is_never_ok(hook, door):
    """Registered on the caller's model before verify is called (its copy must keep it: the run verify
    judges is the caller's) or before the watched block opens."""
    never_ok(judged(loop_with(), door, before=hook))


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(
    "hook", [hooked, assigned, post_accumulate], ids=["register_hook", "assigned", "post-accumulate"]
)
def test_a_hook_on_a_parameter_registered_inside_the_loop_is_never_ok(hook, door):
    never_ok(judged(loop_with(each=hook, window=1), door), step=1)


@pytest.mark.parametrize("door", DOORS)
def test_the_same_loops_without_a_hook_are_ok(door):
    ok(judged(loop_with(), door))


# ---- 4. the same graph backwarded twice ------------------------------------------------------------


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("window", [None, 1])
def test_the_same_graph_backwarded_twice_is_never_ok(window, door):
    """Each item weighs 2/N: a misscale by 2 where its items are read (recompute), a backward through no
    loss call it has not already seen where they are not (in place)."""
    never_ok(judged(loop_with(twice=True, window=window), door), step=window)


@pytest.mark.parametrize("door", DOORS)
def test_a_graph_retained_and_backwarded_once_is_ok(door):
    def once(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward(retain_graph=True)
            opt.step()
            opt.zero_grad(set_to_none=True)

    ok(judged(once, door))


# ---- 5. a permutation of .grad through .data ---------------------------------------------------------


def rows_flipped(model):
    g = weight(model).grad.data
    g[1:].copy_(g[1:].flip(0))  # the rows below the first, upside down: norm and fingerprint kept


def rows_swapped(model):
    g = weight(model).grad.data
    g[[2, 3]] = g[[3, 2]]


def tail_rolled(model):
    for p in model.parameters():
        v = p.grad.data.view(-1)
        v[PRINT:].copy_(v[PRINT:].roll(1))


PERMUTATIONS = [rows_flipped, rows_swapped, tail_rolled]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("perm", PERMUTATIONS, ids=["flip", "swap", "roll"])
@pytest.mark.parametrize("when", ["between", "after"])
def test_a_permutation_of_grad_is_never_ok(perm, when, door):
    """Between two backwards, or after the last one (before the step): what the optimizer sees has the
    true gradient's norm and first entries, in the wrong places."""
    loop = loop_with(between=perm) if when == "between" else loop_with(last=perm)
    never_ok(judged(loop, door))
