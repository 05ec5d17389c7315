"""Real copies of a model: instance-level patches rebound to the copy, not left on the original.

``copy.deepcopy`` treats a function as atomic. A library that patches a method on the instance
(TRL's ``add_fused_lm_head`` sets ``model.forward = MethodType(fused, model)`` with the original
bound ``forward`` in ``fused``'s closure; Accelerate's hooks use ``functools.partial``) leaves the
copy calling the *original* model: the copy's forward runs the user's weights, its backward writes
the user's ``.grad``, and an oracle built on the copy sees no gradient at all. ``copy_model``
deep-copies the module tree, then rebuilds every function found in an instance attribute or a
hook table with its closure cells and defaults copied through the same memo, so whatever pointed
at the original (the model, its config, its bound methods) points at the copy. A parameter's own
gradient hooks (``register_hook``, ``register_post_accumulate_grad_hook``), which a parameter's deepcopy
drops, are the copy's too: the run on the copy is the caller's run, hook and all.
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from .gradhooks import site_of

# callables worth rebuilding: a plain function without closure or defaults refers to nothing of the model
_REBOUND = (types.FunctionType, types.MethodType, functools.partial)


def copy_model(model: torch.nn.Module, memo: dict[int, Any] | None = None) -> torch.nn.Module:
    """A deep copy of ``model`` that shares nothing with it, patched methods included.

    ``memo`` is ``copy.deepcopy``'s: objects already mapped (verify's shadow maps each parameter
    to a leaf of its own) are used as given.

    >>> import torch, types
    >>> net = torch.nn.Linear(2, 1)
    >>> def patch(model):  # as TRL does: a wrapper on the instance, closing over the original's bound forward
    ...     original = model.forward
    ...     model.forward = types.MethodType(lambda self, x: original(x) * 2, model)
    >>> patch(net)
    >>> twin = copy_model(net)
    >>> twin(torch.ones(1, 2)).sum().backward()
    >>> net.weight.grad is None, twin.weight.grad is not None  # the copy's forward ran the copy's weights
    (True, True)
    """
    memo = {} if memo is None else memo
    given = set(memo)  # mapped by the caller (the shadow's leaves): what they hold is theirs to say
    twin = copy.deepcopy(model, memo)
    # rebuilt callables; deepcopy's memo maps a bound method to one it did not rebuild
    done: dict[int, Any] = {}
    # the original's attributes: the copy's were copied as they were (still pointing back)
    for m in model.modules():
        copied = vars(memo[id(m)])
        for name, value in vars(m).items():
            if isinstance(value, _REBOUND):
                copied[name] = _rebound(value, memo, done)
            # _forward_hooks, _forward_pre_hooks, ...
            elif name.endswith("hooks") and isinstance(value, dict):
                for key, hook in value.items():
                    if isinstance(hook, _REBOUND) and key in copied[name]:
                        copied[name][key] = _rebound(hook, memo, done)
    for p in model.parameters():
        if id(p) not in given:
            _carry_hooks(p, memo[id(p)], memo, done)
    return twin


def _carry_hooks(p: torch.Tensor, q: torch.Tensor, memo: dict[int, Any], done: dict[int, Any]) -> None:
    """``p``'s gradient hooks on its copy ``q``, in their order, each rebuilt through ``memo`` (a hook that
    scales by a module's attribute scales by the copy's). torch's and accumlib's own stay behind (a process
    group's, an optimizer run in backward over the caller's parameters), as deepcopy left them before."""
    tables: tuple[tuple[str, Callable[[Any], object]], ...] = (
        ("_backward_hooks", q.register_hook),
        ("_post_accumulate_grad_hooks", q.register_post_accumulate_grad_hook),
    )
    for name, register in tables:
        if getattr(q, name, None):  # a torch whose deepcopy keeps them: carried already
            continue
        for hook in (getattr(p, name, None) or {}).values():
            if site_of(hook) is not None or not _has_code(hook):  # what cannot be placed is carried
                register(_rebound(hook, memo, done))


def _has_code(fn: Any) -> bool:
    fn = getattr(fn, "func", fn)  # functools.partial
    return hasattr(fn, "__code__") or hasattr(vars(type(fn)).get("__call__"), "__code__")


def _rebound(obj: Any, memo: dict[int, Any], done: dict[int, Any]) -> Any:
    """``obj`` with every function inside it rebuilt, its closure and defaults copied through ``memo``."""
    if id(obj) in done:
        return done[id(obj)]
    if isinstance(obj, types.MethodType):
        out: Any = types.MethodType(_rebound(obj.__func__, memo, done), _rebound(obj.__self__, memo, done))
    elif isinstance(obj, functools.partial):
        out = functools.partial(
            _rebound(obj.func, memo, done),
            *(_rebound(a, memo, done) for a in obj.args),
            **{k: _rebound(v, memo, done) for k, v in obj.keywords.items()},
        )
    elif isinstance(obj, types.FunctionType):
        if not obj.__closure__ and not obj.__defaults__ and not obj.__kwdefaults__:
            return obj  # refers to globals only: nothing of the model
        cells = tuple(types.CellType() for _ in obj.__closure__ or ())
        out = types.FunctionType(obj.__code__, obj.__globals__, obj.__name__, None, cells or None)
        done[id(obj)] = out  # before the cells are filled: a closure may refer to itself
        for cell, old in zip(cells, obj.__closure__ or (), strict=True):
            try:
                cell.cell_contents = _rebound(old.cell_contents, memo, done)
            except ValueError:  # an empty cell (a name not yet bound when the function was made) stays empty
                pass
        out.__defaults__ = (
            tuple(_rebound(d, memo, done) for d in obj.__defaults__) if obj.__defaults__ else None
        )
        out.__kwdefaults__ = (
            {k: _rebound(v, memo, done) for k, v in obj.__kwdefaults__.items()}
            if obj.__kwdefaults__
            else None
        )
        out.__dict__.update(obj.__dict__)  # functools.wraps' __wrapped__ and the like
        out.__qualname__, out.__doc__, out.__module__ = obj.__qualname__, obj.__doc__, obj.__module__
        out.__annotations__ = dict(obj.__annotations__)
    else:
        try:
            return copy.deepcopy(obj, memo)  # a module, config or tensor: the copy's own, by the model's memo
        except (TypeError, copy.Error):  # a lock, a generator: cannot be copied, so it is shared as it was
            return obj
    done[id(obj)] = out
    return out


__all__ = ["copy_model"]
