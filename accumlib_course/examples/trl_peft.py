"""Three accumulation bugs in TRL and PEFT runs (lesson 9), on tiny models and a tokenizer built offline.

``BUGS`` is the table: each library, its factor and where the cause sits (paths under
site-packages, checked on trl 1.16.0, peft 0.21.2, transformers 5.23.0; see
``docs/trl-peft-bugs.md``). Each trainer below is built as a user would configure it, with
k = 4 micro-batches of 2 and a dataset that micro-batches of 2 divide, so a window of m
micro-batches holds S = 2m sequences:

- ``sft_gpt2``: TRL's ``SFTTrainer`` on GPT-2, every step c = N/(N+S) of the true gradient;
- ``prompt_tuning``: PEFT prompt tuning under the Trainer, every step c = N/(N-S);
- ``dpo``: TRL's ``DPOTrainer``, which ``verify_trainer`` refuses by name; ``dpo_windows`` follows
  its own loop instead and compares each window's gradient with the true one and with the mean of
  its micro-batch means (each pair's loss from the trainer's own ``compute_loss``).

    >>> from accumlib.hf import verify_trainer
    >>> from accumlib_course.examples import trl_peft
    >>> sorted(verify_trainer(trl_peft.sft_gpt2()).codes)          # doctest: +SKIP
    ['dropout', 'misscaled']
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import torch

K, BATCH = 4, 2  # gradient_accumulation_steps, per_device_train_batch_size
V = 5  # prompt tuning's virtual tokens


@dataclass(frozen=True)
class LibraryBug:
    library: str
    what: str
    factor: str
    cause: str


BUGS = {
    "sft-gpt2": LibraryBug(
        "trl",
        "SFTTrainer on GPT-2 (full-sequence loss)",
        "c = N/(N+S)",
        "trl/trainer/sft_trainer.py:1612-1618 divides N shifted token losses by the Trainer's "
        "num_items_in_batch, which transformers/trainer.py:2298 counts unshifted (N + S labels) for a model "
        "whose loss_type is None (_loss_shifts_labels, trainer.py:543)",
    ),
    "prompt-tuning": LibraryBug(
        "peft",
        "prompt tuning (and p-tuning) under the transformers Trainer",
        "c = N/(N-S)",
        "peft/peft_model.py:2166-2167 prepends V labels of -100, so the last virtual token predicts each "
        "sequence's first token and the loss sums N terms; transformers/trainer.py:2331 counts N - S labels "
        "after the shift",
    ),
    "dpo": LibraryBug(
        "trl",
        "DPOTrainer with a short last micro-batch",
        "mean of micro-batch means",
        "trl/trainer/dpo_trainer.py:1528 returns each micro-batch's mean pair loss and ignores "
        "num_items_in_batch; transformers/trainer.py:2111 divides it by the window's micro-batch count "
        "(trainer.py:1877)",
    ),
}


def versions() -> dict[str, str]:
    """The installed versions of the libraries the bugs live in."""
    return {name: version(name) for name in ("trl", "peft", "transformers")}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No progress bars from datasets' map (TRL tokenises with it) and no library advice, put back after."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if bars:
            datasets.enable_progress_bars()


def _run_args() -> dict[str, Any]:
    return dict(
        output_dir=tempfile.mkdtemp(prefix="accumlib-lesson9-"),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=K,
        num_train_epochs=1,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        seed=0,
    )


def sft_gpt2(n_texts: int = 14) -> Any:
    """TRL's ``SFTTrainer`` on a tiny GPT-2 over ``n_texts`` plain texts (windows of 4 and 3
    micro-batches)."""
    import datasets
    import trl

    from .hf_tiny import tiny_gpt2, tiny_texts, tiny_tokenizer

    args = trl.SFTConfig(**_run_args(), bf16=False, gradient_checkpointing=False)
    with quiet():
        return trl.SFTTrainer(
            model=tiny_gpt2(),
            args=args,
            train_dataset=datasets.Dataset.from_dict(tiny_texts(n_texts)),
            processing_class=tiny_tokenizer(),
        )


def prompt_tuning(n_sequences: int = 22) -> Any:
    """The transformers ``Trainer`` on a tiny Llama with PEFT prompt tuning (V virtual tokens),
    ``n_sequences`` token sequences (windows of 4, 4 and 3 micro-batches)."""
    import peft
    from transformers import Trainer, TrainingArguments

    from .data import collate, token_sequences
    from .hf_tiny import tiny_llama

    model = peft.get_peft_model(
        tiny_llama(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V)
    )
    return Trainer(
        model=model,
        args=TrainingArguments(**_run_args()),
        train_dataset=token_sequences(n_sequences),
        data_collator=collate,
    )


def factors(report: Any, s_sign: int) -> list[tuple[int, int, int, float, float]]:
    """Per step: (step, N items, S sequences, N/(N + s_sign S), the fitted c). S = BATCH per micro-batch: the
    datasets above hold a multiple of BATCH items, so every micro-batch is full."""
    rows = []
    for r in report.steps:
        s = BATCH * r.micro_batches
        rows.append((r.step, r.items, s, r.items / (r.items + s_sign * s), r.factor))
    return rows


def preference_pairs(n: int = 11, seed: int = 0) -> dict[str, list[str]]:
    """``n`` seeded (prompt, chosen, rejected) triples of 1 to 6 words; completions start with a space, so
    prompt + completion splits into the same words."""
    from .hf_tiny import WORDS

    rng = random.Random(seed)
    words = lambda: " ".join(f"w{rng.randrange(WORDS)}" for _ in range(rng.randint(1, 6)))  # noqa: E731
    return {
        k: [("" if k == "prompt" else " ") + words() for _ in range(n)]
        for k in ("prompt", "chosen", "rejected")
    }


def dpo(n_pairs: int = 11) -> Any:
    """TRL's ``DPOTrainer`` on a tiny Llama (reference: another seed) over ``n_pairs`` pairs: with 11, windows
    of micro-batches holding [2, 2, 2, 2] and [2, 1] pairs."""
    import datasets
    import trl
    from transformers import PrinterCallback

    from .hf_tiny import tiny_llama, tiny_tokenizer

    args = trl.DPOConfig(**_run_args(), bf16=False, gradient_checkpointing=False)
    with quiet():
        trainer = trl.DPOTrainer(
            model=tiny_llama(seed=0),
            ref_model=tiny_llama(seed=1),
            args=args,
            train_dataset=datasets.Dataset.from_dict(preference_pairs(n_pairs)),
            processing_class=tiny_tokenizer(),
        )
    trainer.remove_callback(PrinterCallback)  # its end-of-training metrics line is not the lesson
    return trainer


@dataclass(frozen=True)
class DPOWindow:
    pairs: list[int]  # pairs per micro-batch
    rel_error: float  # |G - g*| / |g*|, g* the gradient of the window's mean pair loss
    from_mean_of_means: float  # |G - mean of micro-batch means| / |g*|


def dpo_windows(trainer: Any) -> list[DPOWindow]:
    """Train ``trainer`` (a DPOTrainer) and, right before each optimizer step, compare the gradient G its
    own loop accumulated with the true gradient g* (each pair's loss from its ``compute_loss`` on that pair
    alone) and with the mean of the window's micro-batch means."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    model, window, out = trainer.model, [], []
    step = trainer.training_step

    def training_step(net: Any, inputs: dict, num_items_in_batch: Any = None) -> Any:
        window.append({k: v.clone() for k, v in inputs.items()})
        return step(net, inputs, num_items_in_batch)

    def split(batch: dict) -> list[dict]:
        n = len(batch["input_ids"]) // 2  # a micro-batch of n pairs: n chosen rows, then n rejected rows
        return [
            {k: torch.cat([v[i : i + 1], v[n + i : n + i + 1]]) for k, v in batch.items()} for i in range(n)
        ]

    def check(opt: Any, a: Any, kw: Any) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        got = torch.cat([p.grad.flatten() for p in params])
        per_batch = [
            [
                torch.cat([g.flatten() for g in torch.autograd.grad(trainer.compute_loss(model, p), params)])
                for p in split(b)
            ]
            for b in window
        ]
        true = sum(g for gs in per_batch for g in gs) / sum(map(len, per_batch))
        means = sum(sum(gs) / len(gs) for gs in per_batch) / len(per_batch)
        out.append(
            DPOWindow(
                [len(gs) for gs in per_batch],
                float((got - true).norm() / true.norm()),
                float((got - means).norm() / true.norm()),
            )
        )
        window.clear()

    trainer.training_step = training_step
    hook = register_optimizer_step_pre_hook(check)
    try:
        with quiet():
            trainer.train()
    finally:
        hook.remove()
        del trainer.training_step
    return out


__all__ = [
    "BUGS",
    "DPOWindow",
    "LibraryBug",
    "dpo",
    "dpo_windows",
    "factors",
    "preference_pairs",
    "prompt_tuning",
    "sft_gpt2",
    "versions",
]
