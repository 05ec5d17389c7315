"""accumlib.hf's item losses against transformers' own: each model's loss (and the Trainer's
LabelSmoother) is the mean of the item losses verify_trainer holds its steps against, for every kind
of sequence classification, with label smoothing, under bf16, and after PEFT's virtual tokens.
Tiny models built from configs, nothing downloaded; no Trainer runs here.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: tiny models need no hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from accumlib.tolerances import FLOAT32_RTOL  # noqa: E402
from accumlib_course.examples.data import collate, token_sequences  # noqa: E402

transformers = pytest.importorskip("transformers", reason="transformers is in the hf and test extras")
from transformers import LlamaConfig, LlamaForSequenceClassification  # noqa: E402
from transformers.trainer_pt_utils import LabelSmoother  # noqa: E402

from accumlib.hf import causal_lm_losses, default_item_losses, sequence_classification_losses  # noqa: E402
from accumlib_course.examples.hf_tiny import tiny_llama  # noqa: E402

N = 6  # sequences per batch
# float32 losses averaged in a different order than transformers' own reduction: ~1e-7 apart
SAME_LOSS_RTOL = 1e-6


def classifier(num_labels: int, problem_type: str | None = None) -> LlamaForSequenceClassification:
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
            num_labels=num_labels,
            problem_type=problem_type,
        )
    ).eval()


def inputs() -> dict:
    batch = collate(token_sequences()[:N])
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


g = torch.Generator().manual_seed(3)
LABELS = {  # name: (num_labels, config.problem_type, labels, items)
    "single-label": (3, None, torch.randint(0, 3, (N,), generator=g), N),
    "single-label, one label -100": (3, None, torch.tensor([0, 2, -100, 1, 1, 0]), N - 1),
    "regression": (1, None, torch.randn(N, generator=g), N),
    "regression, 3 outputs": (3, "regression", torch.randn(N, 3, generator=g), N),
    "multi-label": (3, None, torch.randint(0, 2, (N, 3), generator=g).float(), N),
}


@pytest.mark.parametrize("kind", LABELS)
def test_sequence_classification_losses_average_to_the_models_own_loss(kind):
    """One loss per sample whose mean is the model's own loss: squared errors and binary cross-entropies
    averaged over a sample's outputs (the model averages over every element), -100 samples skipped."""
    num_labels, problem, labels, items = LABELS[kind]
    model = classifier(num_labels, problem)
    batch = inputs() | {"labels": labels}
    with torch.no_grad():
        # before the model's loss, which writes problem_type
        losses = sequence_classification_losses(model, batch)
        own = model(**batch).loss
    assert losses.shape == (items,)
    assert float(losses.mean()) == pytest.approx(float(own), rel=SAME_LOSS_RTOL)


def test_a_multi_output_loss_summed_over_the_outputs_would_differ():
    """The negative case: a per-sample sum over 3 outputs is 3x the mean, far outside the tolerance above."""
    model = classifier(3, "regression")
    batch = inputs() | {"labels": LABELS["regression, 3 outputs"][2]}
    with torch.no_grad():
        per_sample = (model(**inputs()).logits - batch["labels"]).pow(2).sum(-1)
        assert float(per_sample.mean()) != pytest.approx(float(model(**batch).loss), rel=0.5)


def test_label_smoothing_matches_the_trainers_label_smoother():
    """TrainingArguments.label_smoothing_factor makes the Trainer compute LabelSmoother's loss: for a causal
    LM over the shifted tokens, for a classifier over the samples. Its mean is the smoothed item losses'
    mean (the default item losses too), and not the unsmoothed one."""
    eps = 0.1
    smoother = LabelSmoother(epsilon=eps)
    lm, clf = tiny_llama().eval(), classifier(3)
    lm_batch = collate(token_sequences()[:N])
    clf_batch = inputs() | {"labels": LABELS["single-label"][2]}
    with torch.no_grad():
        for model, batch, shift in ((lm, lm_batch, True), (clf, clf_batch, False)):
            theirs = float(smoother(model(**batch), batch["labels"], shift_labels=shift))
            default = default_item_losses(model, eps)(model, batch)
            assert float(default.mean()) == pytest.approx(theirs, rel=SAME_LOSS_RTOL), type(model).__name__
            # an untrained model is near uniform, so smoothing moves the mean loss little (~5e-4), yet 100x
            # the tolerance
            assert float(default_item_losses(model)(model, batch).mean()) != pytest.approx(
                theirs, rel=100 * SAME_LOSS_RTOL
            )
        assert float(causal_lm_losses(lm, lm_batch, label_smoothing=eps).mean()) == pytest.approx(
            float(smoother(lm(**lm_batch), lm_batch["labels"], shift_labels=True)), rel=SAME_LOSS_RTOL
        )
        assert float(
            sequence_classification_losses(clf, clf_batch, label_smoothing=eps).mean()
        ) == pytest.approx(float(smoother(clf(**clf_batch), clf_batch["labels"])), rel=SAME_LOSS_RTOL)


def test_a_bf16_models_token_losses_are_computed_in_float32():
    """transformers upcasts a bf16 model's logits before its cross-entropy; the item losses must too (a bf16
    cross-entropy is ~1e-2 off, bf16's 8 mantissa bits)."""
    model = tiny_llama().to(torch.bfloat16).eval()
    batch = collate(token_sequences()[:N])
    with torch.no_grad():
        losses = causal_lm_losses(model, batch)
        own = model(**batch).loss
    assert losses.dtype == torch.float32
    assert float(losses.mean()) == pytest.approx(float(own), rel=FLOAT32_RTOL)


def test_shift_labels_after_prompt_tuning_score_the_real_positions():
    """A padding-free batch (shift_labels, aligned with the inputs) on a prompt-tuning model: the V
    virtual positions come first in the logits, so shift label t is scored at logit row V + t."""
    peft = pytest.importorskip("peft", reason="peft is in the test extra")
    v = 5
    model = peft.get_peft_model(
        tiny_llama(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=v)
    ).eval()
    batch = collate(token_sequences()[:N])
    shifted = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        losses = causal_lm_losses(
            model,
            {
                "input_ids": batch["input_ids"],
                "attention_mask": batch["attention_mask"],
                "shift_labels": shifted,
            },
        )
        logits = (
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, v:].float()
        )
    targets = shifted.flatten()
    expected = F.cross_entropy(logits.flatten(0, 1), targets, reduction="none", ignore_index=-100)[
        targets != -100
    ]
    assert losses.shape == expected.shape
    assert torch.allclose(losses, expected, rtol=SAME_LOSS_RTOL, atol=0)
