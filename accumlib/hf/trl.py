"""What ``verify_trainer`` needs to know about TRL's trainers (checked on trl 1.16).

- ``SFTTrainer`` is judged like the Trainer: its loss is the summed token losses divided by the
  Trainer's ``num_items_in_batch`` (``trl/trainer/sft_trainer.py``, ``compute_loss``). Its copy
  takes the user's already prepared dataset as it is (``skip_prepare_dataset``: no second
  tokenisation or packing), and builds its own collator where TRL refuses a given one
  (padding-free training and BFD packing).
- A trainer whose loss is not a mean over items verify can recompute from a micro-batch alone
  (``DPOTrainer``: one loss per preference pair against a reference model; ``GRPOTrainer``,
  ``RLOOTrainer``: completions generated during training) is refused by name before anything
  runs, with what to do instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# trainers whose loss verify_trainer knows how to recompute, by class name along the MRO
JUDGED = ("SFTTrainer",)
# why each other TRL trainer cannot be judged, and what to do instead
REFUSED = {
    "DPOTrainer": (
        "its loss is a mean over preference pairs of a margin against a reference model's "
        "log-probabilities, which no per-token item loss recomputes, and verify cannot follow the "
        "reference model"
    ),
    "KTOTrainer": (
        "its loss compares each completion with a batch-level KL estimate against a reference model"
    ),
    "GRPOTrainer": (
        "it generates the completions it trains on during training, so no micro-batch can be replayed"
    ),
    "RLOOTrainer": (
        "it generates the completions it trains on during training, so no micro-batch can be replayed"
    ),
}
INSTEAD = (
    "judge the loss with accumlib.verify: write the window loop yourself (or wrap the trainer's "
    "compute_loss) and pass item_losses(model, batch) returning one loss per item, e.g. one per "
    "preference pair"
)


def is_trl(trainer: Any) -> bool:
    """Whether ``trainer`` is one of TRL's (by the module its class, or a base class, comes from).

    >>> is_trl(object())
    False
    """
    return any(c.__module__.split(".")[0] == "trl" for c in type(trainer).__mro__)


def check_trl(trainer: Any, item_losses: Any) -> None:
    """Refuse a TRL trainer verify cannot judge, before anything runs: naming the trainer, the rule
    and what to do instead.

    >>> check_trl(object(), None)  # not TRL's: nothing to say
    """
    if not is_trl(trainer):
        return
    names = [c.__name__ for c in type(trainer).__mro__]
    if any(n in JUDGED for n in names):
        return
    why = next(
        (REFUSED[n] for n in names if n in REFUSED), "verify_trainer knows the loss of TRL's SFTTrainer only"
    )
    raise TypeError(
        f"trainer must be a transformers.Trainer or trl.SFTTrainer whose loss is a mean over items "
        f"verify can recompute from a micro-batch (got trl {type(trainer).__name__}: {why}); {INSTEAD}"
    )


def trl_changes(args: Any) -> dict[str, Any]:
    """Changes to the copy's arguments for a TRL config: the user's trainer prepared (tokenised,
    packed) its dataset already, so the copy takes it as it is.

    >>> trl_changes(object())
    {}
    """
    if not dataclasses.is_dataclass(args) or "dataset_kwargs" not in {
        f.name for f in dataclasses.fields(args)
    }:
        return {}
    return {"dataset_kwargs": {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}}


def trl_kwargs(trainer: Any) -> dict[str, Any]:
    """Changes to the copy's constructor arguments: a padding-free ``SFTTrainer`` refuses a collator
    and builds the same one itself (its own, which the user's trainer holds, still collates).

    >>> trl_kwargs(object())
    {}
    """
    return {"data_collator": None} if is_trl(trainer) and getattr(trainer, "padding_free", False) else {}


__all__ = ["check_trl", "is_trl", "trl_changes", "trl_kwargs"]
