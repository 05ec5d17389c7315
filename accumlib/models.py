"""Tiny models: an MLP classifier, a small CNN with a choice of norm layer, a causal LM.

Small enough that a float64 large-batch oracle runs in milliseconds on a laptop CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from .checks import check_choice, check_int
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


class _Block(nn.Module):
    """nanoGPT's pre-norm block: causal self-attention, then a 4x-wide GELU MLP, each added to its input."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).split(d, dim=2)
        q, k, v = (x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for x in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    """A small GPT with nanoGPT's layout: token and position embeddings, ``n_layers`` pre-norm blocks, a
    final LayerNorm and an output head tied to the token embedding.

    As in ``TinyLM``, attention is causal, so right padding never changes the logits of real tokens.

    >>> model = GPT(vocab=29, n_layers=2, d_model=32, n_heads=2, max_len=16)
    >>> model(torch.zeros(3, 10, dtype=torch.long)).shape
    torch.Size([3, 10, 29])
    >>> GPT(d_model=30, n_heads=4)
    Traceback (most recent call last):
    ...
    ValueError: n_heads must divide d_model = 30 (got 4)
    """

    def __init__(
        self, vocab: int = 29, n_layers: int = 4, d_model: int = 128, n_heads: int = 4, max_len: int = 96
    ):
        super().__init__()
        check_int("n_layers", n_layers, low=1)
        check_int("n_heads", n_heads, low=1)
        if check_int("d_model", d_model, low=1) % n_heads:
            raise ValueError(f"n_heads must divide d_model = {d_model} (got {n_heads})")
        self.max_len = check_int("max_len", max_len, low=1)
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # nanoGPT's weight tying
        for (
            name,
            p,
        ) in self.named_parameters():  # nanoGPT's initialisation: N(0, 0.02), residual outputs smaller
            if p.dim() == 2:
                std = 0.02 / (2 * n_layers) ** 0.5 if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        check_int("sequence length", t, high=self.max_len, why="GPT's max_len, its positions")
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


__all__ = ["GPT", "MLP", "SmallCNN", "TinyLM"]
