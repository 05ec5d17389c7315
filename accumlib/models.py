"""Tiny models: an MLP classifier, a small CNN with a choice of norm layer, a causal LM.

Small enough that a float64 large-batch oracle runs in milliseconds on a laptop CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_choice, check_int
from .data import PAD_ID


class MLP(nn.Module):
    """Two hidden layers with ReLU; ``dropout`` > 0 adds stochastic layers.

    >>> MLP()(torch.zeros(3, 64)).shape
    torch.Size([3, 10])
    """

    def __init__(self, in_features: int = 64, hidden: int = 64, n_classes: int = 10, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_features, hidden), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def _norm(kind: str | None, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        # GroupNorm normalizes within each sample, so micro-batching cannot change it.
        return nn.GroupNorm(4, channels)
    check_choice("norm", kind, ("batch", "group", "none", None))
    return nn.Identity()


class SmallCNN(nn.Module):
    """Two conv blocks for 8x8 single-channel images; ``norm`` picks BatchNorm, GroupNorm or none.

    >>> SmallCNN(norm="group")(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    def __init__(self, n_classes: int = 10, channels: int = 16, norm: str | None = "group"):
        super().__init__()
        self.norm = norm
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            _norm(norm, channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            _norm(norm, channels),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(channels * 4, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyLM(nn.Module):
    """One-block causal transformer: token + position embeddings, masked attention, MLP.

    Right padding never changes the logits of real tokens (attention is causal), so
    re-padding micro-batches into one large batch leaves every item loss unchanged.

    >>> TinyLM()(torch.zeros(2, 7, dtype=torch.long)).shape  # logits over the 32-token vocabulary
    torch.Size([2, 7, 32])
    """

    def __init__(self, vocab: int = 32, d_model: int = 32, n_heads: int = 2, max_len: int = 64):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab, d_model, padding_idx=PAD_ID)
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln1 = nn.LayerNorm(d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        check_int("sequence length", t, high=self.max_len, why="TinyLM's max_len, its positions")
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), diagonal=1)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h)


__all__ = ["MLP", "SmallCNN", "TinyLM"]
