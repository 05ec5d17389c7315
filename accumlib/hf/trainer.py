"""``verify_trainer``: ``accumlib.verify`` on a Hugging Face Transformers ``Trainer``, in one line.

The Trainer's own training loop runs on a copy of the model: its arguments, the optimizer and
scheduler it builds (or a copy of the ones it was given), its data collator, sampler,
``gradient_accumulation_steps``, ``max_grad_norm`` and mixed precision. Every optimizer step is
judged against the true gradient of the mean item loss over the step's micro-batches, where an
item is what ``item_losses`` returns one loss for: a predicted token for a causal LM
(``causal_lm_losses``), a sample for sequence classification (``sequence_classification_losses``).

    >>> from accumlib.hf import verify_trainer
    >>> report = verify_trainer(trainer)  # your configured Trainer, untouched  # doctest: +SKIP
    >>> print(report)  # one row per optimizer step, then the findings  # doctest: +SKIP

What runs differs from ``trainer.train()`` only where a comparison needs it: one epoch (unless
``args.max_steps`` is set), output in a temporary folder, no checkpoints, no evaluation, no
reporting integrations, data loading in the main process (verify records each micro-batch as it
arrives), and dropout, NEFTune noise and MoE router jitter off (random, so no gradient could be
compared exactly). Needs ``pip install accumlib[hf]`` (transformers, accelerate).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import numbers
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ._batch import ItemLosses
from ._verify import CODES, Finding, Report, verify

IGNORE_INDEX = -100  # the label transformers' losses skip (padding, prompt tokens)
# keys of a Trainer batch that are targets or loss arguments, not inputs of the forward
NOT_INPUTS = ("labels", "shift_labels", "num_items_in_batch")
# float attributes that make a training-mode forward random: switched off in verify's copy
RANDOM_IN_TRAINING = ("dropout", "pdrop", "layerdrop", "jitter")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # accumlib itself never needs it
        raise ImportError("accumlib.hf needs transformers and accelerate: pip install accumlib[hf]") from err
    return transformers


def _logits(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    out = model(**{k: v for k, v in batch.items() if k not in NOT_INPUTS})
    return (out["logits"] if isinstance(out, Mapping) else out[0]).float()


def causal_lm_losses(model: torch.nn.Module, batch: Mapping[str, Any], *, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of every predicted token of a causal LM batch: ``[n_tokens]``.

    Position t predicts label t + 1 (the shift transformers' ``ForCausalLMLoss`` makes), so a
    sequence of L labelled tokens has L - 1 items; labels of -100 (padding) are none. A batch with
    ``shift_labels`` (padding-free collators) is taken as already shifted.
    ``label_smoothing`` is ``TrainingArguments.label_smoothing_factor``.

    >>> import torch
    >>> class Uniform(torch.nn.Module):  # logits over 4 tokens, all equal
    ...     def forward(self, input_ids, attention_mask=None):
    ...         return {"logits": torch.zeros(*input_ids.shape, 4)}
    >>> batch = {"input_ids": torch.tensor([[1, 2, 3], [1, 2, 0]]), "labels": torch.tensor([[1, 2, 3], [1, 2, -100]])}
    >>> causal_lm_losses(Uniform(), batch)  # 2 + 1 predicted tokens, each -log(1/4)
    tensor([1.3863, 1.3863, 1.3863])
    """
    logits = _logits(model, batch)
    if "shift_labels" in batch:
        targets = batch["shift_labels"]
    else:
        logits, targets = logits[:, :-1], batch["labels"][:, 1:]
    targets = targets.reshape(-1).to(logits.device)
    ce = F.cross_entropy(logits.reshape(targets.numel(), -1), targets, reduction="none",
                         ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
    return ce[targets != IGNORE_INDEX]


def sequence_classification_losses(model: torch.nn.Module, batch: Mapping[str, Any], *, label_smoothing: float = 0.0) -> torch.Tensor:
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
        problem = ("regression" if n_labels == 1 else
                   "single_label_classification" if labels.dtype in (torch.long, torch.int) else "multi_label_classification")
    if problem == "regression":
        diff = (logits.squeeze(-1) - labels.float()) if n_labels == 1 else (logits - labels.float())
        return diff.pow(2) if n_labels == 1 else diff.pow(2).mean(-1)
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(-1)
    labels = labels.reshape(-1)
    ce = F.cross_entropy(logits.reshape(labels.numel(), n_labels), labels, reduction="none",
                         ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
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
    classification (by the model's class, as transformers' auto classes list them); anything else
    has no default, and the error says to pass ``item_losses``.

    >>> from accumlib.survey import tiny_model
    >>> default_item_losses(tiny_model("gpt2")).__name__
    'causal_lm_losses'
    >>> default_item_losses(torch.nn.Linear(2, 1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: item_losses must be given ...
    """
    from transformers.models.auto import modeling_auto as auto

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    name = type(base).__name__
    for names, suffix, losses in ((auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "ForCausalLM", causal_lm_losses),
                                  (auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "ForSequenceClassification",
                                   sequence_classification_losses)):
        if name in _class_names(names) or name.endswith(suffix):
            return functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing else losses
    raise ValueError(
        "item_losses must be given for a model that is neither a causal LM nor a sequence classifier "
        f"(got {name}): item_losses(model, batch) returns one loss per item the Trainer's loss averages over, "
        "e.g. accumlib.hf.causal_lm_losses")


# --- copies of what the user configured -----------------------------------------------------


def _copied_optimizer(user_opt: torch.optim.Optimizer, user_model: torch.nn.Module) -> Callable[[Any], torch.optim.Optimizer]:
    """verify's ``optimizer`` factory: the user's optimizer, rebuilt over the copy's parameters.

    It is bound to the user's model, so it cannot be reused: one of the same class, the same
    parameter groups (mapped by position) and a deep copy of its state is built instead."""
    user_opt = getattr(user_opt, "optimizer", user_opt)  # Accelerate's AcceleratedOptimizer, after a train()
    index = {id(p): i for i, p in enumerate(user_model.parameters())}
    foreign = [p for g in user_opt.param_groups for p in g["params"] if id(p) not in index]
    if foreign:
        raise ValueError(f"trainer.optimizer must hold only parameters of trainer.model (got {len(foreign)} others)")

    def build(params: Any) -> torch.optim.Optimizer:
        params = list(params)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [params[index[id(p)]] for p in g["params"]]}
                  for g in user_opt.param_groups]
        takes = inspect.signature(type(user_opt).__init__).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in takes.values()):  # defaults may hold more than __init__ takes
            kwargs = {k: v for k, v in user_opt.defaults.items() if k in takes}
        else:
            kwargs = dict(user_opt.defaults)
        opt = type(user_opt)(groups, **kwargs)
        opt.defaults = copy.deepcopy(user_opt.defaults)
        opt.load_state_dict(copy.deepcopy(user_opt.state_dict()))  # deep: the state tensors must not be shared
        return opt

    return build


def _copied_scheduler(user_sched: Any, user_opt: torch.optim.Optimizer, opt: torch.optim.Optimizer) -> Any:
    """The user's scheduler, pointed at the copied optimizer (its schedule and position kept)."""
    if user_sched is None:
        return None
    user_sched = getattr(user_sched, "scheduler", user_sched)  # Accelerate's AcceleratedScheduler
    user_opt = getattr(user_opt, "optimizer", user_opt)
    sched = copy.deepcopy(user_sched, memo={id(user_opt): opt})
    if not hasattr(opt.step, "_wrapped_by_lr_sched"):  # what torch's LRScheduler.__init__ does to its optimizer,
        step = opt.step                                # so its check of the step order holds for the copy

        @functools.wraps(step)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            opt._opt_called = True  # type: ignore[attr-defined]
            return step(*args, **kwargs)

        tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        opt.step = tracked  # type: ignore[method-assign]
    return sched


def _training_args(args: Any, output_dir: str, max_steps: int | None) -> Any:
    """A copy of the user's TrainingArguments, changed only where verify needs it."""
    changes: dict[str, Any] = dict(
        output_dir=output_dir, report_to=[], save_strategy="no", eval_strategy="no", load_best_model_at_end=False,
        eval_on_start=False, push_to_hub=False, dataloader_num_workers=0, dataloader_prefetch_factor=None,
        dataloader_persistent_workers=False, neftune_noise_alpha=None, disable_tqdm=True,
    )
    if args.max_steps is None or args.max_steps <= 0:
        changes["num_train_epochs"] = 1  # every window of a pass is judged in the first pass
    if max_steps is not None:
        changes["max_steps"] = max_steps
    fields = {f.name for f in dataclasses.fields(args)}
    return dataclasses.replace(args, **{k: v for k, v in changes.items() if k in fields})


def _copied_callbacks(trainer: Any) -> list[Any]:
    """The user's own callbacks, copied; the Trainer's defaults and reporting integrations are not."""
    from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback

    defaults = (DefaultFlowCallback, PrinterCallback, ProgressCallback)
    return [copy.deepcopy(cb) for cb in trainer.callback_handler.callbacks
            if not isinstance(cb, defaults) and not type(cb).__module__.startswith("transformers.integrations")]


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """The Trainer seeds every RNG and shares Accelerate's process-wide state with the user's own
    Trainer: both are put back as they were."""
    rng = (torch.get_rng_state(), random.getstate(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        import numpy as np
        np_rng = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        np, np_rng = None, None
    from accelerate.state import AcceleratorState, GradientState, PartialState

    shared = [(cls._shared_state, {k: copy.copy(v) if isinstance(v, (list, dict)) else v for k, v in cls._shared_state.items()})
              for cls in (PartialState, AcceleratorState, GradientState)]
    try:
        yield
    finally:
        for state, saved in shared:
            state.clear()
            state.update(saved)
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        if rng[2] is not None:
            torch.cuda.set_rng_state_all(rng[2])
        if np is not None:
            np.random.set_state(np_rng)


@contextlib.contextmanager
def _randomness_off(model: torch.nn.Module) -> Iterator[list[tuple[str, float]]]:
    """Set the float probabilities a training-mode forward draws with (functional attention
    dropout, LayerDrop, router jitter; nn.Dropout modules are verify's own business) to 0 while
    verify copies the model, and put them back: yields what was switched off."""
    changed: list[tuple[Any, str, float]] = []
    objects = [m for m in model.modules()] + [m.config for m in model.modules() if hasattr(m, "config")]
    seen = set()
    for obj in objects:
        if id(obj) in seen or isinstance(obj, torch.nn.modules.dropout._DropoutNd):
            continue
        seen.add(id(obj))
        for name, value in list(vars(obj).items()):
            if isinstance(value, float) and value > 0 and any(word in name for word in RANDOM_IN_TRAINING):
                changed.append((obj, name, value))
                setattr(obj, name, 0.0)
    try:
        yield sorted({(name, value) for _, name, value in changed})
    finally:
        for obj, name, value in changed:
            setattr(obj, name, value)


def _check_trainer(trainer: Any, max_steps: Any, item_losses: Any) -> None:
    transformers = _transformers()
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"trainer must be a transformers.Trainer (got {type(trainer).__name__})")
    if trainer.train_dataset is None:
        raise ValueError("trainer.train_dataset must be set: verify_trainer runs the Trainer's training loop on it (got None)")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 1):
        raise ValueError(f"max_steps must be None or an integer >= 1 (got {max_steps!r})")
    if item_losses is not None and not callable(item_losses):
        raise TypeError(f"item_losses must be None or callable as item_losses(model, batch) (got {type(item_losses).__name__})")
    args = trainer.args
    if args.world_size > 1 or args.n_gpu > 1:
        raise ValueError("trainer.args must describe one process on one device: verify_trainer judges a single-process "
                         f"run (got world_size={args.world_size}, n_gpu={args.n_gpu}); set CUDA_VISIBLE_DEVICES to one GPU")


def verify_trainer(trainer: Any, *, max_steps: int | None = None, item_losses: ItemLosses | None = None) -> Report:
    """Run ``trainer``'s own training loop on a copy of its model and judge every optimizer step.

    ``item_losses(model, batch)`` returns one loss per item the model's loss averages over; by
    default ``causal_lm_losses`` or ``sequence_classification_losses`` (by the model's class, with
    the Trainer's ``label_smoothing_factor``). ``max_steps`` judges the first N optimizer steps
    (``args.max_steps``, when set, caps it too). ``trainer``, its model, optimizer, scheduler and
    dataset are left as they were: ``trainer.state.global_step`` stays 0, and nothing is written
    outside a temporary folder. A ``Trainer`` subclass works when its ``__init__`` takes the
    Trainer's own arguments.

    >>> trainer = transformers.Trainer(model=gpt2, args=args, train_dataset=data, data_collator=collate)  # doctest: +SKIP
    >>> accumlib.hf.verify_trainer(trainer).codes  # doctest: +SKIP
    {'misscaled'}
    """
    _check_trainer(trainer, max_steps, item_losses)
    model, args = trainer.model, trainer.args
    losses = item_losses or default_item_losses(model, args.label_smoothing_factor)
    cap = min([n for n in (max_steps, args.max_steps if args.max_steps and args.max_steps > 0 else None) if n], default=None)
    user_opt, user_sched = trainer.optimizer, trainer.lr_scheduler
    optimizer = _copied_optimizer(user_opt, model) if user_opt is not None else None
    callbacks = _copied_callbacks(trainer)

    from transformers.trainer_callback import PrinterCallback

    def train_fn(net: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any) -> float:
        with tempfile.TemporaryDirectory(prefix="accumlib-trainer-") as out:
            try:
                copy_of = type(trainer)(
                    model=net, args=_training_args(args, out, cap),
                    # the loader's dataset and collate_fn are verify's recording wrappers around the user's
                    data_collator=loader.collate_fn, train_dataset=loader.dataset,
                    processing_class=trainer.processing_class, callbacks=callbacks,
                    compute_loss_func=getattr(trainer, "compute_loss_func", None),
                    optimizers=(opt, _copied_scheduler(user_sched, user_opt, opt)) if user_opt is not None else (None, None),
                    optimizer_cls_and_kwargs=getattr(trainer, "optimizer_cls_and_kwargs", None),
                )
            except TypeError as err:
                err.add_note(f"accumlib.hf.verify_trainer builds a new {type(trainer).__name__} with the arguments of "
                             "transformers.Trainer.__init__; a subclass whose __init__ takes others is not supported")
                raise
            copy_of.remove_callback(PrinterCallback)  # its end-of-training metrics line is not verify's to print
            # the sampler draws indices only: built on the user's dataset, a length-grouped sampler
            # reads lengths from it, not through verify's recording wrapper
            sampler = copy_of._get_train_sampler
            copy_of._get_train_sampler = lambda dataset=None: sampler(trainer.train_dataset)
            return copy_of.train().training_loss  # the loss the Trainer reports, checked as the epoch loss

    with _process_state_kept(), _randomness_off(model) as switched_off:
        report = verify(train_fn, model=model, dataset=trainer.train_dataset, item_losses=losses,
                        accum_steps=args.gradient_accumulation_steps, batch_size=args.per_device_train_batch_size,
                        optimizer=optimizer, collate_fn=trainer.data_collator, max_steps=cap)
    if switched_off:  # said beside verify's own dropout note (nn.Dropout layers), or as one
        said = "random training-mode probabilities (" + ", ".join(f"{n}={v:g}" for n, v in switched_off) + ") were set to 0"
        at = next((i for i, f in enumerate(report.findings) if f.code == "dropout"), None)
        if at is None:
            report.findings.append(Finding("dropout", said + " in verify's copy, so every step is compared exactly",
                                           CODES["dropout"].fix))
        else:
            f = report.findings[at]
            report.findings[at] = Finding("dropout", f"{f.message}; {said} too", f.fix, f.steps)
    return report


__all__ = ["causal_lm_losses", "default_item_losses", "sequence_classification_losses", "verify_trainer"]
