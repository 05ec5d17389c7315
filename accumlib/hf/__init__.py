"""``verify_trainer``: ``accumlib.verify`` on a Hugging Face Transformers ``Trainer`` (or TRL's
``SFTTrainer``), in one line.

The Trainer's own training loop runs on a copy of the model: its arguments, the optimizer and
scheduler it builds (or a copy of the ones it was given), its data collator, sampler,
``gradient_accumulation_steps``, ``max_grad_norm`` and mixed precision. Every optimizer step is
judged against the true gradient of the mean item loss over the step's micro-batches, where an
item is what ``item_losses`` returns one loss for: a predicted token for a causal LM
(``causal_lm_losses``, PEFT adapters included), a sample for sequence classification
(``sequence_classification_losses``).

    >>> from accumlib.hf import verify_trainer
    >>> report = verify_trainer(trainer)  # your configured Trainer, untouched  # doctest: +SKIP
    >>> print(report)  # one row per optimizer step, then the findings  # doctest: +SKIP

What runs differs from ``trainer.train()`` only where a comparison needs it: one epoch (unless
``args.max_steps`` is set), output in a temporary folder, no checkpoints, no evaluation, no
reporting integrations, data loading in the main process (verify records each micro-batch as it
arrives), and dropout, NEFTune noise and MoE router jitter off (random, so no gradient could be
compared exactly). Under torchrun or ``accelerate launch`` (DDP), call it on every rank: the job is
judged as a whole and every rank gets the same report. Needs ``pip install accumlib[hf]``
(transformers, accelerate).
"""

from .losses import causal_lm_losses, default_item_losses, sequence_classification_losses, virtual_tokens
from .trainer import verify_trainer

__all__ = [
    "causal_lm_losses",
    "default_item_losses",
    "sequence_classification_losses",
    "verify_trainer",
    "virtual_tokens",
]
