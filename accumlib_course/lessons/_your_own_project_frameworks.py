"""Lesson 10, part: the setting to write in each framework, every claim a run under verify.

Each entry of ``RUNS`` builds a tiny real setup (models built from configs, nothing downloaded) and
judges it: the Transformers ``Trainer`` through ``accumlib.hf.verify_trainer``, Lightning through
``accumlib.lightning.verify_fit``, an Accelerate loop through ``accumlib.verify``. The table says
what verify found for each setting; the lesson's text says which one to write.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from accumlib.checks import check_choice
from accumlib.text import Table
from accumlib_course.survey.run import (
    quiet,
)  # the libraries' advice (config warnings, logging) is not the lesson

from ._common import long_lived_objects_frozen
from ._real_bugs_runs import make_trainer


def _trainer(model: Any, compute_loss_func: Any = None, **overrides: Any) -> Any:
    """Lesson 9's Trainer (22 sequences, micro-batches of 2, k = 4, no clipping, seed 0), no logging."""
    return make_trainer(model, compute_loss_func=compute_loss_func, logging_strategy="no", **overrides)


def shifted_sum_over_items(
    outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None
) -> torch.Tensor:
    """A ``compute_loss_func``: the summed shifted token losses over the window's token count the Trainer
    passes.
    """
    logits = outputs.logits[:, :-1].float()
    summed = F.cross_entropy(
        logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
    )
    return summed / num_items_in_batch


def shifted_mean(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """A ``compute_loss_func`` that ignores ``num_items_in_batch``: the micro-batch's mean token loss."""
    logits = outputs.logits[:, :-1].float()
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def _gpt2(loss_type: str | None = None) -> Any:
    from accumlib_course.survey import tiny_model

    model = tiny_model("gpt2")
    if loss_type:
        model.loss_type = loss_type
    return model


def _hf(trainer: Any) -> Any:
    from accumlib.hf import verify_trainer

    with quiet():
        return verify_trainer(trainer)


def _accelerate(counted: bool) -> Any:
    import accumlib
    from accumlib_course.examples import accelerate_clm

    accelerate_clm.reset_accelerate()  # Accelerate keeps one process-wide state
    try:
        with quiet():
            return accumlib.verify(
                accelerate_clm.train_counted if counted else accelerate_clm.train,
                **accelerate_clm.verify_args(),
            )
    finally:
        accelerate_clm.reset_accelerate()


def _lightning(n_digits: int) -> Any:
    import logging

    import accumlib
    from accumlib.lightning import verify_fit
    from accumlib_course.examples import lightning_digits

    loader = torch.utils.data.DataLoader(accumlib.data.digits(n_digits), batch_size=8)
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return verify_fit(
                lightning_digits.Digits(),
                loader,
                item_losses=lightning_digits.item_losses,
                accumulate_grad_batches=4,
            )
    finally:
        logger.setLevel(level)


def _trl_peft(which: str) -> Any:
    from accumlib_course.examples import trl_peft

    with quiet():  # TRL's config warns of renamed arguments while it is built
        trainer = trl_peft.sft_gpt2() if which == "sft" else trl_peft.prompt_tuning()
    return _hf(trainer)


@dataclass(frozen=True)
class Run:
    """One setting: the library, what was set, and the function that builds it and returns verify's report."""

    library: str
    setting: str
    run: Callable[[], Any]


RUNS: dict[str, Run] = {
    "trainer-default": Run(
        "Transformers Trainer", "GPT-2, defaults (loss_type unset)", lambda: _hf(_trainer(_gpt2()))
    ),
    "trainer-loss-type": Run(
        "Transformers Trainer", 'model.loss_type = "ForCausalLM"', lambda: _hf(_trainer(_gpt2("ForCausalLM")))
    ),
    "trainer-average-tokens": Run(
        "Transformers Trainer",
        'loss_type "ForCausalLM", average_tokens_across_devices=True (one process)',
        lambda: _hf(_trainer(_gpt2("ForCausalLM"), average_tokens_across_devices=True)),
    ),
    "trainer-loss-func-mean": Run(
        "Transformers Trainer",
        "compute_loss_func: mean per micro-batch",
        lambda: _hf(_trainer(_gpt2("ForCausalLM"), shifted_mean)),
    ),
    "trainer-loss-func-sum": Run(
        "Transformers Trainer",
        "compute_loss_func: sum / num_items_in_batch",
        lambda: _hf(_trainer(_gpt2("ForCausalLM"), shifted_sum_over_items)),
    ),
    "accelerate": Run(
        "Accelerate", "accumulate(); accelerator.backward(mean loss)", lambda: _accelerate(False)
    ),
    "accelerate-counted": Run(
        "Accelerate", "tokens of the window counted first; backward(sum / N x k)", lambda: _accelerate(True)
    ),
    "lightning-tail": Run(
        "Lightning", "accumulate_grad_batches=4, 110 digits (a short last window)", lambda: _lightning(110)
    ),
    "lightning-full": Run(
        "Lightning", "accumulate_grad_batches=4, 96 digits (full windows)", lambda: _lightning(96)
    ),
    "trl-sft": Run("TRL", "SFTTrainer on GPT-2, defaults", lambda: _trl_peft("sft")),
    "peft-prompt": Run("PEFT", "prompt tuning under the Trainer", lambda: _trl_peft("prompt")),
}


@dataclass(frozen=True)
class Judged:
    """A run's verdict: ``ok``, the finding codes, the factor c of each step, the seconds it took."""

    key: str
    ok: bool
    codes: tuple[str, ...]
    factors: tuple[float, ...]
    micro_batches: tuple[int, ...]  # per step: how many micro-batches its window held
    seconds: float


@dataclass(frozen=True)
class FrameworkResult:
    judged: tuple[Judged, ...]

    def __getitem__(self, key: str) -> Judged:
        for j in self.judged:
            if j.key == key:
                return j
        raise KeyError(key)

    def rows(self) -> list[tuple[Any, ...]]:
        return [
            (
                RUNS[j.key].library,
                RUNS[j.key].setting,
                "ok" if j.ok else "wrong",
                ", ".join(c for c in j.codes) or "-",
                " ".join(f"{c:.3f}" for c in j.factors),
            )
            for j in self.judged
        ]

    def table(self) -> Table:
        return Table(("library", "setting", "verify", "findings", "c per step (1 = exact)"), self.rows())


def frameworks(keys: Any = tuple(RUNS)) -> FrameworkResult:
    """Run each setting of ``keys`` (``RUNS``' keys) under verify.

    >>> frameworks(["trainer-defaults"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: keys must be one of 'trainer-default', ..., 'peft-prompt' (got 'trainer-defaults')
    """
    if isinstance(keys, str):
        keys = (keys,)
    keys = tuple(check_choice("keys", k, tuple(RUNS)) for k in keys)
    out = []
    for key in keys:
        start = time.perf_counter()
        with long_lived_objects_frozen():
            report = RUNS[key].run()
        out.append(
            Judged(
                key,
                bool(report.ok),
                tuple(sorted(report.codes)),
                tuple(s.factor for s in report.steps),
                tuple(s.micro_batches for s in report.steps),
                time.perf_counter() - start,
            )
        )
    return FrameworkResult(tuple(out))


__all__ = ["FrameworkResult", "Judged", "RUNS", "Run", "frameworks", "shifted_mean", "shifted_sum_over_items"]
