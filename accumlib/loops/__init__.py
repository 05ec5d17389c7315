"""Reference accumulation loops, one file each; each module's docstring states its identity.

Every loop has the same signature::

    loop(model, optimizer, loader, item_losses, *, accum_steps, device=None, progress=False, **takes)

It runs one epoch, steps once per window of ``accum_steps`` micro-batches (the last, partial
window too) and returns each step's logged loss: the window's true mean item loss. ``device``
is where micro-batches go (``None``: the model's own device; ``"auto"`` accepted). ``takes``
are the task fields the loop's ``CONTRACT`` names: ``count_items`` (``ragged``, ``amp``) or
``merge`` (``large_batch``). ``amp`` adds its own ``dtype``, ``scaler``, ``max_norm``, ``enabled``.

The registry is built from the files: every module here with a ``CONTRACT`` is a loop. ``LOOPS`` holds
those the reference table tabulates, in their contract's order; ``ALL`` and ``CONTRACTS`` every loop and
its promise, ``grad_divided`` included (the seed documents' form of ``normalized``, which stands for both
in the table). Each loop is also imported below by name, a plain import a type checker sees, and
exported here and by ``accumlib``: adding a loop is its file, its test, and its name in those two imports
(``tests/test_contracts.py`` fails on a loop the registry holds and the imports miss).

>>> [name for name in LOOPS][:3]  # the table's order: each contract's ``order``
['naive', 'normalized', 'ragged']
>>> "grad_divided" in ALL and "grad_divided" not in LOOPS  # a variant, kept out of the table
True
>>> CONTRACTS["normalized"].expected(("ragged-tail",))  # verify's codes for it on such a task
('mean-of-means', 'tail-misscaled')
>>> from accumlib.loops import grad_divided
>>> grad_divided is ALL["grad_divided"], "grad_divided" in __all__
(True, True)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from ._contract import Contract, Verdict
from .amp import amp
from .grad_divided import grad_divided
from .large_batch import large_batch
from .naive import naive
from .normalized import normalized
from .ragged import ragged


def _discover() -> dict[str, tuple[Callable[..., list[float]], Contract]]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        contract = getattr(module, "CONTRACT", None)
        if not isinstance(contract, Contract):
            raise TypeError(
                f"accumlib/loops/{info.name}.py must end with CONTRACT = Contract(...) (got {contract!r})"
            )
        found[info.name] = (getattr(module, info.name), contract)
    return found


_FOUND = _discover()
CONTRACTS: dict[str, Contract] = {name: c for name, (_, c) in _FOUND.items()}
ALL: dict[str, Callable[..., list[float]]] = {name: fn for name, (fn, _) in _FOUND.items()}
LOOPS: dict[str, Callable[..., list[float]]] = {
    name: fn
    for name, (fn, c) in sorted(_FOUND.items(), key=lambda kv: kv[1][1].order or 0)
    if c.order is not None
}


def contract_of(loop: Callable[..., Any]) -> Contract | None:
    """The contract of a registered loop, found by identity: a function of one's own that shares a
    loop's name gets none.

    >>> contract_of(ragged).takes, contract_of(lambda *a, **k: []) is None
    (('count_items',), True)
    """
    name = getattr(loop, "__name__", "")
    return CONTRACTS[name] if ALL.get(name) is loop else None


__all__ = [
    "ALL",
    "CONTRACTS",
    "Contract",
    "LOOPS",
    "Verdict",
    "amp",
    "contract_of",
    "grad_divided",
    "large_batch",
    "naive",
    "normalized",
    "ragged",
]
