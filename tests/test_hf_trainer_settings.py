"""verify_trainer runs what the user configured: the copy trains as the user's Trainer would, with
the user's optimizer state, parameter groups, scheduler, callbacks, loss function and item losses,
and changes only what a comparison needs (one epoch, no evaluation, no workers, no NEFTune noise,
no dropout). The user's own objects, arguments and callbacks are left as they were.

Every run is a tiny Llama (no dropout, so its Trainer is exact) on 22 sequences in micro-batches of
2 with k = 4: three optimizer steps of 4, 4 and 3 micro-batches per epoch.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from conftest import exact, within_rounding  # noqa: E402

from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402

transformers = pytest.importorskip("transformers", reason="transformers is in the hf and test extras")
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from accumlib.hf import causal_lm_losses, verify_trainer  # noqa: E402
from accumlib_course.examples.hf_tiny import tiny_llama  # noqa: E402

K, B = 4, 2
ONE_EPOCH = [4, 4, 3]  # micro-batches per optimizer step over the 22 sequences


def args_for(out, **kw) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out),
        **dict(
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
        | kw,
    )


def llama_trainer(out, model=None, **kw) -> Trainer:
    trainer_kw = {
        k: kw.pop(k)
        for k in ("optimizers", "callbacks", "compute_loss_func", "optimizer_cls_and_kwargs", "eval_dataset")
        if k in kw
    }
    return Trainer(
        model=tiny_llama() if model is None else model,
        args=args_for(out, **kw),
        train_dataset=token_sequences(),
        data_collator=collate,
        **trainer_kw,
    )


# --- the copy trains as the user's Trainer would ------------------------------------------------


class Snapshots(TrainerCallback):
    """The parameters after every optimizer step, kept on the class so verify's copy of it writes here too."""

    taken: list[torch.Tensor] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        Snapshots.taken.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))


def stepped_before(out) -> Trainer:
    """A Trainer given an SGD optimizer that has stepped once (momentum buffers full), with two parameter
    groups of their own learning rate and weight decay, and a StepLR scheduler."""
    model = tiny_llama()
    params = list(model.parameters())
    opt = torch.optim.SGD(
        [{"params": params[:3], "lr": 0.1, "weight_decay": 0.01}, {"params": params[3:]}],
        lr=0.05,
        momentum=0.9,
    )
    model(**collate(token_sequences()[:B])).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return llama_trainer(out, model, optimizers=(opt, sched), callbacks=[Snapshots()])


def test_the_copy_takes_the_same_steps_as_the_users_own_train(tmp_path):
    """The copy's parameters after each step are those of the user's train(), bit for bit: the copy starts
    from the user's momentum buffers, keeps each parameter group's hyperparameters and follows the
    user's schedule. Shown against a twin Trainer, built the same way, that verify never sees."""
    user, twin = stepped_before(tmp_path / "user"), stepped_before(tmp_path / "twin")
    momentum = {i: s["momentum_buffer"].clone() for i, s in user.optimizer.state_dict()["state"].items()}
    Snapshots.taken = []
    report = verify_trainer(user)
    in_verify, Snapshots.taken = Snapshots.taken, []
    twin.train()
    assert exact(report), str(report)
    # the first group's rate, halved by the user's StepLR
    assert [r.lr for r in report.steps] == [0.1, 0.05, 0.025]
    assert len(in_verify) == len(Snapshots.taken) == 3
    assert all(torch.equal(a, b) for a, b in zip(in_verify, Snapshots.taken, strict=True))
    state = user.optimizer.state_dict()["state"]
    # the user's, untouched
    assert all(torch.equal(state[i]["momentum_buffer"], m) for i, m in momentum.items())


class StopAfter(TrainerCallback):
    """A stateful callback: counts the steps it saw on itself and stops training after ``n``."""

    def __init__(self, n: int):
        self.n, self.seen = n, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.seen += 1
        control.should_training_stop = self.seen >= self.n


def test_the_users_callbacks_run_in_the_copy_and_stay_untouched(tmp_path):
    stop = StopAfter(1)
    report = verify_trainer(llama_trainer(tmp_path, callbacks=[stop]))
    # the user's callback stopped the copy after one step
    assert [r.micro_batches for r in report.steps] == [4]
    assert stop.seen == 0  # the copy counted on its own copy of the callback


def test_the_users_compute_loss_func_is_what_the_copy_trains_with(tmp_path):
    """A compute_loss_func that divides by num_items_in_batch and then by k again (a loss divided twice):
    every step is 1/k of the true gradient, and verify must see it."""

    def twice_divided(outputs, labels, num_items_in_batch=None):
        ce = F.cross_entropy(outputs.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="sum")
        return ce / num_items_in_batch / K

    report = verify_trainer(llama_trainer(tmp_path, compute_loss_func=twice_divided))
    assert not report.ok and "misscaled" in report.codes, str(report)
    assert all(r.factor == pytest.approx(1 / K, rel=FLOAT32_RTOL) for r in report.steps), str(report)


def test_the_users_optimizer_class_and_kwargs_build_the_copys_optimizer(tmp_path):
    report = verify_trainer(llama_trainer(tmp_path, optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.3})))
    assert exact(report), str(report)
    # SGD at 0.3 under the Trainer's default linear decay over 3 steps (not AdamW at args.learning_rate)
    assert [r.lr for r in report.steps] == pytest.approx([0.3, 0.2, 0.1])


def test_the_users_item_losses_define_the_oracle(tmp_path):
    """Told that each item's loss is twice the token's cross-entropy, verify holds the Trainer's steps
    against that: each is half of it."""
    report = verify_trainer(
        llama_trainer(tmp_path), item_losses=lambda model, batch: 2 * causal_lm_losses(model, batch)
    )
    assert "misscaled" in report.codes, str(report)
    assert all(r.factor == pytest.approx(0.5, rel=FLOAT32_RTOL) for r in report.steps), str(report)


def test_label_smoothing_factor_is_counted_in_the_item_losses(tmp_path):
    """The Trainer smooths the labels (LabelSmoother, divided by num_items_in_batch): exact, held against
    item losses smoothed the same way (tests/test_hf_losses.py: they are LabelSmoother's, and unsmoothed
    ones are not)."""
    report = verify_trainer(llama_trainer(tmp_path, label_smoothing_factor=0.1))
    assert exact(report), str(report)


class Widths(Trainer):
    """Notes the width (longest sequence) of each micro-batch it trains on; on the class, so verify's copy,
    built as type(trainer), writes here too."""

    seen: list[int] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        Widths.seen.append(int(inputs["attention_mask"].sum(1).max()))
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.mark.parametrize("remove_unused_columns", [True, False], ids=["columns-removed", "columns-kept"])
def test_a_length_grouped_sampler_groups_as_the_users_trainer_does(remove_unused_columns, tmp_path):
    """train_sampling_strategy="group_by_length" over a datasets.Dataset with a "length" column: the
    Trainer drops unused columns before it builds its sampler, so with remove_unused_columns=True it
    groups by the sequences' own lengths, and only with False by the column. The column here is
    100 - length on purpose, so the two orders are opposite: LengthGroupedSampler puts each window's
    longest item first. Before the fix verify's copy read the column in both cases."""
    datasets = pytest.importorskip("datasets")
    seqs = token_sequences()
    data = datasets.Dataset.from_dict(
        {"input_ids": [s.tolist() for s in seqs], "length": [100 - len(s) for s in seqs]}
    )
    user = Widths(
        model=tiny_llama(),
        train_dataset=data,
        args=args_for(
            tmp_path, train_sampling_strategy="group_by_length", remove_unused_columns=remove_unused_columns
        ),
        data_collator=lambda items: collate([torch.tensor(i["input_ids"]) for i in items]),
    )
    Widths.seen = []
    report = verify_trainer(user)
    assert exact(report), str(report)
    # the first window: one mega-batch of k * B items, sorted by the sampler's lengths
    first = Widths.seen[:K]
    if remove_unused_columns:
        assert first == sorted(first, reverse=True) and first[0] == max(len(s) for s in seqs), Widths.seen
    else:
        assert first == sorted(first) and first[0] == min(len(s) for s in seqs), Widths.seen


# --- what the copy changes, and only in the copy ----------------------------------------------------


class Events(TrainerCallback):
    """Whether the copy evaluated or saved: on the class, so verify's copy of the callback writes here.
    At the end of training it writes a file into args.output_dir, as a user's callback may."""

    seen: list[str] = []

    def on_evaluate(self, args, state, control, **kwargs):
        Events.seen.append("evaluate")

    def on_save(self, args, state, control, **kwargs):
        Events.seen.append("save")

    def on_train_end(self, args, state, control, **kwargs):
        Path(args.output_dir, "events.txt").write_text(" ".join(Events.seen))


# what a user may set, which verify's copy turns off, and the copy's run is still one exact epoch
SETTINGS = {
    "num_train_epochs": dict(num_train_epochs=3),
    "dataloader_num_workers": dict(dataloader_num_workers=2),
    "neftune_noise_alpha": dict(neftune_noise_alpha=5.0),
    "eval_and_save": dict(eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_settings_the_copy_turns_off_leave_one_exact_epoch(setting, tmp_path, capsys):
    kw = SETTINGS[setting]
    user = llama_trainer(tmp_path / "out", callbacks=[Events()], eval_dataset=token_sequences(n=4), **kw)
    args, written = copy.deepcopy(user.args), set((tmp_path / "out").rglob("*"))
    Events.seen = []
    report = verify_trainer(user)
    assert exact(report), str(report)
    assert [r.micro_batches for r in report.steps] == ONE_EPOCH
    assert Events.seen == []  # no evaluation, no checkpoint
    assert dataclasses.asdict(user.args) == dataclasses.asdict(args)  # the user's arguments, as they were
    # nothing written in the user's output_dir, by any callback
    assert set((tmp_path / "out").rglob("*")) == written
    assert capsys.readouterr().out == ""  # nothing printed: no metrics line, no progress bar


@pytest.mark.parametrize("args_max_steps, max_steps", [(2, 3), (3, 2)])
def test_args_max_steps_and_max_steps_judge_the_smaller(args_max_steps, max_steps, tmp_path):
    user = llama_trainer(tmp_path, max_steps=args_max_steps)
    report = verify_trainer(user, max_steps=max_steps)
    assert [r.micro_batches for r in report.steps] == [4, 4]
    assert report.ok and report.codes == {"partial-run"}, str(report)
    assert user.args.max_steps == args_max_steps


def test_functional_dropout_is_off_in_the_copy_and_back_on_the_users_model(tmp_path):
    """Llama's attention draws its dropout from a float attribute (no nn.Dropout module): switched off
    in the copy, so the steps are exact, said in the report, and put back on the user's model."""
    model = tiny_llama()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    report = verify_trainer(llama_trainer(tmp_path, model))
    assert report.ok and report.codes == {"dropout"} and within_rounding(report), str(report)
    (note,) = report.findings
    assert "attention_dropout=0.1" in note.message, note.message
    assert model.config.attention_dropout == 0.1
    assert all(layer.self_attn.attention_dropout == 0.1 for layer in model.model.layers)


# --- refused before any work ------------------------------------------------------------------------


@pytest.fixture
def untouched(tmp_path, monkeypatch):
    """A user's Trainer that verify must refuse before it runs anything."""
    user = llama_trainer(tmp_path)
    before = [p.detach().clone() for p in user.model.parameters()]

    def refused(*a, **k):
        raise AssertionError("verify ran: the refusal came too late")

    monkeypatch.setattr("accumlib.hf.trainer.verify", refused)
    yield user
    assert all(torch.equal(a, b) for a, b in zip(before, user.model.parameters(), strict=True))
    assert user.state.global_step == 0


def test_data_parallel_over_two_gpus_is_refused(untouched, monkeypatch):
    monkeypatch.setattr(TrainingArguments, "n_gpu", property(lambda self: 2))  # 2 GPUs visible to one process
    with pytest.raises(ValueError, match=r"trainer.args.n_gpu must be 1: .*DataParallel.*\(got n_gpu=2\)"):
        verify_trainer(untouched)


def test_fsdp_in_the_trainers_args_is_refused(untouched):
    untouched.args.fsdp = ["full_shard"]  # as TrainingArguments(fsdp="full_shard") holds it under torchrun
    with pytest.raises(
        ValueError,
        match=r"trainer.args.fsdp must be unset: .*FSDP.*\(got trainer.args.fsdp=\['full_shard'\]\)",
    ):
        verify_trainer(untouched)


def test_an_optimizer_over_another_models_parameters_is_refused(untouched):
    untouched.optimizer = torch.optim.SGD(tiny_llama().parameters(), lr=0.1)
    with pytest.raises(
        ValueError, match=r"trainer.optimizer must hold only parameters of trainer.model \(got \d+ others\)"
    ):
        verify_trainer(untouched)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"train_dataset": None}, r"trainer.train_dataset must be set: .*\(got None\)"),
        ({"max_steps": True}, r"max_steps must be None or an integer >= 1 \(got True of type bool\)"),
        ({"max_steps": 0}, r"max_steps must be None or an integer >= 1 \(got 0\)"),
    ],
)
def test_arguments_verify_cannot_use_are_refused_by_name(untouched, change, message):
    kwargs = dict(change)
    if "train_dataset" in kwargs:
        untouched.train_dataset = kwargs.pop("train_dataset")
    with pytest.raises(ValueError, match=message):
        verify_trainer(untouched, **kwargs)
