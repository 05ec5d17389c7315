"""Which transformers classes the survey builds, how they are made tiny from their configs (offline),
the item losses they are judged with, and the Trainer each gets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from accumlib.batches import ItemLosses
from accumlib.checks import check_choice

from ..examples.data import IGNORE_INDEX, classify_collate, collate, labelled_sequences, token_sequences

VOCAB = 64
BATCH, K = 2, 4  # 22 sequences: 11 micro-batches, windows of 4, 4 and 3
MAX_PARAMS = 2_500_000  # "tiny": one epoch in about a second on one CPU thread
SECONDS_PER_MODEL = 120  # a class that takes longer is reported as an error, not waited for
LOSS_RTOL = 1e-5  # float32: the model's mean loss and ours sum the same ~40 terms in another order

# Config fields set for every class that has them (a class without one keeps its default)
TINY: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    n_embd=32,
    d_model=32,
    embed_dim=32,
    hidden_dim=32,
    word_embed_proj_dim=32,
    intermediate_size=64,
    n_inner=64,
    ffn_dim=64,
    num_attention_heads=2,
    n_head=2,
    num_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    n_positions=64,
    n_ctx=64,
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
    output_router_logits=False,
)
# classes whose configs tie sizes together in ways the generic shrink breaks
TINY_FOR: dict[str, dict[str, Any]] = {
    "codegen": dict(n_head=4, rotary_dim=4),  # heads split in 4 model-parallel groups; rotary within a head
    "gptj": dict(rotary_dim=8),
    "gpt_neo": dict(attention_types=[[["global"], 1]]),  # one entry per layer
    "rwkv": dict(num_hidden_layers=2),  # its init divides by num_hidden_layers - 1
    "mamba2": dict(num_heads=4, n_groups=1),  # hidden_size * expand == num_heads * head_dim
    "distilbert": dict(dim=32, hidden_dim=64),  # its own names for hidden_size and intermediate_size
}
RANDOM = ("dropout", "pdrop", "layerdrop", "jitter")  # float fields that make training-mode forwards random


def _tiny_value(name: str, value: Any) -> Any:
    """The value a config field gets in the tiny model: TINY's, else shrunk by its name's pattern."""
    if name in TINY:
        return TINY[name]
    if isinstance(value, float) and any(w in name for w in RANDOM):
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if name.endswith("layers") or name in ("n_layer", "num_layers"):
        return min(value, 1)
    if name.endswith("heads"):
        return min(value, 2)
    if name.endswith(("ffn_dim", "intermediate_size")):
        return min(value, 64)
    return value


def tiny_config(model_type: str, task: str = "causal-lm") -> Any:
    """The config of ``model_type`` with every size field it has made tiny, and randomness off."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    names = (
        [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(vars(default))
    )
    changes = {}
    for name in names:
        value = getattr(default, name, None)
        tiny = _tiny_value(name, value)
        if type(tiny) is not type(value) or tiny != value:
            changes[name] = tiny
    return cls(**changes | TINY_FOR.get(model_type, {}) | TASKS[task].config)


def tiny_model(model_type: str, task: str = "causal-lm", seed: int = 0) -> torch.nn.Module:
    """The ``task`` class of ``model_type`` (transformers' auto mapping), built tiny from its config.
    Refuses one that is not tiny (counted on the meta device first, so nothing large is allocated)."""
    import transformers

    cls = getattr(transformers, model_mapping(task)[model_type])
    config = tiny_config(model_type, task)
    with torch.device("meta"):
        n = sum(p.numel() for p in cls(config).parameters())
    if n > MAX_PARAMS:
        raise NotTiny(f"{n:,} parameters from its config shrunk (more than {MAX_PARAMS:,})")
    torch.manual_seed(seed)
    return cls(config)


class NotTiny(ValueError):
    """The class cannot be built tiny from its config."""


def shifted_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from accumlib.hf import causal_lm_losses

    return causal_lm_losses(model, batch)


def unshifted_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every label at its own position (a model whose loss does not shift)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    targets = batch["labels"].reshape(-1)
    ce = F.cross_entropy(
        logits.reshape(targets.numel(), -1), targets, reduction="none", ignore_index=IGNORE_INDEX
    )
    return ce[targets != IGNORE_INDEX]


def per_sequence_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from accumlib.hf import sequence_classification_losses

    return sequence_classification_losses(model, batch)


@dataclass(frozen=True)
class Task:
    """What a survey trains: the auto mapping of its classes, its data, and the item losses a
    model's own loss may average (the first that matches is the one judged against)."""

    title: str
    mapping: str  # the name of the mapping in transformers.models.auto.modeling_auto
    data: Callable[[], list]
    collate: Callable[[list], dict]
    item_losses: dict[str, ItemLosses]
    config: dict[str, Any]


TASKS = {
    "causal-lm": Task(
        "causal-LM",
        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
        lambda: token_sequences(vocab=VOCAB),
        collate,
        {"shifted": shifted_losses, "unshifted": unshifted_losses},
        {},
    ),
    "sequence-classification": Task(
        "sequence-classification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        lambda: labelled_sequences(vocab=VOCAB),
        classify_collate,
        {"per sequence": per_sequence_losses},
        {"num_labels": 3},
    ),
}


def task_spec(task: str) -> Task:
    return TASKS[check_choice("task", task, tuple(TASKS))]


def model_mapping(task: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, task_spec(task).mapping)


def own_item_losses(model: torch.nn.Module, task: str = "causal-lm") -> str:
    """Which of the task's item losses the model's own ``loss`` is the mean of, on the first
    micro-batch in training mode; raises ``ValueError`` when none, or when two identical forwards
    differ (a random training-mode forward cannot be compared exactly)."""
    t = task_spec(task)
    batch = t.collate(t.data()[:BATCH])
    was = model.training
    model.train()
    try:
        with torch.no_grad():
            own = [float(model(**batch).loss) for _ in range(2)]
            if own[0] != own[1]:
                raise ValueError(
                    f"its training-mode loss is random (two identical forwards: {own[0]:.6g}, {own[1]:.6g})"
                )
            means = {name: float(fn(model, batch).double().mean()) for name, fn in t.item_losses.items()}
    finally:
        model.train(was)
    for name, mean in means.items():
        if abs(mean - own[0]) <= LOSS_RTOL * abs(own[0]):
            return name
    said = " nor ".join(f"the {name} ({mean:.6g})" for name, mean in means.items())
    raise ValueError(
        f"its loss ({own[0]:.6g}) is the mean of neither {said} cross-entropy"
        if len(means) > 1
        else f"its loss ({own[0]:.6g}) is not the mean of {said} cross-entropy"
    )


def trainer_for(model: torch.nn.Module, output_dir: str, task: str = "causal-lm", **overrides: Any) -> Any:
    """The Trainer every class gets: micro-batches of 2, k = 4, one epoch, no clipping, seed 0."""
    from transformers import Trainer, TrainingArguments

    t = task_spec(task)
    args = dict(
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        max_grad_norm=0.0,
        seed=0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    args |= overrides
    return Trainer(
        model=model,
        args=TrainingArguments(output_dir=output_dir, **args),
        train_dataset=t.data(),
        data_collator=t.collate,
    )
