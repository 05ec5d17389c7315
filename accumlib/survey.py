"""``accumlib survey transformers``: which causal-LM classes (or, with ``--task
sequence-classification``, which sequence classifiers) of the installed transformers accumulate
gradients exactly under its own ``Trainer``.

Every class of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that can be built tiny from its config
(offline, nothing downloaded) gets one Trainer epoch under ``accumlib.hf.verify_trainer``:
22 sequences of 3 to 20 tokens (``accumlib.examples.data``), micro-batches of 2,
``gradient_accumulation_steps=4`` (windows of 4, 4 and 3 micro-batches: a ragged last window),
dropout 0, ``max_grad_norm=0`` (no clipping), the Trainer's own AdamW, sampler and seed. Each row
says how far the worst step was from the true gradient of the mean token loss, verify's codes,
and the fitted factor c where every step is scaled by one.

The item loss is the model's own: before the run, the model's loss on one micro-batch is
matched against the mean of ``causal_lm_losses`` (labels shifted) and of the unshifted
cross-entropy; a class whose loss is neither, or differs between two identical forwards, is
listed as not surveyed, with the reason. Sequence classifiers (``MODEL_FOR_SEQUENCE_CLASSIFICATION_
MAPPING_NAMES``) get the same sequences with one of 3 labels each, and one loss per sequence.

    >>> from accumlib import survey                                   # doctest: +SKIP
    >>> result = survey.run(["gpt2", "llama"])                        # doctest: +SKIP
    >>> [(r.model_class, sorted(r.codes)) for r in result.rows]       # doctest: +SKIP
    [('GPT2LMHeadModel', ['dropout', 'misscaled']), ('LlamaForCausalLM', [])]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import platform
import signal
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ._batch import ItemLosses
from .examples.data import IGNORE_INDEX, classify_collate, collate, labelled_sequences, token_sequences

VOCAB = 64
BATCH, K = 2, 4  # 22 sequences: 11 micro-batches, windows of 4, 4 and 3
MAX_PARAMS = 2_500_000  # "tiny": one epoch in about a second on one CPU thread
SECONDS_PER_MODEL = 120  # a class that takes longer is reported as an error, not waited for
LOSS_RTOL = 1e-5  # float32: the model's mean loss and ours sum the same ~40 terms in another order

# Config fields set for every class that has them (a class without one keeps its default)
TINY: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=32, n_embd=32, d_model=32, embed_dim=32, hidden_dim=32, word_embed_proj_dim=32,
    intermediate_size=64, n_inner=64, ffn_dim=64, num_attention_heads=2, n_head=2, num_heads=2, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=64, n_positions=64, n_ctx=64, num_experts=4, num_local_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, decoder_start_token_id=1, output_router_logits=False,
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
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(vars(default))
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

    cls = getattr(transformers, _mapping(task)[model_type])
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
    from .hf import causal_lm_losses

    return causal_lm_losses(model, batch)


def unshifted_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every label at its own position (a model whose loss does not shift)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    targets = batch["labels"].reshape(-1)
    ce = F.cross_entropy(logits.reshape(targets.numel(), -1), targets, reduction="none", ignore_index=IGNORE_INDEX)
    return ce[targets != IGNORE_INDEX]


def per_sequence_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from .hf import sequence_classification_losses

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
    "causal-lm": Task("causal-LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", lambda: token_sequences(vocab=VOCAB), collate,
                      {"shifted": shifted_losses, "unshifted": unshifted_losses}, {}),
    "sequence-classification": Task(
        "sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", lambda: labelled_sequences(vocab=VOCAB),
        classify_collate, {"per sequence": per_sequence_losses}, {"num_labels": 3}),
}


def _task(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)} (got {task!r})")
    return TASKS[task]


def _mapping(task: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, _task(task).mapping)


def own_item_losses(model: torch.nn.Module, task: str = "causal-lm") -> str:
    """Which of the task's item losses the model's own ``loss`` is the mean of, on the first
    micro-batch in training mode; raises ``ValueError`` when none, or when two identical forwards
    differ (a random training-mode forward cannot be compared exactly)."""
    t = _task(task)
    batch = t.collate(t.data()[:BATCH])
    was = model.training
    model.train()
    try:
        with torch.no_grad():
            own = [float(model(**batch).loss) for _ in range(2)]
            if own[0] != own[1]:
                raise ValueError(f"its training-mode loss is random (two identical forwards: {own[0]:.6g}, {own[1]:.6g})")
            means = {name: float(fn(model, batch).double().mean()) for name, fn in t.item_losses.items()}
    finally:
        model.train(was)
    for name, mean in means.items():
        if abs(mean - own[0]) <= LOSS_RTOL * abs(own[0]):
            return name
    said = " nor ".join(f"the {name} ({mean:.6g})" for name, mean in means.items())
    raise ValueError(f"its loss ({own[0]:.6g}) is the mean of neither {said} cross-entropy" if len(means) > 1 else
                     f"its loss ({own[0]:.6g}) is not the mean of {said} cross-entropy")


def trainer_for(model: torch.nn.Module, output_dir: str, task: str = "causal-lm", **overrides: Any) -> Any:
    """The Trainer every class gets: micro-batches of 2, k = 4, one epoch, no clipping, seed 0."""
    from transformers import Trainer, TrainingArguments

    t = _task(task)
    args = dict(per_device_train_batch_size=BATCH, gradient_accumulation_steps=K, num_train_epochs=1, max_grad_norm=0.0,
                seed=0, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    args |= overrides
    return Trainer(model=model, args=TrainingArguments(output_dir=output_dir, **args), train_dataset=t.data(),
                   data_collator=t.collate)


@dataclass
class Row:
    """One model class: judged (its steps' worst relative error, verify's codes, c per step when
    misscaled), or not surveyed (``skipped``: why) or failed in the Trainer (``error``)."""

    model_type: str
    model_class: str
    status: str  # "judged", "skipped" or "error"
    reason: str = ""
    params: int = 0
    loss_type: str | None = None
    item_losses: str = ""  # "shifted" or "unshifted": what the model's own loss averages
    steps: int = 0
    max_rel_error: float | None = None
    codes: list[str] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)  # c per step, when misscaled or an unscaled sum
    cause: str = ""  # verify's named cause of a misscale
    seconds: float = 0.0

    @property
    def bugs(self) -> list[str]:
        from ._verify import CODES

        return [c for c in self.codes if CODES[c].kind != "note"]


@dataclass
class Survey:
    versions: dict[str, str]
    setup: str
    rows: list[Row]
    seconds: float = 0.0
    task: str = "causal-lm"

    @property
    def judged(self) -> list[Row]:
        return [r for r in self.rows if r.status == "judged"]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Survey:
        data = json.loads(text)
        return cls(data["versions"], data["setup"], [Row(**r) for r in data["rows"]], data.get("seconds", 0.0),
                   data.get("task", "causal-lm"))

    def to_markdown(self) -> str:
        return to_markdown(self)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
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
    from .hf import verify_trainer

    row = Row(model_type, _mapping(task)[model_type], "skipped")
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
                report = verify_trainer(trainer_for(model, out, task), item_losses=TASKS[task].item_losses[row.item_losses])
        row.status, row.reason = "judged", ""
        row.steps = len(report.steps)
        errors = [s.rel_error for s in report.steps if math.isfinite(s.rel_error)]
        row.max_rel_error = max(errors) if errors else None
        row.codes = sorted(report.codes)
        if report.codes & {"misscaled", "unscaled-sum"}:  # a step scaled as a whole: its factor says by how much
            row.scales = [round(s.scale, 6) for s in report.steps]
        if "misscaled" in report.codes:
            message = next(f.message for f in report.findings if f.code == "misscaled")
            row.cause = "labels counted before the shift (c = N/(N+S))" if "shift" in message else ""
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
    names = _mapping(task)
    if not models:
        return list(names)
    by_class = {cls.lower(): t for t, cls in reversed(list(names.items()))}
    out, unknown = [], []
    for m in models:
        key = m.strip()
        t = key if key in names else by_class.get(key.lower())
        (out.append(t) if t else unknown.append(key))
    if unknown:
        raise ValueError(f"models must name {TASKS[task].title} model types or classes of transformers "
                         f"{_version('transformers')} (e.g. gpt2, llama, GPT2LMHeadModel) (got unknown {', '.join(unknown)})")
    return list(dict.fromkeys(out))


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


SETUP = (f"{len(token_sequences())} sequences of 3..20 tokens (vocabulary {VOCAB}{{labels}}), micro-batches of {BATCH}, "
         f"gradient_accumulation_steps={K} (windows of 4, 4, 3 micro-batches), one epoch, the Trainer's AdamW, "
         "linear schedule and RandomSampler (seed 0), max_grad_norm=0, dropout 0, CPU, float32")


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
        with _quiet():
            for t in types:
                rows.append(survey_one(t, task))
                if progress is not None:
                    progress(rows[-1])
    finally:
        torch.set_num_threads(threads)
    versions = {d: _version(d) for d in ("transformers", "torch", "accelerate")} | {"python": platform.python_version()}
    setup = SETUP.format(labels=", one of 3 labels each" if task == "sequence-classification" else "")
    return Survey(versions, setup, rows, round(time.perf_counter() - start, 1), task)


# --- the tables -----------------------------------------------------------------------------


def _codes(r: Row) -> str:
    return ", ".join(r.codes) if r.codes else "ok"


def _c(r: Row) -> str:
    if not r.scales:
        return ""
    lo, hi = min(r.scales), max(r.scales)
    return f"{lo:.4f}" if hi - lo < 5e-5 else f"{lo:.4f} to {hi:.4f}"


def summary(s: Survey) -> str:
    """The short table the README shows: how many classes were judged, and each outcome with its classes."""
    judged = s.judged
    groups: dict[tuple[str, ...], list[Row]] = {}
    for r in judged:
        groups.setdefault(tuple(r.bugs), []).append(r)
    classes = len({r.model_class for r in judged})
    lines = [f"transformers {s.versions['transformers']}: {len(judged)} of {len(s.rows)} {TASKS[s.task].title} model types "
             f"({classes} distinct classes) built tiny and judged, one Trainer epoch each", "",
             "| outcome | classes | c (every step) | max rel. error |", "|---|---|---|---|"]
    for bugs, rows in sorted(groups.items(), key=lambda kv: (kv[0] == (), -len(kv[1]))):
        names = ", ".join(sorted({r.model_class for r in rows}))
        count = len({r.model_class for r in rows})
        scales = sorted({x for r in rows for x in r.scales})
        c = (f"{scales[0]:.4f} to {scales[-1]:.4f}" if scales else "")
        worst = max((r.max_rel_error for r in rows if r.max_rel_error is not None), default=math.nan)
        label = ", ".join(bugs) if bugs else "exact"
        lines.append(f"| {label} | {count}: {_abbrev(names, 20 if bugs else 12)} | {c} | {worst:.1e} |")
    return "\n".join(lines)


def _abbrev(names: str, keep: int = 12) -> str:
    parts = names.split(", ")
    return names if len(parts) <= keep else ", ".join(parts[:keep]) + f", ... ({len(parts) - keep} more)"


def to_markdown(s: Survey) -> str:
    """The full survey as markdown: summary, every judged class, and every class not surveyed, with why."""
    v = s.versions
    flag = "" if s.task == "causal-lm" else f" --task {s.task}"
    what = "per-token" if s.task == "causal-lm" else "per-sequence"
    out = [f"# Gradient accumulation in transformers {v['transformers']}'s Trainer, {TASKS[s.task].title} class by class", "",
           f"Generated by `accumlib survey transformers{flag} --out surveys` (torch {v['torch']}, accelerate {v['accelerate']}, "
           f"Python {v['python']}; {s.seconds:.0f} s on one CPU thread of the machine that ran it). Every number below is "
           "computed by that command; the JSON beside this file holds them all.",
           "", f"Setup: {s.setup}. Each optimizer step's gradient is compared with the true gradient of the mean {what} "
           "loss over the step's micro-batches (`accumlib.hf.verify_trainer`), the loss being the model's own (`item loss`: "
           "which reduction its loss turned out to average); `c` is the fitted factor G = c g* of each step, shown where "
           "a step is scaled as a whole (`misscaled`, `unscaled-sum`).", "",
           "## Summary", "", summary(s), "", "## Every class judged", "",
           "| model type | class | parameters | loss_type | item loss | steps | max rel. error | codes | c |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(s.judged, key=lambda r: r.model_type):
        err = f"{r.max_rel_error:.1e}" if r.max_rel_error is not None else "-"
        out.append(f"| {r.model_type} | {r.model_class} | {r.params:,} | {r.loss_type} | {r.item_losses} | {r.steps} | {err} | "
                   f"{_codes(r)} | {_c(r)} |")
    others = [r for r in s.rows if r.status != "judged"]
    out += ["", "## Not surveyed", "", f"{len(others)} model types could not be built tiny from their config, or their "
            "loss is not a cross-entropy verify can reproduce, or the Trainer failed on them (`error`):", "",
            "| model type | class | status | reason |", "|---|---|---|---|"]
    for r in sorted(others, key=lambda r: r.model_type):
        out.append(f"| {r.model_type} | {r.model_class} | {r.status} | {r.reason.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def write(s: Survey, out_dir: str) -> tuple[str, str]:
    """Write ``transformers-<version>.md`` and ``.json`` into ``out_dir``; return both paths."""
    os.makedirs(out_dir, exist_ok=True)
    suffix = "" if s.task == "causal-lm" else f"-{s.task}"
    stem = os.path.join(out_dir, f"transformers-{s.versions['transformers']}{suffix}")
    with open(stem + ".json", "w") as f:
        f.write(s.to_json() + "\n")
    with open(stem + ".md", "w") as f:
        f.write(to_markdown(s))
    return stem + ".md", stem + ".json"


__all__ = ["TASKS", "Row", "Survey", "Task", "own_item_losses", "resolve", "run", "summary", "survey_one", "tiny_config",
           "tiny_model", "to_markdown", "trainer_for", "write"]
