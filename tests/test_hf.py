"""accumlib.hf.verify_trainer on real transformers Trainers (tiny models built from configs, nothing
downloaded), and the run_clm_no_trainer-style Accelerate example under plain accumlib.verify.

The oracle for what the Trainer does is taken independently of verify where a claim depends on
it: a Trainer subclass records every micro-batch its ``training_step`` receives (and the
``num_items_in_batch`` it divides by), cut at every optimizer step, so each window's predicted
tokens N and sequences S are counted from the Trainer's own inputs.
"""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

import accumlib  # noqa: E402
from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402

transformers = pytest.importorskip("transformers", reason="transformers is in the hf and test extras")
from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForSequenceClassification,
    Trainer,
    TrainingArguments,
)

from accumlib.hf import causal_lm_losses, verify_trainer  # noqa: E402
from accumlib_course.survey import tiny_model  # noqa: E402

K, B = 4, 2  # 22 sequences in micro-batches of 2: windows of 4, 4 and 3 micro-batches
# A float32 gradient's fitted scale lands within ~1e-6 of the factor applied (measured residual 2e-7);
# 1e-5 still tells N/(N+S) from its neighbours (N + S <= 100, so they differ by >= 1e-4).
SCALE_RTOL = 1e-5


class Recording(Trainer):
    """A Trainer subclass that keeps the training loop and notes each micro-batch it trains on.
    The record is on the class, so verify_trainer's copy (built as type(trainer)) writes to it too."""

    windows: list[list[tuple[dict, object]]] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        Recording.windows[-1].append(({k: v.detach().clone() for k, v in inputs.items()}, num_items_in_batch))
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.fixture
def recorded():
    """Windows of micro-batches as the Trainer saw them, cut right before each optimizer step."""
    Recording.windows = [[]]
    hook = register_optimizer_step_pre_hook(lambda opt, a, kw: Recording.windows.append([]))
    yield Recording.windows
    hook.remove()


def counts(windows) -> list[tuple[int, int, list]]:
    """(N predicted tokens, S sequences, the num_items_in_batch it was divided by) of each stepped window."""
    out = []
    for w in windows:
        if w:
            n = sum(int((b["labels"][:, 1:] != -100).sum()) for b, _ in w)
            out.append((n, sum(b["labels"].shape[0] for b, _ in w), sorted({int(nib) for _, nib in w})))
    return out


def gpt2() -> GPT2LMHeadModel:
    """GPT-2 as a user configures it: the default dropout 0.1 on (verify switches it off in its copy)."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64, bos_token_id=1, eos_token_id=2
        )
    )


def trainer(model, out, cls=Trainer, data=None, **kw):
    args = dict(
        per_device_train_batch_size=B,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
    )
    optimizers = kw.pop("optimizers", (None, None))
    return cls(
        model=model,
        args=TrainingArguments(output_dir=str(out), **args | kw),
        optimizers=optimizers,
        train_dataset=token_sequences() if data is None else data,
        data_collator=collate,
    )


# --- the default item losses are the models' own ------------------------------------------------


@pytest.mark.parametrize("make", [gpt2, lambda: tiny_model("llama")], ids=["gpt2", "llama"])
def test_causal_lm_losses_average_to_the_models_own_loss(make):
    model = make().eval()
    batch = collate(token_sequences()[:3])
    with torch.no_grad():
        losses = causal_lm_losses(model, batch)
        assert losses.numel() == int((batch["labels"][:, 1:] != -100).sum())  # one item per predicted token
        assert float(losses.mean()) == pytest.approx(float(model(**batch).loss), rel=1e-6)
        # a padding-free collator's shift_labels (aligned with the inputs) gives the same items
        shifted = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
        assert torch.allclose(causal_lm_losses(model, {**batch, "shift_labels": shifted}), losses)


# --- verify_trainer on GPT-2 and Llama ------------------------------------------------------------


def test_gpt2_is_misscaled_by_its_label_count(tmp_path, recorded):
    """The Trainer divides GPT-2's windows by N + S labels (counted before the causal shift) while the
    loss sums N token losses: each step is c = N/(N+S) of the true gradient, with N and S counted
    from the Trainer's own micro-batches. Also: a Trainer subclass runs as itself in verify's copy."""
    report = verify_trainer(trainer(gpt2(), tmp_path, cls=Recording))
    windows = counts(recorded)
    assert report.codes == {"misscaled", "dropout"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 3]
    assert len(windows) == 3  # the subclass's training_step ran: verify built type(trainer)
    for row, (n, s, divisor) in zip(report.steps, windows, strict=True):
        assert divisor == [n + s]  # the cause, seen in the Trainer: one label too many per sequence
        assert row.items == n
        assert row.factor == pytest.approx(n / (n + s), rel=SCALE_RTOL), (row, n, s)
        assert row.rel_error > 0.05  # and so far from the true gradient
    (found,) = [f for f in report.findings if f.code == "misscaled"]
    assert "shift" in found.message and found.steps == (0, 1, 2)
    assert [r.cause for r in report.steps] == ["shift"] * 3  # the same cause as data, step by step
    # the ragged tail is stepped
    assert report.items_stepped == report.items_total == sum(n for n, _, _ in windows)


def test_llama_is_exact(tmp_path, recorded):
    report = verify_trainer(trainer(tiny_model("llama"), tmp_path, cls=Recording))
    assert report.ok and not report.codes, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    assert all(r.factor == pytest.approx(1.0, rel=FLOAT32_RTOL) for r in report.steps)
    # divided by N exactly
    assert [d for _, _, d in counts(recorded)] == [[n] for n, _, _ in counts(recorded)]


def test_max_steps_judges_two_steps_and_stops_the_trainer(tmp_path, recorded):
    report = verify_trainer(trainer(tiny_model("llama"), tmp_path, cls=Recording), max_steps=2)
    assert len(report.steps) == 2
    # no tail-dropped: the rest was never reached
    assert report.codes == {"partial-run"} and report.ok, str(report)
    assert sum(len(w) for w in recorded) == 2 * K  # the Trainer itself stopped after two windows


def test_the_user_optimizer_and_scheduler_are_copied_not_used(tmp_path):
    """An optimizer passed with optimizers=(opt, sched) is bound to the user's model: verify_trainer
    rebuilds it over the copy, with its state, and runs a copy of the scheduler on it."""
    model = tiny_model("llama")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    report = verify_trainer(trainer(model, tmp_path, optimizers=(opt, sched)))
    assert report.ok, str(report)
    assert [r.lr for r in report.steps] == [0.05, 0.025, 0.0125]  # the user's schedule drove the copy
    assert opt.state_dict()["state"] == {} and sched.last_epoch == 0 and opt.param_groups[0]["lr"] == 0.05


def test_a_length_grouped_sampler_is_followed(tmp_path):
    """train_sampling_strategy="group_by_length" reads every item's length before the first batch; read
    through verify's recording dataset, those reads would pass for a micro-batch (a false early-step)."""
    data = [{"input_ids": t} for t in token_sequences()]
    t = trainer(tiny_model("llama"), tmp_path, data=data, train_sampling_strategy="group_by_length")
    t.data_collator = lambda items: collate([i["input_ids"] for i in items])
    report = verify_trainer(t)
    assert report.ok and not report.codes, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] and report.items_stepped == report.items_total


@pytest.mark.parametrize("drop_last", [True, False], ids=["drop_last", "keep_last"])
def test_dataloader_drop_last_is_a_stated_choice_not_an_early_step(tmp_path, recorded, drop_last):
    """dataloader_drop_last=True leaves out the last, partial micro-batch of the epoch; the Trainer then
    steps a short last window of full micro-batches. Before b6eb9ef: 'early-step' at that window (step 1)
    and 'tail-dropped' (16 of 213 tokens, the 2 sequences never drawn). 23 sequences in micro-batches
    of 3, on purpose: 3 does not divide 23."""
    n, b = 23, 3
    data = token_sequences(n=n)
    report = verify_trainer(
        trainer(
            tiny_model("llama"),
            tmp_path,
            cls=Recording,
            data=data,
            per_device_train_batch_size=b,
            dataloader_drop_last=drop_last,
        )
    )
    dropped = n % b if drop_last else 0
    # sequences per micro-batch, as the Trainer saw them
    trained = [len(x["labels"]) for w in recorded for x, _ in w]
    assert sum(trained) == n - dropped and set(trained) == ({b} if drop_last else {b, n % b})
    assert [r.micro_batches for r in report.steps] == ([4, 3] if drop_last else [4, 4])
    assert report.ok, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    assert not report.codes & {"early-step", "tail-dropped"}, str(report)
    if drop_last:
        assert report.codes == {"loader-left-out"}, str(report)
        (found,) = report.findings
        assert (
            f"{dropped} dataset item(s) left out over 1 pass(es) ({dropped} of {n} per pass)" in found.message
        ), found.message
    else:
        assert not report.codes, str(report)
        assert report.items_stepped == report.items_total


def test_dataloader_drop_last_is_named_as_the_reason(tmp_path):
    report = verify_trainer(
        trainer(
            tiny_model("llama"),
            tmp_path,
            data=token_sequences(n=23),
            per_device_train_batch_size=3,
            dataloader_drop_last=True,
        )
    )
    (found,) = report.findings
    assert "drop_last=True with batch_size 3" in found.message, found.message


def test_the_users_objects_are_untouched(tmp_path, monkeypatch):
    """Model, optimizer, scheduler, dataset, Trainer state, RNGs and Accelerate's shared state are as
    before; nothing is written outside a temporary folder; and the user's own train() afterwards
    gives exactly what an identical Trainer that never met verify gives."""
    import huggingface_hub.constants as hub
    from accelerate.state import GradientState

    def tree(root: Path) -> dict:
        return {p: p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}

    def make(out):
        model = gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        return trainer(model, out, data=data, optimizers=(opt, sched)), model, opt, sched

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    hub_home = tree(Path(hub.HF_HOME))
    data = token_sequences()
    data_before = [t.clone() for t in data]
    user, model, opt, sched = make(tmp_path / "user-out")
    params = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state, sched_state = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    rng = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    gradient_state = dict(GradientState._shared_state)
    made = {p for p in tmp_path.rglob("*")}

    report = verify_trainer(user)

    assert report.steps and "misscaled" in report.codes
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items()), (
        "the user's parameters changed"
    )
    assert all(p.grad is None for p in model.parameters()) and not model._forward_pre_hooks
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == [0.1] * 4  # put back
    assert model.config.attn_pdrop == 0.1 and model.training
    assert opt.state_dict() == opt_state and sched.state_dict() == sched_state
    assert user.state.global_step == 0 and user.optimizer is opt and user.lr_scheduler is sched
    assert all(torch.equal(a, b) for a, b in zip(data, data_before, strict=True))
    assert (
        torch.equal(torch.get_rng_state(), rng[0])
        and (np.random.get_state()[1] == rng[1]).all()
        and random.getstate() == rng[2]
    )
    assert dict(GradientState._shared_state) == gradient_state
    assert {p for p in tmp_path.rglob("*")} == made  # no checkpoint in the user's output_dir, nothing in cwd
    assert tree(Path(hub.HF_HOME)) == hub_home

    user.train()  # the user's own run, after verify ...
    fresh, fresh_model, _, _ = make(tmp_path / "fresh-out")
    fresh.train()  # ... matches a run verify never touched, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True))


# --- sequence classification: the Trainer's k x bug -----------------------------------------------


def classification_data() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": s, "label": int(torch.randint(0, 3, (), generator=g))} for s in token_sequences()]


def classify_collate(items: list[dict]) -> dict:
    batch = collate([i["input_ids"] for i in items])
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "labels": torch.tensor([i["label"] for i in items]),
    }


def classifier() -> LlamaForSequenceClassification:
    torch.manual_seed(0)
    return LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            num_labels=3,
        )
    )


def classify_trainer(model, out, cls=Trainer):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
    )
    return cls(model=model, args=args, train_dataset=classification_data(), data_collator=classify_collate)


def test_sequence_classification_steps_are_m_times_the_gradient_without_verify(tmp_path):
    """The bug pinned with the Trainer alone: at each optimizer step, compare the gradient it sees with
    the autograd gradient of the window's mean sample loss at the same parameters. It is exactly
    m times it (m micro-batches: 4, 4, 3): the forward takes **kwargs, so the Trainer passes
    num_items_in_batch and skips its division by k, but the loss (GenericForSequenceClassification)
    never receives it and stays each micro-batch's mean."""
    model = classifier()
    fresh = copy.deepcopy(model)
    windows, ratios = [[]], []

    class Seen(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            windows[-1].append({k: v.clone() for k, v in inputs.items()})
            return super().training_step(model, inputs, num_items_in_batch)

    def on_step(opt, args, kwargs):
        window = windows[-1]
        fresh.load_state_dict(model.state_dict())
        losses = torch.cat(
            [
                F.cross_entropy(
                    fresh(**{k: v for k, v in b.items() if k != "labels"}).logits,
                    b["labels"],
                    reduction="none",
                )
                for b in window
            ]
        )
        true = torch.cat([g.flatten() for g in torch.autograd.grad(losses.mean(), list(fresh.parameters()))])
        got = torch.cat([p.grad.flatten() for p in model.parameters()])
        ratio = float(got @ true / (true @ true))
        ratios.append((len(window), ratio, float((got - ratio * true).norm() / true.norm())))
        windows.append([])

    hook = register_optimizer_step_pre_hook(on_step)
    try:
        classify_trainer(model, tmp_path, cls=Seen).train()
    finally:
        hook.remove()
    assert [m for m, _, _ in ratios] == [4, 4, 3]
    for m, ratio, residual in ratios:
        assert ratio == pytest.approx(m, rel=SCALE_RTOL)  # every micro-batch sized alike: exactly m x
        assert residual <= 1e-5  # a pure rescale


def test_verify_trainer_names_the_classification_bug(tmp_path):
    report = verify_trainer(classify_trainer(classifier(), tmp_path))
    assert report.codes == {"unscaled-sum", "logged-loss-scaled"}, str(report)
    assert [round(r.factor, 4) for r in report.steps] == [4.0, 4.0, 3.0]
    assert report.logged_loss == pytest.approx(report.true_loss * 4, rel=0.1)  # the Trainer's train_loss, k x


def test_sequence_classification_losses_is_the_default(tmp_path):
    """Told its own loss explicitly, verify_trainer says the same: the default is that loss."""
    from accumlib.hf import sequence_classification_losses

    model = classifier().eval()
    batch = classify_collate(classification_data()[:4])
    with torch.no_grad():
        assert float(sequence_classification_losses(model, batch).mean()) == pytest.approx(
            float(model(**batch).loss), rel=1e-6
        )


# --- refusals ----------------------------------------------------------------------------------


def test_a_model_without_a_default_item_loss_needs_item_losses(tmp_path):
    torch.manual_seed(0)
    mlm = BertForMaskedLM(
        BertConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=64,
        )
    )
    with pytest.raises(ValueError, match=r"item_losses must be given .*\(got BertForMaskedLM\)"):
        verify_trainer(trainer(mlm, tmp_path))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"trainer": object()}, TypeError, r"trainer must be a transformers.Trainer \(got object\)"),
        ({"max_steps": 0}, ValueError, r"max_steps must be None or an integer >= 1 \(got 0\)"),
        (
            {"item_losses": "ce"},
            TypeError,
            r"item_losses must be None or callable .*\(got 'ce' of type str\)",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, kwargs, error, message):
    kwargs.setdefault("trainer", trainer(tiny_model("llama"), tmp_path))
    with pytest.raises(error, match=message):
        verify_trainer(kwargs.pop("trainer"), **kwargs)


# --- Accelerate: run_clm_no_trainer's loop under plain verify ------------------------------------


@pytest.fixture
def fresh_accelerate():
    from accumlib_course.examples.accelerate_clm import reset_accelerate

    reset_accelerate()
    yield
    reset_accelerate()


def test_accelerate_run_clm_loop_weighs_micro_batches_not_tokens(fresh_accelerate):
    """Accelerate's accumulate() divides each micro-batch's mean token loss by k: every window is a
    mean of means (micro-batches hold different token counts), and the ragged last window of 3
    micro-batches is still divided by 4."""
    from accumlib_course.examples import accelerate_clm as ex

    report = accumlib.verify(ex.train, **ex.verify_args())
    assert report.codes == {"mean-of-means", "tail-misscaled"}, str(report)
    assert [r.micro_batches for r in report.steps] == [4, 4, 3]
    assert [r.step for r in report.steps if "tail-misscaled" in r.codes] == [2]
    assert all("mean-of-means" in r.codes for r in report.steps)
    (tail,) = [f for f in report.findings if f.code == "tail-misscaled"]
    assert "each micro-batch mean weighted [0.25, 0.25, 0.25]" in tail.message  # 1/k each, though only 3 came
    assert report.steps[-1].rel_error > 0.5


def test_accelerate_loop_counting_its_tokens_is_exact(fresh_accelerate):
    from accumlib_course.examples import accelerate_clm as ex

    report = accumlib.verify(ex.train_counted, **ex.verify_args())
    assert report.ok and not report.codes, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL


# --- packaging -----------------------------------------------------------------------------------


def test_accumlib_imports_without_the_frameworks():
    """accumlib.hf, accumlib.lightning and accumlib_course.survey import their frameworks only when called."""
    code = (
        "import sys, accumlib, accumlib.hf, accumlib.lightning, accumlib_course.survey; "
        "print(sorted(m for m in ('transformers', 'accelerate', 'lightning', 'pytorch_lightning') if m in "
        "sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_users_optimizer_state_is_left_as_it_was(tmp_path):
    """An optimizer that has stepped before (SGD momentum buffers): verify_trainer rebuilds it over its copy
    with a deep copy of that state, so the copy's steps never move the user's buffers. (With a fresh
    optimizer, whose state is empty, a shared buffer could not show.)"""
    model = gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batch = collate(token_sequences()[:B])
    model(**batch).loss.backward()
    opt.step()  # momentum buffers now hold this gradient
    opt.zero_grad(set_to_none=True)
    before = {i: s["momentum_buffer"].clone() for i, s in opt.state_dict()["state"].items()}
    params = {k: v.clone() for k, v in model.state_dict().items()}
    assert before and any(b.abs().sum() > 0 for b in before.values())

    report = verify_trainer(trainer(model, tmp_path, optimizers=(opt, None)))

    assert report.steps
    after = opt.state_dict()["state"]
    assert set(after) == set(before)
    assert all(torch.equal(after[i]["momentum_buffer"], before[i]) for i in before), (
        "the user's momentum buffers moved"
    )
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
