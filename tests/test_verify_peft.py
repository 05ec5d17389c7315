"""accumlib.hf.verify_trainer on PEFT adapters (peft 0.21) under the transformers Trainer.

Prompt tuning and p-tuning prepend V virtual tokens (and V labels of -100): the model's loss then
scores every labelled token, the first one predicted from the last virtual token, N items for S
sequences, while the Trainer divides by the N - S labels it counts after the shift. The counts are
taken from the micro-batches the Trainer received, independently of verify.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _trainers import recording, windows_of  # noqa: E402

from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402

peft = pytest.importorskip("peft", reason="peft is in the test extra")
from transformers import Trainer, TrainingArguments  # noqa: E402

from accumlib.hf import causal_lm_losses, verify_trainer, virtual_tokens  # noqa: E402
from accumlib_course.examples.hf_tiny import tiny_llama  # noqa: E402

B, V = 2, 5  # micro-batches of 2 sequences; 5 virtual tokens
ADAPTERS = {
    "prompt-tuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V),
    "p-tuning": lambda: peft.PromptEncoderConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=V, encoder_hidden_size=16
    ),
    "prefix-tuning": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V),
    "lora": lambda: peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"]),
}


Recording = recording(Trainer)


@pytest.fixture
def recorded():
    with windows_of(Recording) as windows:
        yield windows


def adapted(name):
    return peft.get_peft_model(tiny_llama(), ADAPTERS[name]())


def trainer(model, out, k):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=k,
        num_train_epochs=1,
        max_steps=3,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
    )
    return Recording(model=model, args=args, train_dataset=token_sequences(), data_collator=collate)


@pytest.mark.parametrize("name", ADAPTERS)
def test_causal_lm_losses_average_to_the_adapted_models_own_loss(name):
    """The items are what the PEFT model's own loss averages: with prompt learning every labelled
    token (N = labels != -100), otherwise every token after the first (the usual shift)."""
    model = adapted(name).eval()
    batch = collate(token_sequences()[:3])
    with torch.no_grad():
        losses = causal_lm_losses(model, batch)
        own = model(**batch).loss
    prompt = name in ("prompt-tuning", "p-tuning")
    assert virtual_tokens(model) == (V if prompt else 0)
    assert losses.numel() == int((batch["labels"][:, int(not prompt) :] != -100).sum())
    assert float(losses.mean()) == pytest.approx(float(own), rel=FLOAT32_RTOL)


@pytest.mark.parametrize("k", [4, 1])
@pytest.mark.parametrize("name", ["prompt-tuning", "p-tuning"])
def test_prompt_learning_is_misscaled_by_the_virtual_tokens(name, k, tmp_path, recorded):
    """c = N/(N - S) at every step, with or without accumulation: N labelled tokens (all scored,
    the first from the last virtual token), S sequences, counted from the Trainer's micro-batches."""
    model = adapted(name)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    report = verify_trainer(trainer(model, tmp_path, k))
    windows = [(sum(int((y != -100).sum()) for y in w), sum(len(y) for y in w)) for w in recorded if w]
    assert "misscaled" in report.codes and len(report.steps) == len(windows) == 3, str(report)
    for row, (n, s) in zip(report.steps, windows, strict=True):
        assert row.items == n
        assert row.factor == pytest.approx(n / (n - s), rel=FLOAT32_RTOL), (
            row,
            n,
            s,
        )  # a float32 fit: ~1e-6 off
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", ["lora", "prefix-tuning"])
def test_lora_and_prefix_tuning_are_exact(name, tmp_path):
    model = adapted(name)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    report = verify_trainer(trainer(model, tmp_path, 4))
    # partial: max_steps=3 of 3 windows + a tail
    assert report.codes == {"partial-run"} and report.ok, str(report)
    assert max(r.rel_error for r in report.steps) <= FLOAT32_RTOL, str(report)
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_logit_length_that_matches_no_label_is_refused_by_name():
    class Longer(torch.nn.Module):  # one logit row too many, and no PEFT config to explain it
        weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None):
            return {"logits": F.pad(torch.zeros(*input_ids.shape, 4), (0, 0, 1, 0)) + self.weight}

    batch = collate(token_sequences()[:2])
    with pytest.raises(
        ValueError, match=r"causal_lm_losses needs one logit row per label .* from Longer; pass item_losses"
    ):
        causal_lm_losses(Longer(), batch)
