"""The gallery's loops under ``accumlib.watch`` (the in-place engine behind ``accumlib run``): each gets
the codes ``accumlib.verify`` must give it (``accumlib_course/gallery``), except what only verify's own
set-up can see.

verify(train_fn) hands the loop a loader over a dataset it tracks, keeps what the loop returns and runs it
on a copy with dropout switched off; watch is handed nothing. So these codes are verify's alone:
``logged-loss-scaled`` (the loop's return value), ``dropout`` (the switch), ``loader-left-out`` and
``duplicate-items`` (the dataset's indices). One loop is beyond watch by design and says so:
MindSpore's Accumulator assigns ``p.grad`` from ``torch.autograd.grad``, a gradient no backward of the
run deposited (``unseen-loss``, a limit, exit 4; never a pass).

Two verdicts were wrong here before this test and are its regression cases: a parameter unfrozen inside a
window passed (the engine's sum followed the loop's own deposits, so the half-window gradient matched
itself), and a loop's own clip by total norm read ``misscaled`` (the engine saw the ``.grad`` rescale
exactly, with weights of 1, and the clip rule only looked at the weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from accumlib._verify.watch import watch
from accumlib.data import digits
from accumlib.tasks import get_task
from accumlib.tolerances import FLOAT32_RTOL
from accumlib_course.gallery import GALLERY
from accumlib_course.gallery.correct import clip_by_total_norm


def watched(fn, name: str = "correct-enumerate", k: int = 4):
    """``fn`` as the gallery runs ``name`` (its task, data, model, batch size), under watch, with plain SGD
    built inside the block as a script builds its own."""
    g = GALLERY[name]
    task = get_task(g.task)
    model = task.make_model(0)
    data = task.make_dataset() if g.n_items is None else digits(g.n_items, image="cnn" in g.task)
    loader = DataLoader(data, batch_size=task.batch_size, shuffle=False, collate_fn=task.collate_fn)
    with watch(accum_steps=k, scan=False) as seen:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        fn(model, opt, loader)
    assert seen.report is not None
    return seen.report


def test_a_parameter_unfrozen_inside_a_window_is_named_and_unfreezing_at_a_step_is_ok():
    bad = watched(GALLERY["bug-frozen-inside-window"].fn, "bug-frozen-inside-window")
    assert not bad.ok and bad.codes == {"frozen-inside-window"}, bad
    assert [r.step for r in bad.steps if r.codes] == [0]  # the first layer joins halfway through window 0
    good = watched(GALLERY["correct-gradual-unfreezing"].fn, "correct-gradual-unfreezing")
    assert good.ok and good.codes == set(), good
    assert max(r.rel_error for r in good.steps) < FLOAT32_RTOL


def _own_clip_then(factor: float | None):
    def loop(model, opt, loader):
        batches = list(loader)
        for s in range(0, len(batches), 4):
            window = batches[s : s + 4]
            n = sum(len(y) for _, y in window)
            for x, y in window:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            if factor is None:
                clip_by_total_norm(list(model.parameters()), 0.1)
            else:
                for p in model.parameters():
                    p.grad.mul_(factor)  # not a clip: every step's norm still follows the data
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def test_a_clip_of_the_loops_own_is_assumed_and_a_plain_rescale_is_not():
    clipped = watched(_own_clip_then(None))
    assert clipped.ok and clipped.codes == {"clip-assumed"}, clipped
    assert all(r.rel_error < FLOAT32_RTOL for r in clipped.steps)
    halved = watched(_own_clip_then(0.5))
    assert not halved.ok and halved.codes == {"misscaled"}, halved
    assert ".grad was multiplied by 0.5" in str(halved)
