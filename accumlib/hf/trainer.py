"""``verify_trainer``: the Trainer's own training loop run on a copy under ``accumlib.verify``.

The copy is a Trainer of the user's class built from copies of what the user configured (its
arguments, optimizer, scheduler, callbacks), on verify's copy of the model; then every instance
attribute the user's Trainer holds that the fresh one does not (a setting made after construction,
such as ``trainer.model_accepts_loss_kwargs = False``, or a method patched on the instance) is
carried over to it (``carry_instance_settings``), so what runs is an exact copy of the user's
Trainer. The recording dataset and collate function are swapped in after it is built, so a
subclass that checks their types (TRL's trainers want a ``datasets.Dataset``) takes the user's own.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import random
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._verify import Finding, Report, verify
from .._verify.ranks import in_group
from ..batches import ItemLosses
from ..checks import check_callable, check_int
from .instance import carry_instance_settings, check_instance_functions
from .losses import default_item_losses
from .trl import check_trl, trl_changes, trl_kwargs

# float attributes that make a training-mode forward random: switched off in verify's copy
RANDOM_IN_TRAINING = ("dropout", "pdrop", "layerdrop", "jitter")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # accumlib itself never needs it
        raise ImportError("accumlib.hf needs transformers and accelerate: pip install accumlib[hf]") from err
    return transformers


# --- copies of what the user configured -----------------------------------------------------


def _copied_optimizer(
    user_opt: torch.optim.Optimizer, user_model: torch.nn.Module
) -> Callable[[Any], torch.optim.Optimizer]:
    """verify's ``optimizer`` factory: the user's optimizer, rebuilt over the copy's parameters.

    It is bound to the user's model, so it cannot be reused: one of the same class, the same
    parameter groups (mapped by position) and a deep copy of its state is built instead."""
    user_opt = getattr(user_opt, "optimizer", user_opt)  # Accelerate's AcceleratedOptimizer, after a train()
    index = {id(p): i for i, p in enumerate(user_model.parameters())}
    foreign = [p for g in user_opt.param_groups for p in g["params"] if id(p) not in index]
    if foreign:
        raise ValueError(
            f"trainer.optimizer must hold only parameters of trainer.model (got {len(foreign)} others)"
        )

    def build(params: Any) -> torch.optim.Optimizer:
        params = list(params)
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [params[index[id(p)]] for p in g["params"]],
            }
            for g in user_opt.param_groups
        ]
        takes = inspect.signature(type(user_opt).__init__).parameters
        # defaults may hold more than __init__ takes
        if not any(p.kind == p.VAR_KEYWORD for p in takes.values()):
            kwargs = {k: v for k, v in user_opt.defaults.items() if k in takes}
        else:
            kwargs = dict(user_opt.defaults)
        opt = type(user_opt)(groups, **kwargs)
        opt.defaults = copy.deepcopy(user_opt.defaults)
        # deep: the state tensors must not be shared
        opt.load_state_dict(copy.deepcopy(user_opt.state_dict()))
        return opt

    return build


def _copied_scheduler(user_sched: Any, user_opt: torch.optim.Optimizer, opt: torch.optim.Optimizer) -> Any:
    """The user's scheduler, pointed at the copied optimizer (its schedule and position kept)."""
    if user_sched is None:
        return None
    user_sched = getattr(user_sched, "scheduler", user_sched)  # Accelerate's AcceleratedScheduler
    user_opt = getattr(user_opt, "optimizer", user_opt)
    sched = copy.deepcopy(user_sched, memo={id(user_opt): opt})
    # what torch's LRScheduler.__init__ does to its optimizer,
    if not hasattr(opt.step, "_wrapped_by_lr_sched"):
        step = opt.step  # so its check of the step order holds for the copy

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
        output_dir=output_dir,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        load_best_model_at_end=False,
        eval_on_start=False,
        push_to_hub=False,
        dataloader_num_workers=0,
        dataloader_prefetch_factor=None,
        dataloader_persistent_workers=False,
        neftune_noise_alpha=None,
        disable_tqdm=True,
    )
    if args.max_steps is None or args.max_steps <= 0:
        changes["num_train_epochs"] = 1  # every window of a pass is judged in the first pass
    if max_steps is not None:
        changes["max_steps"] = max_steps
    changes |= trl_changes(args)
    fields = {f.name for f in dataclasses.fields(args)}
    return dataclasses.replace(args, **{k: v for k, v in changes.items() if k in fields})


def _copied_callbacks(trainer: Any) -> list[Any]:
    """The user's own callbacks, copied; the Trainer's defaults and reporting integrations are not."""
    from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback

    defaults = (DefaultFlowCallback, PrinterCallback, ProgressCallback)
    return [
        copy.deepcopy(cb)
        for cb in trainer.callback_handler.callbacks
        if not isinstance(cb, defaults) and not type(cb).__module__.startswith("transformers.integrations")
    ]


def _as_sampled(copy_of: Any, dataset: Any) -> Any:
    """The user's dataset as the Trainer hands it to its sampler: a ``datasets.Dataset`` without the
    columns its model does not take (``remove_unused_columns``)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - transformers' Trainer runs without it
        return dataset
    return (
        copy_of._remove_unused_columns(dataset, description="Training")
        if isinstance(dataset, datasets.Dataset)
        else dataset
    )


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """The Trainer seeds every RNG and shares Accelerate's process-wide state with the user's own
    Trainer: both are put back as they were."""
    rng = (
        torch.get_rng_state(),
        random.getstate(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    )
    try:
        import numpy as np

        np_rng = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        np, np_rng = None, None
    from accelerate.state import AcceleratorState, GradientState, PartialState

    shared = [
        (
            cls._shared_state,
            {k: copy.copy(v) if isinstance(v, (list, dict)) else v for k, v in cls._shared_state.items()},
        )
        for cls in (PartialState, AcceleratorState, GradientState)
    ]
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


def _check_trainer(trainer: Any, max_steps: Any, item_losses: Any) -> str | None:
    """Refuse what verify_trainer cannot judge, before any work; return verify's ``ranks`` (``"all"``
    on every rank of a multi-process run, None for one process)."""
    transformers = _transformers()
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"trainer must be a transformers.Trainer (got {type(trainer).__name__})")
    if trainer.train_dataset is None:
        raise ValueError(
            "trainer.train_dataset must be set: verify_trainer runs the Trainer's training loop on it (got "
            "None)"
        )
    check_int("max_steps", max_steps, low=1, optional=True)
    check_callable("item_losses", item_losses, "item_losses(model, batch)", optional=True)
    args = trainer.args
    # Accelerate's: a data-parallel replica is fine, a shard is not
    pc = getattr(args, "parallelism_config", None)
    split = [f"{n}_enabled" for n in ("dp_shard", "tp", "cp", "sp") if getattr(pc, f"{n}_enabled", False)]
    sharded = [
        (f"trainer.args.{name}", "unset", value)
        for name, value in (
            ("deepspeed", args.deepspeed),
            ("fsdp", args.fsdp),
            ("parallelism_config", pc if split else None),
        )
        if value
    ]
    sharded += [
        (f"trainer.{name}", "False", True)
        for name in ("is_deepspeed_enabled", "is_fsdp_enabled")
        if getattr(trainer, name, False)
    ]  # an `accelerate launch` config can turn them on
    if sharded:
        name, rule, value = sharded[0]
        raise ValueError(
            f"{name} must be {rule}: verify_trainer judges data-parallel runs in which every rank holds the "
            "whole model and gradient (one process, or DDP under torchrun / accelerate launch); DeepSpeed, "
            f"FSDP and tensor/context parallelism shard them and are not supported (got {name}={value!r})"
        )
    if args.n_gpu > 1:
        raise ValueError(
            "trainer.args.n_gpu must be 1: verify_trainer does not judge torch.nn.DataParallel (several "
            "GPUs "
            f"in one process) (got n_gpu={args.n_gpu}); set CUDA_VISIBLE_DEVICES to one GPU, or run one "
            "process "
            "per GPU with torchrun"
        )
    where = in_group()
    group = where[1] if where is not None else 1
    if args.world_size != group:
        raise ValueError(
            f"trainer.args.world_size must be the size of the process group this process is in: "
            f"verify_trainer judges the job every rank runs (got world_size={args.world_size}, "
            f"process group of {group})"
        )
    return "all" if group > 1 else None


def verify_trainer(
    trainer: Any, *, max_steps: int | None = None, item_losses: ItemLosses | None = None
) -> Report:
    """Run ``trainer``'s own training loop on a copy of its model and judge every optimizer step.

    ``item_losses(model, batch)`` returns one loss per item the model's loss averages over; by
    default ``causal_lm_losses`` or ``sequence_classification_losses`` (by the model's class, with
    the Trainer's ``label_smoothing_factor``). ``max_steps`` judges the first N optimizer steps
    (``args.max_steps``, when set, caps it too). ``trainer``, its model, optimizer, scheduler and
    dataset are left as they were: ``trainer.state.global_step`` stays 0, and nothing is written
    outside a temporary folder. A ``Trainer`` subclass works when its ``__init__`` takes the
    Trainer's own arguments.

    What is judged is an exact copy of the user's Trainer: a new one of its class is built from
    copies of its constructor arguments (for a fresh Accelerator, state and callback handler bound to
    verify's model and optimizer), and then every instance attribute the user's Trainer holds that
    the constructor did not make the same is copied onto it: a setting made after construction
    (``trainer.model_accepts_loss_kwargs = False``, ``trainer.loss_is_scaled_for_ga = True``, which
    decide how each micro-batch's loss is scaled) and a method patched on the instance
    (``trainer.compute_loss = types.MethodType(f, trainer)``, re-bound to the copy). Without this the
    constructor would recompute such settings and verify would judge another run than the user's.
    Not carried: what verify replaces (model, optimizer, scheduler, arguments, dataset, collator,
    callbacks, state, accelerator), what it turns off (evaluation, the hub, NEFTune, ``model_init``)
    and run bookkeeping (``NOT_CARRIED``). A function set on the instance that refers to the trainer
    through a closure or a global cannot be re-pointed at the copy and is refused by name.

    Under torchrun or ``accelerate launch`` (DDP, ``args.world_size`` > 1) call it on every rank: the
    whole job is judged, each step against the gradient over every rank's window
    (``verify(..., ranks="all")``), and every rank gets the same report. DeepSpeed, FSDP, tensor or
    context parallelism and DataParallel (``n_gpu`` > 1) are refused before anything runs.

    >>> trainer = transformers.Trainer(model=gpt2, args=args, train_dataset=data,  # doctest: +SKIP
    ...                                data_collator=collate)
    >>> accumlib.hf.verify_trainer(trainer).codes  # doctest: +SKIP
    {'misscaled'}
    """
    ranks = _check_trainer(trainer, max_steps, item_losses)
    check_trl(trainer, item_losses)
    check_instance_functions(trainer)
    model, args = trainer.model, trainer.args
    losses = item_losses or default_item_losses(model, args.label_smoothing_factor)
    cap = min(
        [n for n in (max_steps, args.max_steps if args.max_steps and args.max_steps > 0 else None) if n],
        default=None,
    )
    user_opt, user_sched = trainer.optimizer, trainer.lr_scheduler
    optimizer = _copied_optimizer(user_opt, model) if user_opt is not None else None

    from transformers.trainer_callback import PrinterCallback

    def train_fn(net: torch.nn.Module, opt: torch.optim.Optimizer, loader: Any) -> float:
        with tempfile.TemporaryDirectory(prefix="accumlib-trainer-") as out:
            kwargs = dict(
                model=net,
                args=_training_args(args, out, cap),
                # the user's own dataset and collator, for a subclass that checks their types; verify's
                # recording wrappers around them are swapped in below, before any batch is drawn
                data_collator=trainer.data_collator,
                train_dataset=trainer.train_dataset,
                processing_class=trainer.processing_class,
                # copied for each run: verify may run the loop twice (``inplace_verify.py``)
                callbacks=_copied_callbacks(trainer),
                compute_loss_func=getattr(trainer, "compute_loss_func", None),
                optimizers=(opt, _copied_scheduler(user_sched, user_opt, opt))
                if user_opt is not None
                else (None, None),
                optimizer_cls_and_kwargs=getattr(trainer, "optimizer_cls_and_kwargs", None),
            ) | trl_kwargs(trainer)
            takes = inspect.signature(type(trainer).__init__).parameters
            # DPOTrainer takes no compute_loss_func
            if not any(p.kind == p.VAR_KEYWORD for p in takes.values()):
                kwargs = {k: v for k, v in kwargs.items() if k in takes or v is not None}
            try:
                copy_of = type(trainer)(**kwargs)
            except TypeError as err:
                err.add_note(
                    f"accumlib.hf.verify_trainer builds a new {type(trainer).__name__} with the arguments of "
                    "transformers.Trainer.__init__; a subclass whose __init__ takes others is not supported"
                )
                raise
            # what the user set on their Trainer after building it (a setting, a patched method) is
            # what their run trains with: the copy takes it too, before verify's own swaps below
            carry_instance_settings(trainer, copy_of, net)
            copy_of.train_dataset, copy_of.data_collator = loader.dataset, loader.collate_fn
            # its end-of-training metrics line is not verify's to print
            copy_of.remove_callback(PrinterCallback)
            # the sampler draws indices only: built on the user's dataset, a length-grouped sampler
            # reads lengths from it, not through verify's recording wrapper
            sampler = copy_of._get_train_sampler
            copy_of._get_train_sampler = lambda dataset=None: sampler(
                _as_sampled(copy_of, trainer.train_dataset)
            )
            return copy_of.train().training_loss  # the loss the Trainer reports, checked as the epoch loss

    with _process_state_kept(), _randomness_off(model) as switched_off:
        report = verify(
            train_fn,
            model=model,
            dataset=trainer.train_dataset,
            item_losses=losses,
            accum_steps=args.gradient_accumulation_steps,
            batch_size=args.per_device_train_batch_size,
            optimizer=optimizer,
            collate_fn=trainer.data_collator,
            max_steps=cap,
            ranks=ranks,
        )
    if switched_off:  # said beside verify's own dropout note (nn.Dropout layers), or as one
        names = ", ".join(f"{n}={v:g}" for n, v in switched_off)
        form = "randomness-too" if "dropout" in report.codes else "randomness"
        report = report.with_finding(Finding.of("dropout", form=form, names=names))
    return report


__all__ = ["verify_trainer"]
