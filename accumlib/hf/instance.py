"""The user's Trainer as it is: its instance attributes carried onto verify's rebuilt copy.

``verify_trainer`` (``trainer.py``) builds a Trainer of the user's class from copies of what the user
configured; ``carry_instance_settings`` then gives it every instance attribute of the user's Trainer
that the fresh constructor did not make the same way, so the run judged is the user's.
"""

from __future__ import annotations

import copy
import enum
import functools
import types
from typing import Any

import torch

# Why the copy is rebuilt and then given the user's instance attributes (design notes; line numbers
# are transformers 5.23.0's src/transformers/trainer.py, the version this was checked on):
#
# - Trainer.__init__ (line 379) computes settings the training step reads from the model it is given,
#   e.g. ``model_accepts_loss_kwargs`` (lines 517-528), which compute_loss (line 2159) and
#   training_step (lines 2103-2111) use to decide whether a micro-batch's loss is divided by the
#   window's token count or its mean divided by k. Users change them on the instance after
#   construction (``trainer.model_accepts_loss_kwargs = False`` for a custom loss; the class
#   docstring, lines 354-358, tells subclasses that compute their own loss to set
#   ``loss_is_scaled_for_ga``, which an instance can set too; TRL 1.16's _BaseTrainer sets
#   model_accepts_loss_kwargs on the instance for transformers < 5.19). A Trainer rebuilt from
#   constructor arguments alone recomputes or drops them and silently judges another run than the
#   user's (a false pass, or a false fail). So every instance attribute of the user's Trainer that
#   differs from what the fresh constructor made is carried over (_user_made: a setting or value
#   that compares unequal, or an object of another type; an object of the same type compared by
#   identity is taken to be each constructor's own and the copy keeps its own).
# - The rebuild itself is kept for the machinery: a fresh Accelerator (line 864, with its
#   process-wide gradient-accumulation state), callback handler (line 596), TrainerControl and
#   TrainerState (lines 609-610) bound to verify's model, optimizer and arguments, and a subclass's
#   own __init__ (TRL's dataset preparation, told to skip it). Copying the user's Trainer object
#   instead would share or stale-copy all of these.
# - Carried values are deep copies, with a memo that maps the user's Trainer to the copy (so a method
#   bound to the user's trainer, types.MethodType(f, trainer), is re-bound to the copy, as is a
#   functools.partial over it) and the user's model, optimizer, scheduler, arguments, accelerator,
#   state and callbacks to the copy's own; the datasets, collator and tokenizer are shared, as the
#   copy already shares them. The user's objects are never handed to the copy's run.
#
# The attributes below are never carried: verify sets them itself, or they are run bookkeeping.
NOT_CARRIED = frozenset(
    {
        # verify's own: its copy of the model and optimizer, the copied scheduler, its arguments,
        # its recording dataset and collator, the copied callbacks (lines 417, 425, 511-512,
        # 568-569, 580, 596, 609-610)
        "model",
        "model_wrapped",
        "optimizer",
        "lr_scheduler",
        "args",
        "train_dataset",
        "data_collator",
        "callback_handler",
        "state",
        "control",
        # Accelerate's machinery, made from the arguments (create_accelerator_and_postprocess, lines
        # 806-875) and the memory tracker (line 428)
        "accelerator",
        "gather_function",
        "is_deepspeed_enabled",
        "is_fsdp_enabled",
        "deepspeed",
        "_memory_tracker",
        # where the user's model lives (lines 459-496, 648-654): the copy places verify's model
        # itself; sharded runs are refused by _check_trainer
        "is_model_parallel",
        "is_distributed_loading_by_transformers",
        "is_fsdp_xla_enabled",
        "is_fsdp_xla_v1_enabled",
        "is_fsdp_xla_v2_enabled",
        "place_model_on_device",
        # what verify turns off in the copy (_training_args): evaluation, the hub, NEFTune, and
        # model_init, which train() would call to replace verify's model (line 1484)
        "eval_dataset",
        "compute_metrics",
        "preprocess_logits_for_metrics",
        "_eval_dataloaders",
        "hub_model_id",
        "push_in_progress",
        "neftune_noise_alpha",
        "neftune_hook_handle",
        "model_init",
        "hp_name",
        "hp_search_backend",
        "hp_space",
        "compute_objective",
        "objective",
        "_trial",
        # run bookkeeping train() sets or resets (lines 1481, 1568, 1642-1649, 1877, 2463, 2770,
        # 2926, 4211): a user's trainer that has trained holds its last run's
        "is_in_train",
        "current_flos",
        "_loggers_initialized",
        "_signature_columns",
        "_train_batch_size",
        "_created_lr_scheduler",
        "_mixed_mesh_grads",
        "_initial_num_input_tokens_seen",
        "_initial_global_step",
        "_tr_loss",
        "_total_loss_scalar",
        "_globalstep_last_logged",
        "current_gradient_accumulation_steps",
        "_attn_mask_causal_checked",
        "model_preparation_time",
        # TRL's SFTTrainer: derived from args.dataset_kwargs, which verify changes (trl.py,
        # trl_changes) so that the copy takes the user's prepared dataset as it is (sft_trainer.py
        # line 1007, trl 1.16)
        "_skip_prepare_dataset",
    }
)


def _is_setting(value: Any) -> bool:
    """A plain setting: a scalar, a string, an enum, a dtype or device, a container of those, or a
    function or method (a patched method, a loss function)."""
    if isinstance(
        value, (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device)
    ):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_is_setting(v) for v in value)
    if isinstance(value, dict):
        return all(_is_setting(k) and _is_setting(v) for k, v in value.items())
    return isinstance(
        value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
    )


def _user_made(mine: Any, fresh: Any) -> bool:
    """Whether the user's value ``mine`` is a setting the copy must take in place of the one its
    constructor made, ``fresh``: another object of another type, or a setting (or an object compared
    by value, a dataclass such as LabelSmoother) that compares unequal. Two objects of one type
    compared by identity are each constructor's own (TRL's SFTTrainer makes its activation-offload
    context in __init__, sft_trainer.py line 1191, trl 1.16): the copy keeps its own."""
    if mine is fresh:
        return False
    if type(mine) is not type(fresh):
        return True
    if _is_setting(mine) or type(mine).__eq__ is not object.__eq__:
        try:
            return not bool(mine == fresh)
        except Exception:  # tensors, arrays: not comparable as one bool, so carried
            return True
    return False


def _refers_to(fn: Any, target: Any) -> str | None:
    """Where a plain function refers to ``target`` by a closure cell or a global name (which a copy
    cannot re-point), or None."""
    if not isinstance(fn, types.FunctionType):
        return None
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
        try:
            if cell.cell_contents is target:
                return f"its closure variable {name!r}"
        except ValueError:  # an empty cell
            continue
    for name in fn.__code__.co_names:
        if fn.__globals__.get(name) is target:
            return f"the global {name!r}"
    return None


def check_instance_functions(user: Any) -> None:
    """Refuse, before any work, a function set on the user's Trainer that refers to that Trainer by a
    closure or a global: the copy cannot be put in its place, so the copy's run would read (and
    could change) the user's Trainer. A method bound with ``types.MethodType`` is re-bound instead."""
    for name, value in vars(user).items():
        where = None if name in NOT_CARRIED else _refers_to(value, user)
        if where is not None:
            raise ValueError(
                f"trainer.{name} must not be a function that refers to the trainer through {where}: "
                "verify_trainer runs an exact copy of the trainer and cannot point such a function at the "
                "copy, so the copy's run would read and change the user's trainer; bind it to the trainer "
                f"instead, trainer.{name} = types.MethodType(function, trainer), which verify re-binds to "
                "its copy"
            )


def carry_instance_settings(user: Any, copy_of: Any, net: torch.nn.Module) -> list[str]:
    """Give ``copy_of`` (a Trainer just built from the user's constructor arguments) every instance
    attribute of the user's Trainer ``user`` that differs from what its constructor made, but those
    in ``NOT_CARRIED``; returns the names carried. See the design notes above ``NOT_CARRIED``."""
    memo: dict[int, Any] = {id(user): copy_of}
    for name in ("model", "model_wrapped"):
        memo[id(getattr(user, name))] = net
    user_modules, net_modules = dict(user.model.named_modules()), dict(net.named_modules())
    memo |= {id(m): net_modules[n] for n, m in user_modules.items() if n in net_modules}
    net_params = dict(net.named_parameters())
    memo |= {id(p): net_params[n] for n, p in user.model.named_parameters() if n in net_params}
    for name in ("optimizer", "lr_scheduler", "args", "accelerator", "state", "control", "callback_handler"):
        theirs, ours = getattr(user, name, None), getattr(copy_of, name, None)
        if theirs is not None:
            memo[id(theirs)] = ours
            inner = getattr(theirs, "optimizer" if name == "optimizer" else "scheduler", None)
            if inner is not None and name in ("optimizer", "lr_scheduler"):  # Accelerate's wrappers
                memo[id(inner)] = ours
    for name in ("train_dataset", "eval_dataset", "data_collator", "processing_class"):
        shared = getattr(user, name, None)
        if shared is not None:
            memo[id(shared)] = shared  # shared with the copy, as the constructor arguments are
    fresh = vars(copy_of)
    carried = []
    for name, value in vars(user).items():
        # an attribute the fresh Trainer lacks was added by the user (or a class attribute such as
        # loss_is_scaled_for_ga, line 375, set on the instance): carried as it is
        if name in NOT_CARRIED or (name in fresh and not _user_made(value, fresh[name])):
            continue
        try:
            setattr(copy_of, name, copy.deepcopy(value, memo))
        except Exception as err:
            raise TypeError(
                f"trainer.{name} must be copyable with copy.deepcopy: verify_trainer runs an exact copy of "
                "the trainer, with every attribute set on it, and never hands the user's own objects to "
                f"that run (got {type(value).__name__}: {err})"
            ) from err
        carried.append(name)
    return carried


__all__ = ["NOT_CARRIED", "carry_instance_settings", "check_instance_functions"]
