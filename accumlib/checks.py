"""Every argument check, written once: the loops, verify, the adapters, the launcher, the report and the
lessons all call these, before any work starts.

One message shape everywhere: the argument, the rule, an optional reason, and the value::

    <name> must be <rule>[; <why>] (got <value>[ of type <type>])

>>> check_int("accum_steps", 0, low=1)
Traceback (most recent call last):
...
ValueError: accum_steps must be an integer >= 1 (got 0)
>>> check_int("max_steps", None, low=1, optional=True) is None
True
>>> check_int("max_steps", 2.0, low=1, optional=True)
Traceback (most recent call last):
...
ValueError: max_steps must be None or an integer >= 1 (got 2.0 of type float)
>>> check_float("timeout", float("nan"), low=0, low_open=True)
Traceback (most recent call last):
...
ValueError: timeout must be a number > 0 (got nan)
>>> check_choice("norm", "layer", ("batch", "group"))
Traceback (most recent call last):
...
ValueError: norm must be one of 'batch', 'group' (got 'layer')
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch


def _fail(name: str, rule: str, value: Any, why: str = "", *, typed: bool = False, error: type = ValueError):
    """The one message shape; ``typed`` adds the value's type (where ``2.0`` or ``True`` would read as
    valid)."""
    got = f"{value!r} of type {type(value).__name__}" if typed else repr(value)
    return error(f"{name} must be {rule}{f'; {why}' if why else ''} (got {got})")


def _bounds(low: Any, high: Any, low_op: str = ">=") -> str:
    if low is not None and high is not None:
        return f" between {low} and {high}" if low_op == ">=" else f" {low_op} {low} and <= {high}"
    if low is not None:
        return f" {low_op} {low}"
    return f" <= {high}" if high is not None else ""


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    why: str = "",
    optional: bool = False,
) -> Any:
    """``value`` must be an integer (not a bool) within ``low..high``; ``optional``: ``None`` is accepted too.
    ``why`` says where a bound comes from."""
    rule = ("None or " if optional else "") + "an integer" + _bounds(low, high)
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(name, rule, value, why, typed=True)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(name, rule, value, why)
    return int(value)


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    why: str = "",
    optional: bool = False,
) -> Any:
    """``value`` must be a real number (not a bool, not NaN) within the bounds (``low_open``: strictly above
    ``low``); ``optional``: ``None`` is accepted too."""
    rule = ("None or " if optional else "") + "a number" + _bounds(low, high, ">" if low_open else ">=")
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise _fail(name, rule, value, why)
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        raise _fail(name, rule, value, why)
    return float(value)


def check_ints(
    name: str, values: Any, *, low: int | None = None, high: int | None = None, why: str = ""
) -> tuple[int, ...]:
    """A non-empty sequence of integers, each checked like ``check_int``; sorted, duplicates dropped.

    >>> check_ints("ks", [4, 1, 4], low=1)
    (1, 4)
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise _fail(name, "a non-empty sequence of integers", values)
    return tuple(
        sorted({check_int(f"{name}[{i}]", v, low=low, high=high, why=why) for i, v in enumerate(values)})
    )


def check_choice(name: str, value: Any, choices: Sequence[Any], why: str = "") -> Any:
    """``value`` must be one of ``choices`` (compared with ``==``)."""
    if value not in choices:
        raise _fail(name, f"one of {', '.join(repr(c) for c in choices)}", value, why)
    return value


def check_callable(name: str, value: Any, how: str = "", *, optional: bool = False) -> Any:
    """``value`` must be callable (``how``: the call it must accept); ``optional``: ``None`` is accepted too.

    >>> check_callable("item_losses", 3, "item_losses(model, batch)")
    Traceback (most recent call last):
    ...
    TypeError: item_losses must be callable as item_losses(model, batch) (got 3 of type int)
    """
    if (optional and value is None) or callable(value):
        return value
    rule = ("None or " if optional else "") + "callable" + (f" as {how}" if how else "")
    raise _fail(name, rule, value, typed=True, error=TypeError)


def check_model(model: Any, name: str = "model") -> torch.nn.Module:
    """An ``nn.Module`` with at least one trainable parameter, none on the meta device.

    >>> check_model(torch.nn.Linear(2, 1).requires_grad_(False))
    Traceback (most recent call last):
    ...
    ValueError: model must have at least one parameter with requires_grad=True (got Linear with none)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module (got {type(model).__name__})")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"{name} must have at least one parameter with requires_grad=True "
            f"(got {type(model).__name__} with none)"
        )
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(
            f"{name} must hold real parameters, not parameters on the meta device "
            f"(got {type(model).__name__}; "
            "materialize it with .to_empty(device=...) and load its weights first)"
        )
    return model


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``"auto"``/``None`` -> CUDA when present, else CPU; anything else is checked.

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("tpu")
    Traceback (most recent call last):
    ValueError: device must be 'cpu', 'cuda', 'auto' or a torch.device (got 'tpu')"""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):  # torch's own message lists twenty device types and names no argument
        raise _fail("device", "'cpu', 'cuda', 'auto' or a torch.device", device) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise _fail("device", "'cpu', 'cuda' or 'auto'", device, "'cuda' needs a GPU and none is present")
    return dev


def check_device(device: object, model: torch.nn.Module) -> torch.device:
    """Where a loop moves each micro-batch: ``None`` means the model's own device (the one default
    everywhere in accumlib), ``"auto"`` CUDA when present, else a valid torch device.

    >>> check_device(None, torch.nn.Linear(2, 1)), check_device("cpu", torch.nn.Linear(2, 1))
    (device(type='cpu'), device(type='cpu'))
    """
    if device is None:
        return next(p for p in model.parameters() if p.requires_grad).device
    return resolve_device(device)  # type: ignore[arg-type]
