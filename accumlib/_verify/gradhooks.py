"""Functions hooked on gradients inside the graph, which the in-place engine must not judge through.

The in-place engine (``inplace.py``) reads each micro-batch's gradient as it reaches the parameters
and takes it for ``u grad L``. A function hooked on a tensor's gradient (``Tensor.register_hook`` on an
activation or a parameter) or on a module's (``register_full_backward_hook`` and its kin, per module
or global) can change what reaches the parameters; the optimizer's gradient and the engine's sum
would then both carry the change, and a wrong run could read as right. So every such registration
made while a run is watched is seen here, with the hook function's file:line, and the ones that
exist when watching starts are read from torch's own tables. Hooks written in torch or accumlib are
left out; any other makes its steps a ``limit``, never a pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.modules.module as _module

from .sites import code_site

_OWN = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))


def site_of(fn: Any) -> str | None:
    """file:line of a hook function, None for torch's and accumlib's own (and for what has no code)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None) or getattr(vars(type(fn)).get("__call__"), "__code__", None)
    if code is None or str(Path(code.co_filename).resolve()).startswith(_OWN):
        return None
    return code_site(code)


def existing() -> list[str]:
    """The global module backward hooks torch holds now (a hook on every module's gradient)."""
    hooks = [*_module._global_backward_hooks.values(), *_module._global_backward_pre_hooks.values()]
    return [s for s in map(site_of, hooks) if s]


_METHODS = (
    (torch.Tensor, "register_hook"),
    (torch.nn.Module, "register_full_backward_hook"),
    (torch.nn.Module, "register_full_backward_pre_hook"),
    (torch.nn.Module, "register_backward_hook"),
)
_GLOBALS = (
    "register_module_full_backward_hook",
    "register_module_full_backward_pre_hook",
    "register_module_backward_hook",
)


@contextlib.contextmanager
def on_grad_hooks(listener: Callable[[str], None]) -> Iterator[None]:
    """Call ``listener(file:line)`` for every gradient hook registered while the context is open (the
    registration itself goes through unchanged); torch's own functions are back on any exit."""
    saved: list[tuple[object, str, Callable[..., Any]]] = [
        (owner, name, getattr(owner, name)) for owner, name in _METHODS
    ]
    saved += [(_module, name, getattr(_module, name)) for name in _GLOBALS]
    saved += [(torch.nn, name, getattr(torch.nn, name)) for name in _GLOBALS if hasattr(torch.nn, name)]

    def wrap(original: Any, method: bool) -> Any:
        def register(*args: Any, **kwargs: Any) -> Any:
            hook = kwargs.get("hook", args[1] if method and len(args) > 1 else args[0] if args else None)
            at = site_of(hook)
            if at:
                listener(at)
            return original(*args, **kwargs)

        return register

    for owner, name, original in saved:
        setattr(owner, name, wrap(original, method=isinstance(owner, type)))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


__all__ = ["existing", "on_grad_hooks", "site_of"]
