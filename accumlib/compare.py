"""Compare a gradient with a reference (the oracle): relative error, cosine, max |diff|.

Everything is computed in float64 so the comparison adds no rounding of its own.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

Grads = Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.nn.Module


def _as_dict(g: Grads, arg: str) -> dict[str, torch.Tensor]:
    if isinstance(g, torch.nn.Module):
        return {
            k: (p.grad if p.grad is not None else torch.zeros_like(p))
            for k, p in g.named_parameters()
            if p.requires_grad
        }
    if isinstance(g, Mapping):
        return dict(g)
    if isinstance(g, (list, tuple)):
        return {str(i): t for i, t in enumerate(g)}
    raise TypeError(
        f"{arg} must be a dict of tensors, a list of tensors or an nn.Module (got {type(g).__name__})"
    )


def _rel(diff: float, ref: float) -> float:
    if ref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / ref


@dataclass(frozen=True)
class Comparison:
    """How far gradient ``a`` is from reference ``b``.

    ``rel_error`` = ||a - b|| / ||b|| over all parameters; ``norm_ratio`` = ||a|| / ||b||
    (about k for the naive loop); ``per_param`` maps each name to its own relative error.

    >>> c = compare({"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0])},
    ...             {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([2.0])})
    >>> c.worst(1), round(c.rel_error, 3)
    ([('b', 0.5)], 0.186)
    """

    rel_error: float
    cosine: float
    max_abs_diff: float
    norm_ratio: float
    per_param: dict[str, float]

    def worst(self, n: int = 3) -> list[tuple[str, float]]:
        return sorted(self.per_param.items(), key=lambda kv: -kv[1])[:n]

    def __str__(self) -> str:
        lines = [
            f"relative error  {self.rel_error:.3e}",
            f"cosine          {self.cosine:.6f}",
            f"max |a - b|     {self.max_abs_diff:.3e}",
            f"norm ratio      {self.norm_ratio:.4f}",
            "per parameter (relative error):",
        ]
        width = max((len(k) for k in self.per_param), default=0)
        lines += [f"  {k:<{width}}  {v:.3e}" for k, v in self.per_param.items()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{v}</td></tr>"
            for k, v in [
                ("relative error", f"{self.rel_error:.3e}"),
                ("cosine", f"{self.cosine:.6f}"),
                ("max |a − b|", f"{self.max_abs_diff:.3e}"),
                ("norm ratio", f"{self.norm_ratio:.4f}"),
            ]
        )
        rows = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td><td>{v:.3e}</td></tr>"
            for k, v in self.per_param.items()
        )
        return (
            f"<table>{head}</table><details><summary>per parameter</summary>"
            f"<table><tr><th>parameter</th><th>relative error</th></tr>{rows}</table></details>"
        )


def compare(a: Grads, b: Grads) -> Comparison:
    """Compare gradient ``a`` against reference ``b`` (same names, same shapes).

    >>> import torch
    >>> c = compare({"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])})
    >>> round(c.rel_error, 3), round(c.norm_ratio, 3), round(c.cosine, 3)
    (1.0, 2.0, 1.0)
    """
    da, db = _as_dict(a, "a"), _as_dict(b, "b")
    if not db:
        raise ValueError(
            "a and b must hold at least one gradient tensor (got none: nothing to compare is not a match)"
        )
    if set(da) != set(db):
        only_a, only_b = sorted(set(da) - set(db)), sorted(set(db) - set(da))
        raise ValueError(f"a and b must name the same parameters (only in a: {only_a}, only in b: {only_b})")
    per_param: dict[str, float] = {}
    diff2 = ref2 = a2 = dot = 0.0
    max_abs = 0.0
    for k in db:
        x, y = da[k].detach().double().cpu(), db[k].detach().double().cpu()
        if x.shape != y.shape:
            raise ValueError(
                f"a and b must have the same shape for {k!r} (got {tuple(x.shape)} and {tuple(y.shape)})"
            )
        d = x - y
        dn, yn = float(d.norm()), float(y.norm())
        per_param[k] = _rel(dn, yn)
        diff2, ref2, a2 = diff2 + dn**2, ref2 + yn**2, a2 + float(x.norm()) ** 2
        dot += float((x * y).sum())
        if d.numel():
            m = float(d.abs().max())
            # a NaN must survive: Python's max() would silently keep the earlier value
            max_abs = math.nan if math.isnan(m) or math.isnan(max_abs) else max(max_abs, m)
    denom = math.sqrt(a2) * math.sqrt(ref2)
    if math.isnan(denom) or math.isnan(dot):
        cosine = math.nan  # a NaN gradient has no direction; 0.0 would read as "orthogonal"
    else:
        cosine = dot / denom if denom > 0 else (1.0 if a2 == ref2 == 0 else 0.0)
    return Comparison(
        rel_error=_rel(math.sqrt(diff2), math.sqrt(ref2)),
        cosine=cosine,
        max_abs_diff=max_abs,
        norm_ratio=_rel(math.sqrt(a2), math.sqrt(ref2)),
        per_param=per_param,
    )


__all__ = ["Comparison", "compare"]
