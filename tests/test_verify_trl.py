"""accumlib.hf.verify_trainer on real TRL trainers (trl 1.16), tiny models and tokenizers built offline.

Each window's predicted tokens N and sequences S are counted from the micro-batches the trainer's
own ``training_step`` received (a subclass records them), independently of verify, so a claimed
factor is checked against numbers verify never computed.
"""

from __future__ import annotations

import copy
import os
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from _trainers import recording, windows_of  # noqa: E402

import accumlib  # noqa: E402
from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402

trl = pytest.importorskip("trl", reason="trl is in the test extra")
datasets = pytest.importorskip("datasets")
from peft import LoraConfig  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from accumlib.hf import verify_trainer  # noqa: E402
from accumlib_course.examples.hf_tiny import (  # noqa: E402
    tiny_gpt2,
    tiny_llama,
    tiny_prompt_completions,
    tiny_texts,
    tiny_tokenizer,
)

# 14 texts in micro-batches of 2, k = 4: windows of 4 and 3 micro-batches (the last one short)
K, B = 4, 2
# a float32 fitted scale lands within ~1e-6 of the factor; N/(N+S) neighbours differ by >= 1e-4
SCALE_RTOL = 1e-5


Recording = recording(trl.SFTTrainer)


@pytest.fixture
def recorded():
    with windows_of(Recording) as windows:
        yield windows


def counts(windows) -> list[tuple[int, int]]:
    """(N predicted tokens, S sequences) of each stepped window, from the labels the trainer saw."""
    return [(sum(int((y[:, 1:] != -100).sum()) for y in w), sum(len(y) for y in w)) for w in windows if w]


def sft(model, out, data=None, peft_config=None, **kw):
    args = trl.SFTConfig(
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
        bf16=False,
        gradient_checkpointing=False,
        **kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Recording(
            model=model,
            args=args,
            train_dataset=datasets.Dataset.from_dict(data or tiny_texts()),
            processing_class=tiny_tokenizer(),
            peft_config=peft_config,
        )


VARIANTS = {  # name: (SFTTrainer arguments, dataset)
    "plain": ({}, None),
    "completion-only": ({}, tiny_prompt_completions()),
    "packing": ({"packing": True, "max_length": 16}, None),  # BFD packing: padding-free rows
    "padding-free": ({"padding_free": True, "max_length": None}, None),
    "lora": (
        {"peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")},
        None,
    ),
}


def state(trainer) -> dict:
    return {
        "params": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "data": trainer.train_dataset.to_dict(),
        "forward": trainer.model.forward,
    }


def unchanged(trainer, before: dict) -> None:
    """The user's trainer, model and dataset are as they were: no step taken, no .grad, no hook."""
    after = trainer.model.state_dict()
    assert before["params"].keys() == after.keys() and all(
        torch.equal(before["params"][k], after[k]) for k in after
    )
    assert all(p.grad is None for p in trainer.model.parameters())
    assert not trainer.model._forward_pre_hooks and trainer.model.forward == before["forward"]
    assert trainer.state.global_step == 0 and trainer.optimizer is None
    assert trainer.train_dataset.to_dict() == before["data"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_sft_on_llama_is_exact(variant, tmp_path, recorded):
    kw, data = VARIANTS[variant]
    t = sft(tiny_llama(), tmp_path, data, **kw)
    before = state(t)
    report = verify_trainer(t)
    assert report.ok and not report.codes, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    # verify's items are the trainer's tokens
    assert [r.items for r in report.steps] == [n for n, _ in counts(recorded)]
    assert report.items_stepped == report.items_total
    unchanged(t, before)


def test_sft_on_gpt2_is_misscaled_by_its_label_count(tmp_path, recorded):
    """The Trainer counts GPT-2's labels before the shift (loss_type None): N + S, while TRL's fused
    head sums N token losses. Each step is c = N/(N+S), N and S from the trainer's own inputs."""
    t = sft(tiny_gpt2(), tmp_path)
    before = state(t)
    report = verify_trainer(t)
    windows = counts(recorded)
    # dropout: GPT-2's summary_first_dropout, unused here
    assert report.codes == {"misscaled", "dropout"}, str(report)
    assert len(windows) == len(report.steps) == 2
    for row, (n, s) in zip(report.steps, windows, strict=True):
        assert row.items == n
        assert row.factor == pytest.approx(n / (n + s), rel=SCALE_RTOL), (row, n, s)
        assert row.rel_error > 0.05
    (found,) = [f for f in report.findings if f.code == "misscaled"]
    assert "N/(N+S)" in found.message
    unchanged(t, before)


@pytest.mark.parametrize("twin", ["loss_type", "completion-only", "padding-free"])
def test_sft_on_gpt2_twins_that_count_right_are_exact(twin, tmp_path):
    """The correct twins: told its loss type, GPT-2's labels are counted after the shift; with the
    prompt masked (or padding-free's -100 at each sequence start) position 0 is never counted."""
    model = tiny_gpt2()
    if twin == "loss_type":
        model.loss_type = "ForCausalLM"
    kw, data = {
        "completion-only": ({}, tiny_prompt_completions()),
        "padding-free": ({"padding_free": True, "max_length": None}, None),
    }.get(twin, ({}, None))
    report = verify_trainer(sft(model, tmp_path, data, **kw))
    assert report.ok and "misscaled" not in report.codes, str(report)
    assert all(r.factor == pytest.approx(1.0, rel=FLOAT32_RTOL) for r in report.steps)


def test_dpo_is_refused_by_name_before_it_runs(tmp_path):
    data = tiny_prompt_completions()
    pairs = datasets.Dataset.from_dict(
        {
            "prompt": data["prompt"],
            "chosen": [" " + c for c in data["completion"]],
            "rejected": [" " + c for c in reversed(data["completion"])],
        }
    )
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=K,
        use_cpu=True,
        report_to=[],
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trl.DPOTrainer(
            model=tiny_llama(),
            ref_model=tiny_llama(seed=1),
            args=args,
            train_dataset=pairs,
            processing_class=tiny_tokenizer(),
        )
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    with pytest.raises(
        TypeError,
        match=r"trainer must be .*SFTTrainer.*\(got trl DPOTrainer: .*preference pairs.*accumlib.verify",
    ):
        verify_trainer(t)
    assert (
        all(torch.equal(before[k], v) for k, v in t.model.state_dict().items()) and t.state.global_step == 0
    )


def test_a_forward_patched_on_the_instance_never_reaches_the_users_model():
    """TRL replaces model.forward on the instance by a closure over the original bound forward. A
    plain deepcopy keeps that closure: its forward runs the user's weights and writes the user's
    .grad (shown first, so this test would fail on such a copy). verify's copy and oracle must not."""
    model = tiny_llama()
    add_fused_lm_head(model)  # what SFTTrainer.__init__ does to the user's model
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "labels": torch.tensor([[5, 6, 7, 8]])}
    copy.deepcopy(model)(**batch).loss.backward()
    assert any(p.grad is not None for p in model.parameters())  # the naive copy leaked into the user's model
    model.zero_grad(set_to_none=True)

    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    texts = [torch.tensor(t) for t in tiny_tokenizer()(tiny_texts(n=6)["text"]).input_ids]

    def collate(seqs):
        from accumlib_course.examples.data import collate as pad

        return pad(seqs)

    def train(net, optimizer, loader):  # a correct window loop that calls the fused head, as SFTTrainer does
        batches = list(loader)
        n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        for b in batches:
            net(**b, fused_lm_head=True, num_items_in_batch=n).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    report = accumlib.verify(
        train,
        model=model,
        dataset=texts,
        item_losses=accumlib.hf.causal_lm_losses,
        accum_steps=3,
        batch_size=2,
        collate_fn=collate,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    )
    assert report.ok and max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    assert all(p.grad is None for p in model.parameters()), "verify wrote the user's .grad"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), (
        "verify changed the user's weights"
    )
    assert opt.state_dict()["state"] == {}
