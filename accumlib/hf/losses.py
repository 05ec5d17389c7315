"""The item losses a Hugging Face model's loss averages over: one per predicted token of a causal LM
(PEFT adapters included), one per sample of a sequence classifier, and the default for a model.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..batches import ItemLosses

IGNORE_INDEX = -100  # the label transformers' losses skip (padding, prompt tokens)
# keys of a Trainer batch that are targets or loss arguments, not inputs of the forward
NOT_INPUTS = ("labels", "shift_labels", "num_items_in_batch")
# PEFT prompt-learning methods that prepend no embeddings: their virtual tokens live in the attention cache
CACHE_PROMPTS = ("PREFIX_TUNING", "CARTRIDGE")


def _logits(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    out = model(**{k: v for k, v in batch.items() if k not in NOT_INPUTS})
    return (out["logits"] if isinstance(out, Mapping) else out[0]).float()


def virtual_tokens(model: torch.nn.Module) -> int:
    """How many positions a PEFT prompt-learning adapter prepends to the logits (prompt tuning,
    p-tuning); 0 for any other model, LoRA and prefix tuning included (prefix tuning's virtual
    tokens sit in the attention cache, not in the logits).

    >>> virtual_tokens(torch.nn.Linear(2, 1))
    0
    """
    config = getattr(model, "active_peft_config", None)
    if config is None or not getattr(config, "is_prompt_learning", False):
        return 0
    if str(getattr(config.peft_type, "value", config.peft_type)) in CACHE_PROMPTS:
        return 0
    return int(config.num_virtual_tokens)


def causal_lm_losses(
    model: torch.nn.Module, batch: Mapping[str, Any], *, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Cross-entropy of every predicted token of a causal LM batch: ``[n_tokens]``.

    Position t predicts label t + 1 (the shift transformers' ``ForCausalLMLoss`` makes), so a
    sequence of L labelled tokens has L - 1 items; labels of -100 (padding) are none. A batch with
    ``shift_labels`` (padding-free collators) is taken as already shifted.
    ``label_smoothing`` is ``TrainingArguments.label_smoothing_factor``.

    A PEFT prompt-tuning or p-tuning model prepends V virtual tokens to every sequence, and PEFT
    labels them -100: the virtual positions are not items, but the last one predicts the first
    real token, so a sequence of L labelled tokens has L items there (what the model's own loss sums).

    >>> import torch
    >>> class Uniform(torch.nn.Module):  # logits over 4 tokens, all equal
    ...     def forward(self, input_ids, attention_mask=None):
    ...         return {"logits": torch.zeros(*input_ids.shape, 4)}
    >>> batch = {"input_ids": torch.tensor([[1, 2, 3], [1, 2, 0]]),
    ...          "labels": torch.tensor([[1, 2, 3], [1, 2, -100]])}
    >>> causal_lm_losses(Uniform(), batch)  # 2 + 1 predicted tokens, each -log(1/4)
    tensor([1.3863, 1.3863, 1.3863])
    """
    logits = _logits(model, batch)
    v = virtual_tokens(model)
    if "shift_labels" in batch:
        targets = F.pad(batch["shift_labels"], (v, 0), value=IGNORE_INDEX)
    else:
        # what PEFT does to the labels it passes on
        labels = F.pad(batch["labels"], (v, 0), value=IGNORE_INDEX)
        logits, targets = logits[:, :-1], labels[:, 1:]
    if logits.shape[:2] != targets.shape[:2]:
        raise ValueError(
            f"causal_lm_losses needs one logit row per label (after {v} virtual tokens): got logits of "
            f"shape {tuple(logits.shape)} for labels of shape {tuple(targets.shape)} from "
            f"{type(model).__name__}; pass item_losses for a model that adds or drops positions"
        )
    targets = targets.reshape(-1).to(logits.device)
    ce = F.cross_entropy(
        logits.reshape(targets.numel(), -1),
        targets,
        reduction="none",
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )
    return ce[targets != IGNORE_INDEX]


def sequence_classification_losses(
    model: torch.nn.Module, batch: Mapping[str, Any], *, label_smoothing: float = 0.0
) -> torch.Tensor:
    """One loss per sample of a sequence-classification batch: ``[n_samples]``, as transformers'
    ``ForSequenceClassificationLoss`` computes it (``config.problem_type``, else inferred the same
    way): cross-entropy (labels of -100 skipped), squared error for regression, and binary
    cross-entropy averaged over the labels for multi-label.

    >>> import torch
    >>> class Even(torch.nn.Linear):  # logits over 2 classes, all equal
    ...     def forward(self, input_ids, attention_mask=None):
    ...         return {"logits": torch.zeros(input_ids.shape[0], 2)}
    >>> batch = {"input_ids": torch.ones(3, 5, dtype=torch.long), "labels": torch.tensor([0, 1, 1])}
    >>> sequence_classification_losses(Even(1, 1), batch)  # each -log(1/2)
    tensor([0.6931, 0.6931, 0.6931])
    """
    logits, labels = _logits(model, batch), batch["labels"].to(_device(model))
    config = getattr(model, "config", None)
    n_labels = logits.shape[-1]
    problem = getattr(config, "problem_type", None)
    if problem is None:  # the rule of ForSequenceClassificationLoss, without writing it into the config
        problem = (
            "regression"
            if n_labels == 1
            else "single_label_classification"
            if labels.dtype in (torch.long, torch.int)
            else "multi_label_classification"
        )
    if problem == "regression":
        diff = (logits.squeeze(-1) - labels.float()) if n_labels == 1 else (logits - labels.float())
        return diff.pow(2) if n_labels == 1 else diff.pow(2).mean(-1)
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(-1)
    labels = labels.reshape(-1)
    ce = F.cross_entropy(
        logits.reshape(labels.numel(), n_labels),
        labels,
        reduction="none",
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )
    return ce[labels != IGNORE_INDEX]


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _class_names(mapping: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for v in mapping.values():
        names |= {v} if isinstance(v, str) else set(v)
    return names


def default_item_losses(model: torch.nn.Module, label_smoothing: float = 0.0) -> ItemLosses:
    """``causal_lm_losses`` for a causal LM, ``sequence_classification_losses`` for sequence
    classification (by the model's class, as transformers' auto classes list them; a PEFT model by
    the class it wraps); anything else has no default, and the error says to pass ``item_losses``.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> tiny = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=16, vocab_size=64))
    >>> default_item_losses(tiny).__name__
    'causal_lm_losses'
    >>> default_item_losses(torch.nn.Linear(2, 1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: item_losses must be given ...
    """
    from transformers.models.auto import modeling_auto as auto

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    name = type(base).__name__
    for names, suffix, losses in (
        (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "ForCausalLM", causal_lm_losses),
        (
            auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
            "ForSequenceClassification",
            sequence_classification_losses,
        ),
    ):
        if name in _class_names(names) or name.endswith(suffix):
            return functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing else losses
    raise ValueError(
        "item_losses must be given for a model that is neither a causal LM nor a sequence classifier "
        f"(got {name}): item_losses(model, batch) returns one loss per item the Trainer's loss averages "
        "over, e.g. accumlib.hf.causal_lm_losses"
    )


__all__ = ["causal_lm_losses", "default_item_losses", "sequence_classification_losses", "virtual_tokens"]
