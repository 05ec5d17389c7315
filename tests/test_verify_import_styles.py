"""verify v4: the verdict does not depend on how the loop reached torch (issue 27's import-style matrix).

Each way a loop may clip or rescale its gradient is run twice: a correct loop, and its wrong twin.
The truth is computed here, independently of verify: the gradient the loop's optimizer saw at its first
step, captured inside the loop, against the true large-batch gradient of that window (clipped as the
loop clips), from ``accumlib.true_gradient``. verify must then name the wrong twin right (its code and
its cause), pass the correct one, and never fall back on ``clip-assumed`` (a clip it did not see).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_ as from_import_clip  # bound before verify runs
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

import accumlib
from accumlib import get_task
from accumlib.tolerances import FLOAT32_RTOL

TASK = get_task("mlp-digits")
K, B, MAX_NORM = 4, 8, 0.05
DATA = torch.utils.data.Subset(TASK.make_dataset(), range(96))  # 12 micro-batches: 3 full windows
N = K * B  # items per window


def attr_clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)


def from_clip(model):
    from_import_clip(model.parameters(), MAX_NORM)


def pair_clip(model):
    params = list(model.parameters())
    clip_grads_with_norm_(params, MAX_NORM, get_total_norm([p.grad for p in params]))


def clipping_loop(clip, every_micro_batch, seen):
    """Sum-of-item-losses / N per micro-batch; clip at the step (right) or after every backward (wrong)."""

    def train(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y, reduction="sum") / N).backward()
            last = (i + 1) % K == 0
            if every_micro_batch or last:
                clip(model)
            if last:
                if not seen:
                    seen.append([p.grad.detach().clone() for p in model.parameters()])
                opt.step()
                opt.zero_grad()

    return train


def run(loop):
    return accumlib.verify(
        loop,
        model=TASK.make_model(0),
        dataset=DATA,
        item_losses=TASK.item_losses,
        accum_steps=K,
        batch_size=B,
    )


def first_window_truth(clip_to=None):
    """The true large-batch gradient of the first window at the initial parameters, clipped like the loop."""
    window = [next(iter(torch.utils.data.DataLoader(DATA, batch_size=N)))]
    g = list(accumlib.true_gradient(TASK.make_model(0), window, TASK.item_losses).values())
    if clip_to is not None:
        norm = torch.sqrt(sum((t.double() ** 2).sum() for t in g))
        g = [t * min(1.0, clip_to / (float(norm) + 1e-6)) for t in g]
    return g


def rel(a, b):
    """||a - b|| / ||b|| over every parameter, in float64 (accumlib.compare)."""
    return accumlib.compare(a, b).rel_error


def test_every_clip_style_is_seen_and_each_wrong_twin_named():
    truth = first_window_truth(MAX_NORM)
    for name, clip in [("torch.nn.utils.clip_grad_norm_", attr_clip), ("from-import", from_clip),
                       ("get_total_norm + clip_grads_with_norm_", pair_clip)]:  # fmt: skip
        right, wrong = [], []
        ok = run(clipping_loop(clip, False, right))
        bad = run(clipping_loop(clip, True, wrong))
        # the truth, independently of verify: the right loop's step is the clipped large-batch gradient
        # (float32 rounding: FLOAT32_RTOL), the wrong one's is far from it
        assert rel(right[0], truth) < FLOAT32_RTOL, name
        assert rel(wrong[0], truth) > 100 * FLOAT32_RTOL, name
        assert ok.ok and ok.codes == set(), (name, ok.codes)
        assert "clip-per-micro-batch" in bad.codes and not bad.ok, (name, bad.codes)
        assert "clip-assumed" not in ok.codes | bad.codes, name
        assert "zero-grad-inside-window" not in bad.codes, name  # the old wrong name for a clip not seen


def hook_loop(scale):
    def train(model, opt, loader):
        for p in model.parameters():
            p.register_hook(lambda g: g * scale)
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y, reduction="sum") / N).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()

    return train


def test_a_rescaling_gradient_hook_is_named_as_the_cause_not_the_reduction():
    ok, bad = run(hook_loop(1.0)), run(hook_loop(0.5))
    assert ok.ok and ok.codes == set()
    assert bad.codes == {"misscaled"}
    finding = next(f for f in bad.findings if f.code == "misscaled")
    text = finding.message
    # the hook's own file:line, as findings name files (relative to the working directory here)
    hook_line = next(
        i for i, line in enumerate(open(__file__), 1) if "p.register_hook(lambda g: g * scale)" in line
    )
    assert "Tensor.register_hook" in text and f"test_verify_import_styles.py:{hook_line}" in text
    assert "item_losses, not the loop, is what to fix" not in text  # the old, wrong place to look
    assert "remove the gradient hook" in finding.fix
    assert all(abs(s.factor - 0.5) < FLOAT32_RTOL for s in bad.steps)


def mul_loop(factor, seen):
    def train(model, opt, loader):
        for i, (x, y) in enumerate(loader):
            F.cross_entropy(model(x), y, reduction="sum").backward()  # summed: .grad is N x the mean's
            if (i + 1) % K == 0:
                for p in model.parameters():
                    p.grad.mul_(factor)
                if not seen:
                    seen.append([p.grad.detach().clone() for p in model.parameters()])
                opt.step()
                opt.zero_grad()

    return train


def test_a_manual_rescale_of_grad_is_named_with_its_factor():
    truth, right, wrong = first_window_truth(), [], []
    ok, bad = run(mul_loop(1 / N, right)), run(mul_loop(1 / K, wrong))  # 1/N is right; 1/k leaves c = N/k
    assert rel(right[0], truth) < FLOAT32_RTOL and abs(rel(wrong[0], truth) - (B - 1)) < 1e-3
    assert ok.ok and ok.codes == set()
    assert bad.codes == {"misscaled"}
    text = next(f for f in bad.findings if f.code == "misscaled").message
    assert ".grad was multiplied by 0.25 after the window's last backward" in text
    assert all(abs(s.factor - B) < B * FLOAT32_RTOL for s in bad.steps)


def test_a_clip_at_the_step_is_not_taken_for_a_manual_rescale():
    """The clip's factor is verify's to explain (it saw the clip): no 'rescaled' cause on a right loop
    whose clip acts at every step."""
    seen: list = []
    report = run(clipping_loop(from_clip, False, seen))
    assert report.ok and all(row.clip < 0.5 for row in report.steps)  # the clip acted at every step
    assert all(".grad was multiplied" not in f.message for f in report.findings)


def test_under_a_torch_whose_clip_is_not_the_known_wrapper_clip_grad_norm_is_still_seen(monkeypatch):
    """``clips.py`` falls back to torch's module attribute, which ``clip_grad_norm_`` (any import of it)
    calls by its global name; torch's own function is back afterwards."""
    import torch.nn.utils.clip_grad as clip_mod

    from accumlib._verify import clips

    wrapper = clip_mod._clip_grads_with_norm_
    monkeypatch.setattr(clips, "_CELL", None)
    monkeypatch.setattr(clips, "_TORCH_CLIP", wrapper)
    w = torch.nn.Parameter(torch.ones(4))
    w.grad = torch.full((4,), 3.0)
    seen = []
    with clips.on_clip(lambda ps, max_norm, total: seen.append((max_norm, float(total)))):
        assert clips.watching()
        from_import_clip([w], 1.0)
    assert seen == [(1.0, 6.0)]
    assert clip_mod._clip_grads_with_norm_ is wrapper and not clips.watching()
