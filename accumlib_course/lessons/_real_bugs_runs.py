"""Lesson 9's runs: each library's own accumulation loop under verify, as the notebook makes them.

Accelerate's documented loop and Lightning's ``accumulate_grad_batches`` on the digits MLP (110
digits, micro-batches of 8, k = 4: a last window of 2), Accelerate's ``run_clm_no_trainer.py`` loop
on a one-layer Llama, and the Transformers ``Trainer`` on a tiny GPT-2 (22 sequences, micro-batches
of 2, k = 4), as configured and with ``loss_type = "ForCausalLM"``.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accumlib.checks import check_choice

from ._common import long_lived_objects_frozen


@dataclass(frozen=True)
class Run:
    label: str
    make: Callable[[], Any]  # -> accumlib.Report


def make_trainer(model: Any, compute_loss_func: Any = None, **overrides: Any) -> Any:
    """The lesson's Trainer: 22 sequences of 3 to 20 tokens, micro-batches of 2, k = 4, one epoch, no
    clipping, seed 0
    (``overrides``: TrainingArguments; lesson 10 builds its Trainers here too)."""
    import transformers

    from accumlib_course.examples.data import collate, token_sequences

    args = (
        dict(
            output_dir=tempfile.mkdtemp(prefix="accumlib-lesson9-"),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=4,
            num_train_epochs=1,
            max_grad_norm=0.0,
            seed=0,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        | overrides
    )
    return transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(**args),
        train_dataset=token_sequences(),
        data_collator=collate,
        compute_loss_func=compute_loss_func,
    )


def _accelerate() -> Any:
    import accumlib
    from accumlib_course.examples import accelerate_clm, accelerate_digits

    task = accumlib.get_task("mlp-digits")
    accelerate_clm.reset_accelerate()  # Accelerate keeps one process-wide state
    try:
        return accumlib.verify(
            accelerate_digits.train,
            model=task.make_model(0),
            dataset=accumlib.data.digits(110),
            item_losses=task.item_losses,
            accum_steps=4,
            batch_size=8,
        )
    finally:
        accelerate_clm.reset_accelerate()


def _accelerate_clm() -> Any:
    import accumlib
    from accumlib_course.examples import accelerate_clm

    accelerate_clm.reset_accelerate()
    try:
        return accumlib.verify(accelerate_clm.train, **accelerate_clm.verify_args())
    finally:
        accelerate_clm.reset_accelerate()


def _lightning() -> Any:
    import torch

    import accumlib
    from accumlib.lightning import verify_fit
    from accumlib_course.examples import lightning_digits

    loader = torch.utils.data.DataLoader(accumlib.data.digits(110), batch_size=8)
    return verify_fit(
        lightning_digits.Digits(), loader, item_losses=lightning_digits.item_losses, accumulate_grad_batches=4
    )


def _gpt2(loss_type: str | None) -> Any:
    from accumlib.hf import verify_trainer
    from accumlib_course.survey import tiny_model

    model = tiny_model("gpt2")
    if loss_type is not None:
        model.loss_type = loss_type
    return verify_trainer(make_trainer(model))


RUNS: dict[str, Run] = {
    "accelerate": Run("Accelerate accumulate() (MLP)", _accelerate),
    "accelerate-clm": Run("Accelerate run_clm_no_trainer (Llama)", _accelerate_clm),
    "lightning": Run("Lightning accumulate_grad_batches", _lightning),
    "trainer-gpt2": Run("Trainer, GPT-2 as configured", lambda: _gpt2(None)),
    "trainer-gpt2-fixed": Run("Trainer, GPT-2, loss_type fixed", lambda: _gpt2("ForCausalLM")),
}


@functools.lru_cache(maxsize=len(RUNS))
def run(name: str) -> Any:
    """verify's report of run ``name`` (made once per process: every run is seeded)."""
    check_choice("name", name, tuple(RUNS))
    from accumlib_course.survey.run import quiet

    with quiet(), long_lived_objects_frozen():
        return RUNS[name].make()
