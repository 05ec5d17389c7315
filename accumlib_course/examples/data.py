"""Variable-length token sequences for causal LMs, and the collate that pads them.

22 sequences of 3 to 20 tokens: with micro-batches of 2 and k = 4 they make 11 micro-batches,
windows of 4, 4 and 3, so the last window is ragged and micro-batches hold different numbers of
predicted tokens, the two places where accumulation goes wrong.
"""

from __future__ import annotations

from typing import Any

import torch

from accumlib.checks import check_int

PAD = 0  # token id 0 is padding; sequences draw ids from 1..vocab-1
IGNORE_INDEX = -100  # the label transformers' losses skip


def token_sequences(
    n: int = 22, vocab: int = 64, min_len: int = 3, max_len: int = 20, seed: int = 0
) -> list[torch.Tensor]:
    """``n`` token sequences of ``min_len``..``max_len`` tokens (ids 1..vocab-1), from one seeded generator.

    >>> [len(s) for s in token_sequences()][:6]
    [11, 12, 14, 9, 10, 18]
    """
    check_int("max_len", max_len, low=2)
    check_int("min_len", min_len, low=2, high=max_len, why="at most max_len")
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (length,), generator=g) for length in lengths]


def collate(seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: ``input_ids``, ``attention_mask``, and ``labels`` that
    repeat the ids with padding -100 (the model shifts them itself, as transformers' causal LMs do).

    >>> b = collate([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    >>> b["labels"].tolist()
    [[5, 6, 7], [8, 9, -100]]
    """
    ids = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = s
        mask[row, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE_INDEX)}


def labelled_sequences(n: int = 22, classes: int = 3, vocab: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """``token_sequences`` with a class label each (drawn from their own seeded generator), for
    sequence classification: ``{"input_ids": tensor, "label": int}``."""
    g = torch.Generator().manual_seed(seed + 1)
    labels = torch.randint(0, classes, (n,), generator=g).tolist()
    return [{"input_ids": s, "label": y} for s, y in zip(token_sequences(n, vocab, seed=seed), labels)]


def classify_collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad ``labelled_sequences`` items: ``input_ids``, ``attention_mask`` and one ``labels`` entry per
    sequence."""
    batch = collate([i["input_ids"] for i in items])
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "labels": torch.tensor([i["label"] for i in items]),
    }


__all__ = ["IGNORE_INDEX", "PAD", "classify_collate", "collate", "labelled_sequences", "token_sequences"]
