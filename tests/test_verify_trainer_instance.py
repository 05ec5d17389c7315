"""verify_trainer judges the user's own Trainer, with every setting made on the instance after it was
built: an exact copy of it, not a Trainer rebuilt from constructor arguments alone.

transformers' ``Trainer.__init__`` computes ``model_accepts_loss_kwargs`` from the model (5.23.0,
trainer.py lines 517-528); a user who sets ``trainer.model_accepts_loss_kwargs = False`` afterwards
(as transformers' docs tell custom-loss users to) trains with each micro-batch's mean loss divided
by k (compute_loss line 2159, training_step lines 2103-2111). A rebuilt Trainer would recompute True
and divide by the window's token count: verify would pass a run that is wrong (a silent false pass),
or fail one that is right (GPT-2 below).

The truth is established without verify: the user's configuration is trained by a twin Trainer
built the same way, and each optimizer step's gradient is held against the true token-mean
gradient of the window's forwards, taken with autograd at the same parameters.

Tiny Llama / GPT-2 (one layer, hidden 32) on 22 sequences in micro-batches of 2, k = 4: windows of
4, 4 and 3 micro-batches.
"""

from __future__ import annotations

import copy
import os
import types

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

from accumlib.tolerances import FIT_RTOL, FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402

transformers = pytest.importorskip("transformers", reason="transformers is in the hf and test extras")
from transformers import Trainer, TrainingArguments  # noqa: E402

from accumlib.hf import causal_lm_losses, verify_trainer  # noqa: E402
from accumlib_course.examples.hf_tiny import tiny_gpt2, tiny_llama  # noqa: E402

K, B = 4, 2
ONE_EPOCH = [4, 4, 3]


def build(out, model=None, data=None, **settings) -> Trainer:
    """A Trainer over a tiny Llama (or ``model``), then ``settings`` set on the instance, as a user
    does after construction."""
    trainer = Trainer(
        model=tiny_llama() if model is None else model,
        args=TrainingArguments(
            output_dir=str(out),
            per_device_train_batch_size=B,
            gradient_accumulation_steps=K,
            num_train_epochs=1,
            max_grad_norm=0.0,  # no clipping: each step's gradient is the accumulated one as is
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            logging_strategy="no",
            save_strategy="no",
        ),
        train_dataset=token_sequences() if data is None else data,
        data_collator=collate,
    )
    for name, value in settings.items():
        setattr(trainer, name, value)
    return trainer


def reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def real_run(trainer: Trainer) -> list[float]:
    """Train ``trainer`` itself (verify is not involved); return, per optimizer step, the relative
    error ||G - g|| / ||g|| of the gradient G its optimizer steps with against the true token-mean
    gradient g of that window's forwards, autograd on a copy of the model at the same parameters."""
    model = trainer.model
    fresh = copy.deepcopy(model)
    seen: list[dict] = []
    captured: list[tuple] = []

    def on_forward(module, args, kwargs):
        seen.append({k: kwargs[k] for k in ("input_ids", "attention_mask", "labels")})

    def on_step(opt, args, kwargs):
        params = list(model.parameters())
        captured.append(([p.grad.clone() for p in params], [p.detach().clone() for p in params], list(seen)))
        seen.clear()

    hooks = [
        model.register_forward_pre_hook(on_forward, with_kwargs=True),
        register_optimizer_step_pre_hook(on_step),
    ]
    try:
        trainer.train()
    finally:
        for h in hooks:
            h.remove()
        reset_accelerate()
    assert [len(w) for _, _, w in captured] == ONE_EPOCH
    errors = []
    for grads, params, window in captured:
        with torch.no_grad():
            for p, q in zip(fresh.parameters(), params, strict=True):
                p.copy_(q)
        losses = torch.cat([causal_lm_losses(fresh, b) for b in window])
        true = torch.cat([g.flatten() for g in torch.autograd.grad(losses.mean(), list(fresh.parameters()))])
        got = torch.cat([g.flatten() for g in grads])
        errors.append(float((got.double() - true.double()).norm() / true.double().norm()))
    return errors


# --- the false pass: a setting made on the instance ----------------------------------------------


@pytest.mark.parametrize(
    "setting, code",
    [
        # each micro-batch's mean divided by k: micro-batches of different token counts weigh alike
        ({"model_accepts_loss_kwargs": False}, "mean-of-means"),
        # the model's loss, already divided by the window's token count, divided by k again
        ({"loss_is_scaled_for_ga": False}, "misscaled"),
    ],
)
def test_a_setting_made_on_the_instance_is_judged(setting, code, tmp_path):
    """The user's run is wrong (its own twin, trained without verify, shows it) and verify says so,
    with the same relative error at every step as the real run's, to float32 rounding."""
    user = build(tmp_path / "user", **setting)
    report = verify_trainer(user)
    truth = real_run(build(tmp_path / "twin", **setting))
    assert min(truth) > 0.05, truth  # the real run is wrong at every step
    assert not report.ok and code in report.codes, str(report)
    assert [r.micro_batches for r in report.steps] == ONE_EPOCH
    got = [r.rel_error for r in report.steps]
    assert got == pytest.approx(truth, rel=FIT_RTOL, abs=FLOAT32_RTOL), (got, truth)


def test_the_correct_twin_without_the_setting_is_ok(tmp_path):
    """The same Trainer with model_accepts_loss_kwargs as transformers computed it (True for Llama)
    divides every window by its token count: exact, in the real run and in verify's."""
    user = build(tmp_path / "user")
    assert user.model_accepts_loss_kwargs is True
    report = verify_trainer(user)
    truth = real_run(build(tmp_path / "twin"))
    assert max(truth) <= FLOAT32_RTOL, truth
    assert report.ok and not report.codes, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


def test_a_setting_that_makes_gpt2_exact_is_not_failed(tmp_path):
    """The other direction: GPT-2's Trainer miscounts its labels (one per sequence too many) when it
    passes num_items_in_batch; told model_accepts_loss_kwargs = False, on sequences all of one length
    (every micro-batch holds the same tokens), its mean of micro-batch means is exact. A rebuilt
    Trainer would be judged misscaled by N / (N + S) instead."""
    data = token_sequences(min_len=16, max_len=16)
    user = build(tmp_path / "user", tiny_gpt2(), data, model_accepts_loss_kwargs=False)
    report = verify_trainer(user)
    truth = real_run(build(tmp_path / "twin", tiny_gpt2(), data, model_accepts_loss_kwargs=False))
    assert max(truth) <= FLOAT32_RTOL, truth
    assert report.ok and "misscaled" not in report.codes, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


def test_the_users_trainer_is_unchanged(tmp_path):
    user = build(tmp_path, model_accepts_loss_kwargs=False)
    params = [p.detach().clone() for p in user.model.parameters()]
    names = set(vars(user))
    report = verify_trainer(user)
    assert not report.ok
    assert user.model_accepts_loss_kwargs is False
    assert user.state.global_step == 0 and user.optimizer is None
    assert set(vars(user)) == names
    assert all(torch.equal(p, q) for p, q in zip(user.model.parameters(), params, strict=True))


# --- a method patched on the instance ---------------------------------------------------------------


def test_a_method_patched_on_the_instance_runs_in_the_copy_bound_to_the_copy(tmp_path):
    """``trainer.compute_loss = types.MethodType(doubled, trainer)``: a loss twice too large is judged
    (misscaled, scale 2), and the method ran with the copy as ``self``, never the user's trainer."""
    selves: list = []

    def doubled(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        selves.append(self)
        return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch) * 2

    user = build(tmp_path)
    user.compute_loss = types.MethodType(doubled, user)
    report = verify_trainer(user)
    assert not report.ok and "misscaled" in report.codes, str(report)
    assert all(abs(r.factor - 2) <= FIT_RTOL for r in report.steps), [r.factor for r in report.steps]
    assert len(selves) == sum(ONE_EPOCH) and all(s is not user and type(s) is Trainer for s in selves)
    assert user.compute_loss.__self__ is user  # the user's binding, untouched


def test_a_function_that_closes_over_the_trainer_is_refused_by_name(tmp_path):
    """A plain function reaching the trainer through its closure cannot be pointed at the copy: it
    is refused before anything runs, naming the attribute and the remedy."""
    user = build(tmp_path)
    user.compute_loss = lambda model, inputs, **kw: Trainer.compute_loss(user, model, inputs, **kw)
    with pytest.raises(
        ValueError, match=r"trainer\.compute_loss must not be a function .*closure.*MethodType"
    ):
        verify_trainer(user)
    assert user.state.global_step == 0


# --- what is carried, without a run ----------------------------------------------------------------


def test_what_is_carried_onto_a_fresh_trainer(tmp_path):
    """Settings that differ, values compared by value that differ, objects of another type and
    attributes the constructor does not make are carried (deep copies: the user's never reach the
    copy); an object of the same type compared by identity is each constructor's own and stays the
    copy's; what verify replaces is never carried."""
    import contextlib

    from transformers.trainer_pt_utils import LabelSmoother

    from accumlib.hf.instance import carry_instance_settings

    user, fresh = build(tmp_path / "user"), build(tmp_path / "fresh")
    net = fresh.model
    own_context = fresh.context = contextlib.nullcontext()
    user.context = contextlib.nullcontext()  # same type, compared by identity: the copy's own stays
    user.model_accepts_loss_kwargs = False  # a setting
    user.label_smoother = LabelSmoother(epsilon=0.1)  # None in the fresh one: another type
    user.extra = {"weights": [1.0, 2.0]}  # not made by the constructor
    user.current_flos = 7  # run bookkeeping: never carried
    carried = carry_instance_settings(user, fresh, net)
    assert sorted(carried) == ["extra", "label_smoother", "model_accepts_loss_kwargs"]
    assert fresh.context is own_context and fresh.current_flos == 0
    assert fresh.model_accepts_loss_kwargs is False and fresh.label_smoother == LabelSmoother(epsilon=0.1)
    assert fresh.extra == user.extra and fresh.extra is not user.extra
    assert fresh.model is net and fresh.args is not user.args
