"""verify at its boundaries: the smallest misscale it must still fail, clips it must (and must not)
assume, causes it must name and not name, data shapes it must follow (a stream ending mid-batch, a
view into a batch, another model's optimizer), and float16 GradScaler replays. Each test pins one
edge of a rule in accumlib/_verify, so moving that edge fails it.

Tolerance tests use literal numbers on purpose: a test that compares with the constant itself
moves with it and cannot catch a wrong value."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import K, verify_digits
from conftest import exact_loop as exact_windows
from conftest import windows_of as windows
from torch.utils.data import DataLoader, IterableDataset

import accumlib
from accumlib import get_task
from accumlib._verify.diagnose import CAUSES
from accumlib.tolerances import FLOAT32_RTOL

TASK = get_task("mlp-digits")
run = functools.partial(verify_digits, n=128)


def scaled_loop(scale, k=K):
    def loop(model, opt, loader):
        for w in windows(loader, k):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / (scale * n)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def test_a_misscale_of_five_hundredths_of_a_percent_fails():
    report = run(scaled_loop(1 + 5e-4))
    assert report.codes == {"misscaled"}, str(report)
    assert all(r.factor == pytest.approx(1 / (1 + 5e-4), rel=FLOAT32_RTOL) for r in report.steps)
    # a factor this close to 1 matches no count (no reduction d, no constant divisor): the generic fix
    f = next(f for f in report.findings if f.code == "misscaled")
    assert f.fix == accumlib.CODES["misscaled"].fix and "D =" not in f.message, str(report)


def test_grad_divided_by_k_after_every_backward_is_zero_grad_inside_window():
    def loop(model, opt, loader):
        for w in windows(loader):
            for x, y in w:
                F.cross_entropy(model(x), y).backward()
                for p in model.parameters():
                    p.grad /= K  # meant once per window; weights 1/64, 1/16, 1/4, 1
            opt.step()
            opt.zero_grad()

    assert run(loop).codes == {"zero-grad-inside-window"}


def own_clip(max_norm_of_step, *, scale_up=False, half_norm=False):
    def loop(model, opt, loader):
        for t, w in enumerate(windows(loader)):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            grads = [p.grad for p in model.parameters()]
            total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            if half_norm:
                total = float(torch.tensor(total).half())  # the norm as an fp16 clip sees it
            coef = max_norm_of_step(t) / (total + 1e-6)
            coef = coef if scale_up else min(1.0, coef)
            for g in grads:
                g.mul_(coef)
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def test_norms_two_tenths_of_a_percent_apart_are_not_one_clip():
    report = run(own_clip(lambda t: 0.1 * (1 + 0.002 * t)))
    assert "clip-assumed" not in report.codes and "misscaled" in report.codes, str(report)


def test_a_clip_whose_norm_was_rounded_to_fp16_is_still_one_clip():
    report = run(own_clip(lambda t: 0.1, half_norm=True))
    assert report.ok and report.codes == {"clip-assumed"}, str(report)


def test_a_clip_that_also_scales_up_is_misscaled():
    report = run(own_clip(lambda t: 10.0, scale_up=True))  # forgot min(1, .): every step ends at norm 10
    assert not report.ok and "misscaled" in report.codes and "clip-assumed" not in report.codes, str(report)


def test_a_loops_own_norm_setting_that_scales_some_steps_up_is_no_clip():
    # every step set to norm 0.5: some shrunk, some grown
    report = run(own_clip(lambda t: 0.5, scale_up=True))
    assert any(r.factor > 1 for r in report.steps) and any(r.factor < 1 for r in report.steps), str(report)
    assert report.codes == {"misscaled"}, str(report)


def test_ok_steps_above_the_norm_rule_out_a_clip():
    report = run(own_clip(lambda t: 0.1 if t < 2 else math.inf))  # steps 2, 3 unclipped, norms > 0.1
    assert "misscaled" in report.codes and "clip-assumed" not in report.codes, str(report)


def test_last_micro_batch_loss_logged_per_step_is_off_by_k_on_every_step():
    def loop(model, opt, loader):
        logged = []
        for w in windows(loader):
            for x, y in w:
                loss = F.cross_entropy(model(x), y) / K
                loss.backward()
            opt.step()
            opt.zero_grad()
            logged.append(loss.item())  # the last micro-batch's loss / k: 1/k x the step's loss, +-3%
        return logged

    report = run(loop, n=256)
    f = next(f for f in report.findings if f.code == "logged-loss-scaled")
    assert f.steps == tuple(range(8)), str(report)


def test_grad_kept_as_a_decaying_sum_is_no_zero_grad():
    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            for p in model.parameters():
                p.grad.mul_(0.9)  # "smoothing": .grad decays instead of being zeroed
            opt.step()

    report = run(loop)
    assert report.codes == {"misscaled", "no-zero-grad"}, str(report)
    # step 0 (nothing leaked yet) is the decay alone; after it, the decay is how .grad leaks: one mistake,
    # one code
    assert [r.codes for r in report.steps] == [("misscaled",)] + [("no-zero-grad",)] * 3, str(report)


def test_steplr_stepped_per_micro_batch_with_step_size_k():
    def loop(model, opt, loader):
        # changes after every k-th micro-batch
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=K, gamma=0.5)
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sched.step()
            opt.step()
            opt.zero_grad()

    assert run(loop).codes == {"scheduler-per-micro-batch"}


def test_learning_rate_set_by_hand_per_micro_batch():
    def loop(model, opt, loader, per_micro_batch=True):
        i = 0
        for t, w in enumerate(windows(loader)):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                for g in opt.param_groups:  # nanoGPT-style warmup, counted in micro-batches
                    g["lr"] = 0.05 * (i + 1) / 16 if per_micro_batch else 0.05 * (t + 1) / 4
                i += 1
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad()

    assert run(loop).codes == {"scheduler-per-micro-batch"}
    assert run(lambda m, o, dl: loop(m, o, dl, False)).ok


def test_a_scheduler_stepped_inside_one_window_flags_that_window_only():
    def loop(model, opt, loader):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for t, w in enumerate(windows(loader)):
            n = sum(len(y) for _, y in w)
            for j, (x, y) in enumerate(w):
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                if t == 0 and j == 0:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        sched.step()
            opt.step()
            opt.zero_grad()

    report = run(loop)
    assert [f.steps for f in report.findings] == [(0,)], str(report)


def test_a_mean_over_one_kth_of_the_items_names_cause_k():
    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / (n / K)).backward()
            opt.step()
            opt.zero_grad()

    report = run(loop, n=110)  # the tail (8 + 6 items) is misscaled by k
    msg = next(f.message for f in report.findings if f.code == "misscaled")
    assert CAUSES["k"][0] in msg, str(report)


def test_divided_by_k_too_often_names_cause_1_over_k():
    report = run(scaled_loop(K))
    f = next(f for f in report.findings if f.code == "misscaled")
    assert CAUSES["1/k"][0] in f.message and f.fix == CAUSES["1/k"][1], str(report)


def test_window_mean_divided_by_m_names_cause_1_over_m():
    lm = get_task("lm-tokens")

    def loop(model, opt, loader, k=6):
        for w in windows(loader, k):
            n = sum(lm.count_items(b) for b in w)
            for b in w:
                (lm.item_losses(model, b).sum() / (n * len(w))).backward()
            opt.step()
            opt.zero_grad()

    report = accumlib.verify(
        loop,
        model=lm.make_model(0),
        dataset=lm.make_dataset(),
        item_losses=lm.item_losses,
        # windows 6, 6, 4
        accum_steps=6,
        batch_size=lm.batch_size,
        collate_fn=lm.collate_fn,
    )
    msg = next(f.message for f in report.findings if f.code == "misscaled")
    assert CAUSES["1/m"][0] in msg and CAUSES["1/k"][0] in msg, str(report)


def test_shift_cause_is_not_named_for_a_model_without_sequences():
    # loss / (k N) at k = 2; digits: items == rows, so N/(N+S) == 1/2 == 1/k
    report = run(scaled_loop(2, k=2), k=2)
    f = next(f for f in report.findings if f.code == "misscaled")
    assert f.fix == CAUSES["1/k"][1], str(report)


def test_an_extra_term_on_the_last_micro_batch_only_is_unexplained():
    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for j, (x, y) in enumerate(w):
                loss = F.cross_entropy(model(x), y, reduction="sum") / n
                if j == len(w) - 1:
                    loss = loss + 4e-3 * sum((p**2).sum() for p in model.parameters())
                loss.backward()
            opt.step()
            opt.zero_grad()

    assert run(loop).codes == {"unexplained"}


def test_a_scheduler_per_micro_batch_does_not_explain_a_wrong_gradient():
    def loop(model, opt, loader):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for j, (x, y) in enumerate(w):
                loss = F.cross_entropy(model(x), y, reduction="sum") / n
                if j == len(w) - 1:  # an extra term no known bug explains
                    loss = loss + 4e-3 * sum((p**2).sum() for p in model.parameters())
                loss.backward()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sched.step()
            opt.step()
            opt.zero_grad()

    assert run(loop).codes == {"scheduler-per-micro-batch", "unexplained"}


class One(torch.nn.Module):
    """A one-parameter model: every gradient is collinear with every other."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return self.w * x


def one_losses(model, batch):
    x, y = batch
    return (model(x) - y) ** 2


def test_a_one_parameter_model_is_judged_and_its_unscaled_sum_named():
    data = torch.utils.data.TensorDataset(torch.linspace(-1, 2, 64), torch.linspace(0, 3, 64) * 1.7)

    def loop(div):
        def train(model, opt, loader):
            for w in windows(loader):
                n = sum(len(y) for _, y in w)
                for b in w:
                    (one_losses(model, b).sum() / div(n)).backward()
                opt.step()
                opt.zero_grad()

        return train

    def check(fn):
        return accumlib.verify(
            fn, model=One(), dataset=data, item_losses=one_losses, accum_steps=K, batch_size=8
        )

    assert check(loop(lambda n: n)).ok
    unscaled = check(loop(lambda n: 8))
    assert unscaled.codes == {"unscaled-sum"} and [r.factor for r in unscaled.steps] == pytest.approx(
        [4.0, 4.0]
    )


def test_clip_of_a_tiny_gradient_is_undone_exactly():
    class Cold(torch.nn.Module):  # outputs scaled down: gradient norms ~1e-3, where clip's +1e-6 matters
        def __init__(self):
            super().__init__()
            self.net = TASK.make_model(0)

        def forward(self, x):
            return 1e-3 * self.net(x)

    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-5)
            opt.step()
            opt.zero_grad()

    report = run(loop, model=Cold())
    assert report.ok and all(r.clip < 1 for r in report.steps), str(report)
    # like for like: the truth clipped as torch clips
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


def test_eval_mode_batchnorm_after_a_training_epoch_is_exact():
    cnn = get_task("cnn-batchnorm")

    def exact(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad()

    def loop(model, opt, loader):
        exact(model, opt, loader)  # train mode: running statistics move
        model.eval()  # then BatchNorm frozen (fine-tuning): running statistics, per-item: exact
        exact(model, opt, loader)

    report = accumlib.verify(
        loop,
        model=cnn.make_model(0),
        dataset=cnn.make_dataset(),
        item_losses=cnn.item_losses,
        accum_steps=K,
        batch_size=cnn.batch_size,
    )
    half = len(report.steps) // 2
    assert all(not r.codes for r in report.steps[half:]), str(report)
    # judged as any per-item model
    assert all(r.judged_against == "float32" for r in report.steps[half:]), str(report)


def test_verifys_collate_in_a_worker_is_refused():
    own = accumlib.data.digits(64)

    def loop(model, opt, loader):
        for x, y in DataLoader(own, batch_size=8, num_workers=1, collate_fn=loader.collate_fn):
            F.cross_entropy(model(x), y).backward()
        opt.step()

    with pytest.raises(RuntimeError, match="num_workers"):
        run(loop)


class Stream(IterableDataset):
    def __init__(self, n):
        self.data = accumlib.data.digits(n)

    def __iter__(self):
        for i in range(len(self.data)):
            yield self.data[i]


def test_a_stream_that_ends_between_batches_ends_its_pass():
    report = run(exact_windows, dataset=Stream(112))  # 14 full batches: the stream ends between batches
    assert report.ok and [r.micro_batches for r in report.steps] == [4, 4, 4, 2], str(report)


def test_two_passes_over_a_stream_that_ends_mid_batch():
    def loop(model, opt, loader):
        exact_windows(model, opt, loader)
        exact_windows(model, opt, loader)

    report = run(loop, dataset=Stream(110))
    assert report.ok and [r.micro_batches for r in report.steps] == [4, 4, 4, 2] * 2, str(report)


class Cold(torch.nn.Module):
    """The digits MLP with its logits scaled down: small gradients, which float16 flushes to zero unscaled."""

    def __init__(self, f=1e-3):
        super().__init__()
        self.net = TASK.make_model(0)
        self.f = f

    def forward(self, x):
        return self.f * self.net(x)


def fp16_scaler_loop(init_scale):
    def loop(model, opt, loader):
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                with torch.autocast("cpu", dtype=torch.float16):
                    total = F.cross_entropy(model(x), y, reduction="sum")
                scaler.scale(total.float() / n).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    return loop


@pytest.mark.parametrize("f", [1e-5, 1e-6])
def test_float16_gradscaler_replay_uses_the_loops_scale(f):
    report = run(fp16_scaler_loop(2.0**16), model=Cold(f))  # unscaled, these gradients underflow in float16
    assert all(r.judged_against == "float16 replay" for r in report.steps), str(report)
    assert all(not r.codes for r in report.steps[1:]), str(report)  # step 0: see the next test


@pytest.mark.parametrize("f", [1e-5, 1e-6])
def test_the_first_micro_batch_is_replayed_at_the_loops_scale_too(f):
    report = run(fp16_scaler_loop(2.0**16), model=Cold(f))
    assert report.ok, str(report)


def test_float16_gradscaler_at_the_default_scale_is_ok():
    report = run(fp16_scaler_loop(2.0**16))  # the torch AMP recipe, on the plain MLP
    assert report.ok, str(report)


def test_a_view_into_the_batch_is_matched_by_its_storage():
    x, y = accumlib.data.digits(128).tensors
    # one tensor: label, then features
    rows = torch.utils.data.TensorDataset(torch.cat([y[:, None].float(), x], 1))

    def losses(model, batch):
        (t,) = batch
        return F.cross_entropy(model(t[:, 1:]), t[:, 0].long(), reduction="none")

    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(t) for (t,) in w)
            for (t,) in w:
                # t[:, 1:]: same storage, offset
                (F.cross_entropy(model(t[:, 1:]), t[:, 0].long(), reduction="sum") / n).backward()
            opt.step()
            opt.zero_grad()

    report = accumlib.verify(
        loop, model=TASK.make_model(0), dataset=rows, item_losses=losses, accum_steps=K, batch_size=8
    )
    assert report.ok and not report.codes and len(report.steps) == 4, str(report)


def test_another_models_optimizer_and_clip_are_not_this_models():
    def loop(model, opt, loader):
        critic = torch.nn.Linear(64, 1)
        copt = torch.optim.SGD(critic.parameters(), lr=0.1)
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
                critic(x).pow(2).mean().backward()  # a second model, trained per micro-batch
                torch.nn.utils.clip_grad_norm_(critic.parameters(), 1e-3)
                copt.step()
                copt.zero_grad()
            opt.step()
            opt.zero_grad()

    report = run(loop)
    assert report.ok and not report.codes and len(report.steps) == 4, str(report)
    assert all(r.clip == 1.0 for r in report.steps)


def test_weights_that_drift_a_few_percent_are_not_one_factor():
    def loop(model, opt, loader):
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for j, (x, y) in enumerate(w):
                # weights 1, .98, .96, .94
                (F.cross_entropy(model(x), y, reduction="sum") / (n * (1 + 0.02 * j))).backward()
            opt.step()
            opt.zero_grad()

    report = run(loop)
    assert report.codes == {"unexplained"}, str(report)


def test_clip_column_only_when_a_step_was_clipped():
    head = str(run(scaled_loop(1.0))).splitlines()[0]
    assert "clip" not in head.split()


def test_no_zero_grad_under_gradscaler_at_a_small_scale_is_named():
    def loop(model, opt, loader):
        # unscale_ divides the stale .grad by 4 too: leak 1/4
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        for w in windows(loader):
            n = sum(len(y) for _, y in w)
            for x, y in w:
                scaler.scale(F.cross_entropy(model(x), y, reduction="sum") / n).backward()
            scaler.step(opt)
            scaler.update()  # never zeroed

    assert "no-zero-grad" in run(loop).codes


def test_a_skipped_micro_batch_of_a_stream_is_counted_like_a_map_style_one():
    def loop(model, opt, loader):
        # the loop filters one micro-batch out
        exact_windows(model, opt, [b for i, b in enumerate(loader) if i != 2])

    mapped, streamed = run(loop), run(loop, dataset=Stream(128))
    assert (mapped.items_total, "tail-dropped" in mapped.codes) == (128, True)
    assert (streamed.items_total, "tail-dropped" in streamed.codes) == (128, True), str(streamed)


# ---- pure-function boundary tests of diagnose (the tolerances' documented margins) ----------------
from accumlib._verify.diagnose import diagnose  # noqa: E402
from accumlib._verify.step_numbers import StepNumbers  # noqa: E402
from accumlib._verify.window_oracle import Fit  # noqa: E402


def numbers(*, rel, w=1.0, resid=1e-7, m=4):
    fits = [Fit(1, 8, 8, w / 32, 1.0, resid) for _ in range(m)]
    return StepNumbers(
        m,
        0.05,
        items=8 * m,
        sequences=8 * m,
        fits=fits,
        weights=[w] * m,
        rel=rel,
        factor=w,
        factor_resid=resid,
        gg=w * w,
        gt=w,
        tt=1.0,
    )


def test_float32_rounding_up_to_half_the_tolerance_is_ok():
    # the tolerance is the run's own rounding: ROUNDING_MARGIN x the step's worst fit residual, between
    # ROUNDING_FLOOR (a >= 6x margin over the worst correct loop measured, 6.4e-7) and FLOAT32_RTOL
    from accumlib.tolerances import FLOAT32_RTOL, ROUNDING_FLOOR, ROUNDING_MARGIN

    assert diagnose(numbers(rel=ROUNDING_FLOOR / 2), k=4).codes == []  # resid 1e-7: the floor holds
    high = FLOAT32_RTOL / ROUNDING_MARGIN  # a residual that large: the old fixed tolerance
    assert diagnose(numbers(rel=5e-5, resid=high), k=4).codes == []
    assert diagnose(numbers(rel=5e-5), k=4).codes != []  # 50x this step's rounding: not exact


def test_a_fit_with_residual_below_FIT_RTOL_names_the_factor():
    v = diagnose(numbers(rel=0.5, w=0.5, resid=5e-4), k=4)
    assert v.codes == ["misscaled"] and v.factor == pytest.approx(0.5)
