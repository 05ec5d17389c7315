"""Running the survey: one Trainer epoch per class under ``accumlib.hf.verify_trainer``, each in a
time limit and quietly; a row per class (judged, skipped or failed, with the reason).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..examples.data import token_sequences
from .models import (
    BATCH,
    SECONDS_PER_MODEL,
    TASKS,
    VOCAB,
    K,
    NotTiny,
    model_mapping,
    own_item_losses,
    tiny_model,
    trainer_for,
)
from .results import Row, Survey


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' and Accelerate's advice (config warnings, loss_type fallbacks) is not a result."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    loggers = [logging.getLogger(n) for n in ("accelerate", "torch")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    if not hasattr(signal, "SIGALRM"):  # Windows: no limit
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError(f"ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def survey_one(model_type: str, task: str = "causal-lm") -> Row:
    """Build ``model_type``'s ``task`` class tiny, find its item loss, and verify one Trainer epoch."""
    from accumlib.hf import verify_trainer

    row = Row(model_type, model_mapping(task)[model_type], "skipped")
    start = time.perf_counter()
    try:
        with _time_limit(SECONDS_PER_MODEL):
            try:
                model = tiny_model(model_type, task)
                row.params = sum(p.numel() for p in model.parameters())
                row.loss_type = getattr(model, "loss_type", None)
                row.item_losses = own_item_losses(model, task)
            except NotTiny as err:
                row.reason = f"not tiny: {err}"
                return row
            except Exception as err:  # noqa: BLE001 - every reason a class cannot be surveyed is a row, not a crash
                row.reason = f"{type(err).__name__}: {_one_line(err)}"
                return row
            row.status = "error"
            with tempfile.TemporaryDirectory(prefix="accumlib-survey-") as out:
                report = verify_trainer(
                    trainer_for(model, out, task), item_losses=TASKS[task].item_losses[row.item_losses]
                )
        row.status, row.reason = "judged", ""
        row.steps = len(report.steps)
        errors = [s.rel_error for s in report.steps if math.isfinite(s.rel_error)]
        row.max_rel_error = max(errors) if errors else None
        row.codes = sorted(report.codes)
        # a step scaled as a whole: its factor says by how much
        if report.codes & {"misscaled", "unscaled-sum"}:
            row.factors = [round(s.factor, 6) for s in report.steps]
        if any(s.cause == "shift" for s in report.steps):  # the cause as data, never read from the words
            row.cause = "labels counted before the shift (c = N/(N+S))"
    except Exception as err:  # noqa: BLE001 - a class the Trainer cannot train is a finding of the survey
        row.reason = f"{type(err).__name__}: {_one_line(err)}"
    finally:
        row.seconds = round(time.perf_counter() - start, 2)
    return row


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def resolve(models: Sequence[str] | None, task: str = "causal-lm") -> list[str]:
    """Model types to survey: all of the task's model types, or those named (model types or class names)."""
    names = model_mapping(task)
    if not models:
        return list(names)
    by_class: dict[str, str] = {}
    for t, cls in names.items():
        # several model types share a class (gpt-sw3 and gpt2: GPT2LMHeadModel; internlm3 and llama:
        # LlamaForCausalLM): a class name means the type of its own config class, else the first listed
        if cls.lower() not in by_class or t == _own_type(cls):
            by_class[cls.lower()] = t
    out, unknown = [], []
    for m in models:
        key = m.strip()
        t = key if key in names else by_class.get(key.lower())
        (out.append(t) if t else unknown.append(key))
    if unknown:
        raise ValueError(
            f"models must name {TASKS[task].title} model types or classes of transformers "
            f"{installed_version('transformers')} (e.g. gpt2, llama, GPT2LMHeadModel) "
            f"(got unknown {', '.join(unknown)})"
        )
    return list(dict.fromkeys(out))


def _own_type(cls_name: str) -> str | None:
    """The model type of the class's own config class (GPT2LMHeadModel -> gpt2), or None."""
    import transformers

    cls = getattr(transformers, cls_name, None)
    return getattr(getattr(cls, "config_class", None), "model_type", None)


def installed_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


SETUP = (
    f"{len(token_sequences())} sequences of 3..20 tokens (vocabulary {VOCAB}{{labels}}), "
    f"micro-batches of {BATCH}, gradient_accumulation_steps={K} (windows of 4, 4, 3 micro-batches), "
    "one epoch, the Trainer's AdamW, linear schedule and RandomSampler (seed 0), max_grad_norm=0, "
    "dropout 0, CPU, float32"
)


def run(models: Sequence[str] | None = None, task: str = "causal-lm", progress: Any = None) -> Survey:
    """Survey the ``task`` classes of the installed transformers (all, or ``models``).
    ``progress(row)`` is called after each class (the CLI prints a line)."""
    types = resolve(models, task)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a tiny model from its config needs no hub
    start = time.perf_counter()
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is as fast, and rounding is the same everywhere
    try:
        with quiet():
            for t in types:
                rows.append(survey_one(t, task))
                if progress is not None:
                    progress(rows[-1])
    finally:
        torch.set_num_threads(threads)
    versions = {d: installed_version(d) for d in ("transformers", "torch", "accelerate")} | {
        "python": platform.python_version()
    }
    setup = SETUP.format(labels=", one of 3 labels each" if task == "sequence-classification" else "")
    return Survey(versions, setup, rows, round(time.perf_counter() - start, 1), task)
