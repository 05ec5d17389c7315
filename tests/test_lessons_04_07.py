"""Lessons 4-7: the computations behind the notebooks, and their widgets driven without a browser.

Each widget test sets a control's value and asserts that the recomputed result moved the
way the lesson says it should. Tolerances: FLOAT32_RTOL (1e-4, float32 rounding, see
accumlib/tolerances.py) for exact claims, BF16_RTOL (0.1) for autocast; every bug shown in
these lessons is at least 0.1 off, most about 1.
"""

import pytest
import torch

import accumlib
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL
from accumlib_course import _style
from accumlib_course.lessons import batchnorm_vs_groupnorm as norms
from accumlib_course.lessons import gans_two_optimizers as gan
from accumlib_course.lessons import mixed_precision as mp

# --- 4: mixed precision -------------------------------------------------------------------------


def test_float16_underflows_and_scaling_rescues_it():
    u = mp.underflow(1e-8, scale=2.0**16)
    assert u["float16"] == 0.0  # below float16's smallest subnormal (~6e-8)
    assert u["bfloat16"] == pytest.approx(1e-8, rel=1e-2)  # 8-bit mantissa: ~0.4% rounding
    assert u["float16, scaled then unscaled"] == pytest.approx(1e-8, rel=1e-3)  # float16 eps 2^-11 ~ 5e-4


def test_one_window_correct_order_is_close_and_the_two_bugs_are_not():
    r = mp.one_window(0.25, device="cpu")
    ok, clip_first, mid = r.rel_error.values()
    assert ok < BF16_RTOL
    assert clip_first > 0.9 and r.norm_ratio["clip before unscale_"] < 1e-3  # step shrunk ~S-fold
    assert mid > 0.2


def test_a_scale_of_one_makes_clip_before_unscale_harmless():
    r = mp.one_window(0.25, init_scale=1.0, device="cpu")
    assert r.rel_error["clip before unscale_"] < BF16_RTOL


def test_gradscaler_refuses_unscaling_twice():
    assert "unscale_() has already been called" in mp.unscale_twice_error("cpu")


def test_inf_window_is_skipped_and_scale_halved():
    run = mp.inf_run((3,), growth_interval=2, device="cpu")
    assert run.skipped == [3] and not run.params_moved[3]
    assert all(run.params_moved[i] for i in range(len(run.stepped)) if i != 3)
    assert run.scale_after[3] == run.scale[3] / 2


def test_inf_explorer_moves_the_skipped_step():
    ex = mp.inf_explorer("cpu")
    assert ex.result.skipped == [3]
    ex.controls["inf_window"].value = 6
    assert ex.result.skipped == [6]
    before = list(ex.result.scale)
    ex.controls["growth_interval"].value = 1  # the scale now doubles after every clean window
    assert ex.result.scale != before and ex.result.scale[1] == 2 * ex.result.scale[0]


def test_clip_explorer_scale_of_one_hides_the_clip_first_bug():
    ex = mp.clip_explorer("cpu")
    assert ex.result.rel_error["clip before unscale_"] > 0.9
    ex.controls["log2_scale"].value = 0  # S = 1: scaled and unscaled gradients are the same
    assert ex.result.scale == 1.0 and ex.result.rel_error["clip before unscale_"] < BF16_RTOL
    ex.controls["max_norm"].value = 100.0  # above |g|: neither loop clips
    assert ex.result.max_norm == pytest.approx(100.0)
    assert ex.result.rel_error["unscale_ then clip (accumlib.amp)"] < BF16_RTOL


# --- 5: BatchNorm vs GroupNorm ------------------------------------------------------------------


def test_groupnorm_is_exact_and_batchnorm_error_grows_with_k():
    r = norms.error_vs_k((1, 2, 8), large_batch=16, device="cpu")
    assert max(r.errors["group"]) < FLOAT32_RTOL
    assert r.errors["batch"][0] < FLOAT32_RTOL  # k = 1 is the large batch itself
    assert FLOAT32_RTOL * 100 < r.errors["batch"][1] < r.errors["batch"][2]


def test_running_stats_are_updated_k_times_as_often():
    rs = norms.running_stats(accum_steps=4, large_batch=16, device="cpu")
    assert rs.batches_tracked["accumulated"] == 4 * rs.batches_tracked["large batch"]
    assert min(rs.rel_diff.values()) > 0.1


def test_error_explorer_recomputes_for_another_large_batch():
    ex = norms.error_explorer("cpu", accum_steps=(1, 4))
    assert ex.result.large_batch == 32
    ex.controls["large_batch"].value = 16
    assert ex.result.large_batch == 16 and ex.result.micro_batch(4) == 4
    assert max(ex.result.errors["group"]) < FLOAT32_RTOL < ex.result.errors["batch"][1]


def test_curves_explorer_k1_makes_batchnorm_match():
    ex = norms.curves_explorer("cpu", epochs=1, n=64)
    assert ex.result.max_gap("group") < FLOAT32_RTOL < 1e-3 < ex.result.max_gap("batch")
    ex.controls["accum_steps"].value = 1  # one micro-batch per window: accumulation is the large batch
    assert ex.result.k == 1 and ex.result.max_gap("batch") < FLOAT32_RTOL


# --- 6: GANs and two optimizers -----------------------------------------------------------------


def test_seed_listing_raises_inplace_error_and_leak_is_measured():
    c = gan.check_step("the article as written")
    assert c.error is not None and "inplace" in c.error
    leaky = gan.check_step("leaky (seed's broken order)")
    assert leaky.rel_error["D"] == pytest.approx(gan.leak_norm(), rel=1e-3)  # D's error is exactly the leak
    assert leaky.rel_error["G"] < FLOAT32_RTOL


@pytest.mark.parametrize(
    "name", ["zero_grad(D) after G's backward", "requires_grad toggle (the article's fix)", "D first, detach"]
)
def test_fixed_orderings_are_exact_for_both_optimizers(name):
    assert gan.check_step(name).exact(FLOAT32_RTOL)


def test_accumulation_two_phase_exact_interleaved_wrong():
    assert gan.check_accumulation("two phases (D window, then G window)", accum_steps=3, batch_size=5).exact(
        FLOAT32_RTOL
    )
    assert gan.check_accumulation("interleaved, leaky", accum_steps=3, batch_size=5).rel_error["D"] > 1
    assert (
        gan.check_accumulation(
            "interleaved, zero_grad(D) per micro-batch", accum_steps=3, batch_size=5
        ).rel_error["D"]
        > 0.1
    )


def test_gan_explorer_k1_makes_zero_grad_per_micro_batch_exact():
    ex = gan.explorer()
    name = "interleaved, zero_grad(D) per micro-batch"
    assert not ex.result.accumulations[name].exact()
    ex.controls["accum_steps"].value = 1  # no earlier micro-batch for zero_grad to wipe
    assert ex.result.k == 1 and ex.result.accumulations[name].exact(FLOAT32_RTOL)
    ex.controls["batch_size"].value = 3
    assert ex.result.micro_batch == 3


def test_gan_check_leaves_no_requires_grad_toggled_off():
    G, D = gan.make_gan()
    gan._run_checked(
        gan.requires_grad_toggle,
        G,
        D,
        [gan.noise(4)],
        [gan.real_points(4)],
        (gan.noise(4), gan.real_points(4)),
    )
    assert all(p.requires_grad for p in D.parameters())


def test_gan_exercise_leaks_and_requires_grad_toggle_fixes_it():
    def make(fix):
        ex = gan.exercise(n=32, seed=0)

        def train_fn(D, d_opt, loader):
            for i, (z, x) in enumerate(loader):
                fake = ex.G(z)
                (gan.d_loss(D, fake.detach(), x) / 4).backward()
                D.requires_grad_(not fix)
                (gan.g_loss(D, fake) / 4).backward()
                D.requires_grad_(True)
                if (i + 1) % 4 == 0:
                    d_opt.step(), ex.g_opt.step(), d_opt.zero_grad(), ex.g_opt.zero_grad()

        return accumlib.verify(
            train_fn, model=ex.D, dataset=ex.dataset, item_losses=ex.item_losses, accum_steps=4, batch_size=8
        )

    assert not make(fix=False).ok
    assert make(fix=True).ok


# --- 7: verify your own loop --------------------------------------------------------------------

from accumlib_course.lessons import verify_your_loop as vl  # noqa: E402

BROKEN_SOURCE = """
import torch.nn.functional as F
def train_fn(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()   # never divided
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

FIXED_SOURCE = """
import accumlib
def train_fn(model, optimizer, loader):
    accumlib.ragged(model, optimizer, loader, accumlib.tasks.classification_losses, accum_steps=4)
"""


def test_gallery_rows_agree_with_their_expected_codes():
    table = vl.gallery(["mindspore-accumulator", "last-batch-step", "correct-inner-for"])
    assert all(r.agrees for r in table.rows)
    assert [r.ok for r in table.rows] == [False, False, True]
    assert "tail-dropped" in table.codes and "3/3 loops get exactly their expected findings" in str(table)


def test_paste_box_verifies_the_pasted_loop():
    box = vl.paste_box()
    box.button.click()  # the example: the textbook loop drops the ragged tail
    assert box.result.codes == {"tail-dropped"}
    box.text.value = BROKEN_SOURCE
    box.button.click()
    assert {"unscaled-sum", "tail-dropped"} <= box.result.codes
    box.text.value = FIXED_SOURCE
    box.button.click()
    assert box.result.ok


def test_paste_box_reports_broken_code_instead_of_raising():
    box = vl.paste_box("def train_fn(:")
    assert isinstance(box.run(), SyntaxError)
    box.text.value = "x = 1"
    assert isinstance(box.run(), ValueError) and "train_fn" in str(box.result)


def test_gallery_explorer_reruns_verify_for_the_chosen_loop():
    ex = vl.gallery_explorer()
    assert ex.result.report.codes == {"tail-misscaled", "mean-of-means"}
    ex.controls["name"].value = "correct-inner-for"
    assert ex.result.report.ok and "correct_inner_for" in ex.result.source


# --- issue 12: argument checks, the style, the momentum claim, the exercises' feedback -----------------


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: mp.compute(max_norm=0), "max_norm must be a number > 0.0 (got 0)"),
        (lambda: mp.compute(accum_steps=1), "accum_steps must be an integer >= 2"),
        (lambda: mp.compute(batch_size=0), "batch_size must be an integer >= 1 (got 0)"),
        (lambda: mp.compute(accum_steps=4, batch_size=30), "accum_steps * batch_size must be <= 110"),
        (lambda: mp.compute(change_after=4), "change_after must be an integer between 1 and 3"),
        (lambda: mp.inf_run((10,)), "inf_windows[0] must be an integer between 0 and 9"),
        (lambda: mp.inf_run(growth_interval=0), "growth_interval must be an integer >= 1 (got 0)"),
        (lambda: norms.compute((3,)), "accum_steps must divide large_batch=32"),
        (lambda: norms.compute(()), "accum_steps must be a non-empty sequence"),
        (lambda: norms.training_curves(accum_steps=0), "accum_steps must be an integer between 1 and 32"),
        (lambda: norms.momentum_check(large_batch=0), "large_batch must be an integer >= 1 (got 0)"),
        (lambda: norms.training_budget(epochs=0), "epochs must be an integer >= 1 (got 0)"),
        (lambda: gan.compute(accum_steps=0), "accum_steps must be an integer between 1 and 64 (got 0)"),
        (lambda: gan.compute(batch_size=0), "batch_size must be an integer between 1 and 256 (got 0)"),
        (
            lambda: vl.check(lambda model, opt, loader: None, accum_steps=0),
            "accum_steps must be an integer >= 1 (got 0)",
        ),
        (lambda: vl.check(lambda model, opt, loader: None, task="nope"), "task must be one of"),
    ],
)
def test_bad_values_are_refused_before_any_work(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_every_figure_uses_text_of_10_pt_or_more_and_no_pyplot():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    figures = [
        mp.plot(mp.compute(device="cpu")),
        mp.plot_inf_run(mp.inf_run(device="cpu")),
        norms.plot(norms.compute((1, 2), large_batch=16, device="cpu")),
        norms.plot_curves(norms.training_curves(accum_steps=2, epochs=1, n=64, device="cpu")),
        gan.plot(gan.compute()),
        vl.plot(vl.compute(["mindspore-accumulator", "correct-inner-for"])),
    ]
    for fig in figures:
        sizes = _style.font_sizes(fig)
        assert sizes and min(sizes) >= _style.MIN_FONT_PT, (fig, sorted(set(sizes)))
        assert fig.get_suptitle() or any(ax.get_title() for ax in fig.axes)  # every figure says what it shows
    assert plt.get_fignums() == before  # pyplot-free: the inline backend never shows them twice


def test_momentum_decay_one_minus_0_9_root_k_matches_the_large_batch_and_0_1_over_k_is_only_close():
    m = norms.momentum_check(accum_steps=8, large_batch=32, device="cpu")
    default, approx, exact = (m.worst[name] for name in m.momenta)
    assert m.decay["1 - 0.9^(1/k)"] == pytest.approx(0.9, abs=1e-12)  # (1 - m)^k = 0.9 by construction
    assert 0.9 < m.decay["0.1 / k"] < 0.91  # first order only: (1 - 0.1/8)^8 = 0.9043
    assert default > 1  # momentum 0.1 per micro-batch: the buffers are far from the large batch's
    assert 0.01 < approx < default / 10  # 0.1/k fixes most of it, not all
    assert exact < approx / 10  # left: unequal weights of the k micro-batch means, micro-batch variances


def test_groupnorm_is_behind_in_training_not_in_generalization():
    b = norms.training_budget(epochs=6, device="cpu")
    # after 3 epochs its training loss is higher too
    assert b.train_loss["group"][2] > b.train_loss["batch"][2]
    gap = [b.accuracy["batch"][e] - b.accuracy["group"][e] for e in range(6)]
    assert gap[5] < gap[2]  # and the accuracy gap shrinks with more epochs


def test_curves_reuse_the_large_batch_run_for_every_k():
    a = norms.training_curves(accum_steps=2, epochs=1, n=64, device="cpu")
    b = norms.training_curves(accum_steps=4, epochs=1, n=64, device="cpu")
    for norm in norms.NORMS:
        assert a.losses[(norm, "large batch")] == b.losses[(norm, "large batch")]  # same windows, merged
    assert a.losses[("batch", "accumulated")] != b.losses[("batch", "accumulated")]


def test_batchnorm_exercise_frozen_statistics_pass_and_training_mode_is_the_limit():
    import torch.nn.functional as F

    def loop(freeze):
        def train_fn(model, optimizer, loader):
            if freeze:
                for m in model.modules():
                    if isinstance(m, torch.nn.BatchNorm2d):
                        m.eval()
            for i, (x, y) in enumerate(loader):
                (F.cross_entropy(model(x), y, reduction="sum") / (4 * len(y))).backward()
                if (i + 1) % 4 == 0:
                    optimizer.step()
                    optimizer.zero_grad()

        return train_fn

    bad, good = norms.EXERCISE.check(loop(False)), norms.EXERCISE.check(loop(True))
    assert not bad.ok and bad.codes == ("batchnorm",) and "forward pass" in bad.hint
    assert good.ok


def test_gan_exercise_names_the_leak_not_unexplained_and_points_to_no_ragged_loop():
    def loop(kind):
        def train_fn(G, D, g_opt, d_opt, loader):
            for i, (z, x) in enumerate(loader):
                fake = G(z)
                if kind == "zero":
                    (gan.g_loss(D, fake) / 4).backward()
                    d_opt.zero_grad()
                (gan.d_loss(D, fake.detach(), x) / 4).backward()
                if kind == "leak":
                    (gan.g_loss(D, fake) / 4).backward()
                if (i + 1) % 4 == 0:
                    d_opt.step(), g_opt.step(), d_opt.zero_grad(), g_opt.zero_grad()

        return train_fn

    leak = gan.EXERCISE.check(loop("leak"))
    assert leak.codes == ("leak-into-D",) and "unexplained" not in str(leak)
    assert "ragged" not in leak.hint and "ragged" not in str(leak)
    zero = gan.EXERCISE.check(loop("zero"))
    assert zero.codes == ("zero-grad-inside-window",) and "clear" in zero.hint
    assert gan.leak_share(loop("leak")) < FLOAT32_RTOL < gan.leak_share(loop("zero"))


def test_amp_exercise_hides_the_fix_and_hints_at_the_order():
    import torch.nn.functional as F

    def train_fn(model, optimizer, loader):
        scaler = torch.amp.GradScaler("cpu")
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / 4
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # per micro-batch: GradScaler refuses the second one
            if (i + 1) % 4 == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    grade = mp.EXERCISE.check(train_fn)
    assert not grade.ok and "unscale_() has already been called" in grade.error
    assert "once per window" in grade.hint
