"""What the in-place engine (``inplace.py``) observes of a run, patched into torch for as long as it runs
and undone on any exit: the optimizers as they are built, every backward, the standard loss calls, gradient
hooks, BatchNorm in training mode, clips, GradScaler and schedulers. ``watch`` (a script's run) and
``verify`` (a loop on verify's copy, ``inplace_verify.py``) both open ``observed``.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .gradhooks import on_grad_hooks, site_of
from .inplace import InPlace
from .losscalls import on_loss_call
from .patches import clipping, scaler, schedulers


@contextlib.contextmanager
def observed(eng: InPlace, *, scan: bool) -> Iterator[None]:
    """Every patch the engine records through; ``scan``: also the optimizers alive as it opens."""
    with (
        optimizers(eng, alive=scan),
        on_loss_call(eng.saw_loss),
        on_grad_hooks(eng.saw_hook),
        backwards(eng),
        batchnorm(eng),
        clipping(eng),
        scaler(eng),
        schedulers(eng),
    ):
        yield


@contextlib.contextmanager
def optimizers(eng: InPlace, alive: bool) -> Iterator[None]:
    """Every optimizer alive when the block opens and every one built inside it (and the modules' gradient
    hooks alive when it opens: ``gradhooks.py`` sees those registered inside)."""
    with warnings.catch_warnings():  # isinstance wakes deprecated module attributes, which warn
        warnings.simplefilter("ignore")
        for obj in gc.get_objects() if alive else ():
            if (
                type(obj) in weakref.ProxyTypes
            ):  # isinstance on a dead proxy raises (torch.compile leaves some)
                continue
            if isinstance(obj, torch.optim.Optimizer):
                eng.saw_optimizer(obj)
            elif isinstance(obj, torch.nn.Module):  # backward hooks registered before the block opened
                hooks = [*obj._backward_hooks.values(), *obj._backward_pre_hooks.values()]
                for at in filter(None, map(site_of, hooks)):
                    eng.saw_hook(at)
    init = torch.optim.Optimizer.__init__

    def built(opt: Any, *a: Any, **kw: Any) -> None:
        init(opt, *a, **kw)
        eng.saw_optimizer(opt)

    torch.optim.Optimizer.__init__ = built  # type: ignore[method-assign, assignment]  # patched on torch's class for the block; the wrapper takes any arguments
    try:
        yield
    finally:
        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]  # torch's own again


@contextlib.contextmanager
def backwards(eng: InPlace) -> Iterator[None]:
    """``torch.autograd.backward``, which ``Tensor.backward`` (and so Accelerate, Lightning, GradScaler's
    scaled loss) calls by attribute: each backward goes through the engine."""
    original = torch.autograd.backward

    def backward(tensors: Any, *a: Any, **kw: Any) -> Any:
        return eng.backward(original, tensors, *a, **kw)

    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original


@contextlib.contextmanager
def batchnorm(eng: InPlace) -> Iterator[None]:
    """BatchNorm in training mode (``F.batch_norm`` calls ``torch.batch_norm`` by attribute)."""
    original = torch.batch_norm

    def batch_norm(inp: Any, weight: Any, bias: Any, mean: Any, var: Any, training: bool, *a: Any) -> Any:
        if training and torch.is_grad_enabled():
            eng.batchnorm = True
        return original(inp, weight, bias, mean, var, training, *a)

    torch.batch_norm = batch_norm  # type: ignore[assignment]  # its own parameter names; passes every argument on
    try:
        yield
    finally:
        torch.batch_norm = original


__all__ = ["backwards", "batchnorm", "observed", "optimizers"]
