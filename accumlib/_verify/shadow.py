"""verify's view of the model: a shadow module tree for the oracle, and dropout switched off.

The shadow shares the parameters' storage (no copy of the weights) as leaves of its own, so the
oracle's forwards and backwards never touch the loop's hooks or ``.grad``.
"""

from __future__ import annotations

import torch

from .copying import copy_model
from .ranks import full


def disable_dropout(net: torch.nn.Module) -> list[float]:
    """Set every dropout probability in verify's copy to 0; return the probabilities it had."""
    found = []
    for m in net.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            found.append(float(m.p))
            m.p = 0.0
        elif isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0:
            found.append(float(m.dropout))
            m.dropout = 0.0
    return found


def first_layer(net: torch.nn.Module) -> torch.nn.Module:
    """The first module that holds parameters itself: a forward always passes through it."""
    return next((m for m in net.modules() if any(True for _ in m.parameters(recurse=False))), net)


def _leaf(p: torch.Tensor) -> torch.nn.Parameter:
    """A leaf of its own over the storage of ``p``: no copy of the weights, a .grad apart."""
    return torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)


def make_shadow(net: torch.nn.Module) -> torch.nn.Module:
    """A second module tree for the oracle whose parameters share the storage of ``net``'s (no copy
    of the weights) as leaves of their own: its forwards never reach the loop's hooks or patched
    forwards (Accelerate wraps ``forward`` in autocast), its backward never touches the loop's
    ``.grad``, and BatchNorm's running statistics stay apart. A forward patched on the instance
    (TRL's fused LM head) is rebound to the shadow, so it never runs ``net``'s own weights."""
    return copy_model(net, {id(p): _leaf(p) for p in net.parameters()})


def sync_shadow(
    shadow: torch.nn.Module, net: torch.nn.Module, params: list[torch.nn.Parameter], own: bool = False
) -> list[torch.Tensor]:
    """Point the shadow at the live parameters (a loop may move, cast or replace them), copy buffers
    and modes; return the shadow's leaf for each of ``params`` (tied parameters stay tied).
    ``own``: the shadow holds copies (FSDP2 frees a gathered parameter's storage after each forward;
    a sharded one, a DTensor, is gathered whole). Parameters replaced since ``params`` was taken
    (``fully_shard`` does) are matched by their place in the module tree."""
    leaves: dict[int, torch.nn.Parameter] = {}
    for s, m in zip(shadow.modules(), net.modules()):
        for name, p in m._parameters.items():
            if p is None:
                continue
            if own and id(p) not in leaves:
                mine = s._parameters.get(name)
                whole = full(p).detach()
                if mine is not None and getattr(mine, "_accumlib_own", False) and mine.shape == whole.shape:
                    with torch.no_grad():
                        mine.copy_(whole)
                    mine.requires_grad_(p.requires_grad)
                else:
                    mine = torch.nn.Parameter(whole.clone(), requires_grad=p.requires_grad)
                    mine._accumlib_own = True  # type: ignore[attr-defined]  # verify's mark on its own copy
                leaves[id(p)] = mine
            if id(p) not in leaves:
                mine = s._parameters.get(name)
                same = (
                    mine is not None
                    and mine.data_ptr() == p.data_ptr()
                    and mine.shape == p.shape
                    and mine.dtype == p.dtype
                    and mine.device == p.device
                )
                if same:  # kept, with its .grad; whether it is differentiated follows the loop's parameter
                    mine.requires_grad_(p.requires_grad)  # type: ignore[union-attr]  # same: mine is set
                leaves[id(p)] = mine if same else _leaf(p)  # type: ignore[assignment]  # same: mine is set
            s._parameters[name] = leaves[id(p)]
        for name, b in m._buffers.items():
            if b is not None:
                s._buffers[name] = b.detach().clone()
        s.training = m.training
    if all(id(p) in leaves for p in params):
        return [leaves[id(p)] for p in params]
    return list(leaves.values())  # replaced parameters: by place (modules() and parameters() walk alike)


__all__ = ["disable_dropout", "first_layer", "make_shadow", "sync_shadow"]
