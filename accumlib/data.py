"""Offline data: seeded synthetic sets, the handwritten digits, token sequences, generated text.

Nothing here downloads. ``digits`` reads the 1,797 8x8 images that ship inside accumlib
(``accumlib/datafiles/``: scikit-learn's own copy of the UCI set), so the notebooks and the verifier
train on real data without a network, and the core needs neither scikit-learn nor numpy.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from .checks import check_int

PAD_ID = 0  # token id used to pad inputs
IGNORE_INDEX = -100  # target id that cross_entropy skips (PyTorch's default)


def synthetic_classification(
    n: int = 256, n_features: int = 20, n_classes: int = 4, seed: int = 0
) -> TensorDataset:
    """Gaussian blobs around random class centres: (x float32 [n, n_features], y int64 [n]).

    >>> x, y = synthetic_classification(8)[:]
    >>> tuple(x.shape), y.dtype
    ((8, 20), torch.int64)
    """
    n = check_int("n", n, low=1)
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, n_features, generator=g) * 2.0
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, n_features, generator=g)
    return TensorDataset(x, y)


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """The shipped file, parsed once per process as scikit-learn's ``load_digits`` parses it (float64
    pixels, int64 labels), with the standard library and torch alone."""
    import gzip

    with gzip.open(Path(__file__).parent / "datafiles" / "digits.csv.gz", "rt", encoding="utf-8") as f:
        table = torch.tensor([[float(v) for v in line.split(",")] for line in f], dtype=torch.float64)
    return table[:, :-1], table[:, -1].to(torch.int64)


def digits(n: int | None = None, *, image: bool = False, seed: int = 0) -> TensorDataset:
    """The handwritten digits (scikit-learn's copy of the UCI set), standardized, shuffled with ``seed``.

    ``image=False`` gives flat 64-feature rows for the MLP; ``image=True`` gives
    ``[n, 1, 8, 8]`` images for the CNN. ``n`` takes the first n after shuffling.

    >>> tuple(digits(110)[0][0].shape), tuple(digits(4, image=True)[:][0].shape)
    ((64,), (4, 1, 8, 8))
    """
    data, target = _digits_arrays()
    x = data.to(torch.float32) / 16.0  # a new tensor: the cached one is never handed out
    x = (x - 0.3) / 0.4  # roughly zero-mean, unit-scale pixels; exact values do not matter
    y = target  # indexed below, which copies
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    if n is not None:
        order = order[: check_int("n", n, low=1, high=len(y), why="digits holds that many images")]
    x, y = x[order], y[order]
    if image:
        x = x.view(-1, 1, 8, 8)
    return TensorDataset(x, y)


class TokenSequences(Dataset):
    """Variable-length token sequences from a seeded order-1 Markov chain.

    Each item is a 1-D LongTensor; ``pad_collate`` turns a list of them into
    ``(inputs, targets)`` where targets are the next tokens and padding is ignored.
    A Markov chain gives the tiny LM something learnable, unlike uniform noise.

    >>> [len(s) for s in TokenSequences(5)]  # 4 to 40 tokens each
    [40, 28, 14, 18, 33]
    """

    def __init__(self, n: int = 96, vocab: int = 32, min_len: int = 4, max_len: int = 40, seed: int = 0):
        check_int("max_len", max_len, low=2)
        check_int("min_len", min_len, low=2, high=max_len, why="at most max_len")
        check_int("vocab", vocab, low=3, why="one id is padding")
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(vocab - 1, vocab - 1, generator=g) * 2.0
        probs = torch.softmax(logits, dim=1)
        self.vocab = vocab
        self.seqs: list[torch.Tensor] = []
        for _ in range(n):
            length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
            tok = [int(torch.randint(0, vocab - 1, (1,), generator=g))]
            for _ in range(length - 1):
                tok.append(int(torch.multinomial(probs[tok[-1]], 1, generator=g)))
            self.seqs.append(torch.tensor(tok) + 1)  # ids 1..vocab-1; 0 is PAD_ID

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.seqs[i]


# The words of TextLines' grammar: a sentence is a subject, a verb, an object and 0 to 3 adjuncts.
_SUBJECTS = ("the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher", "our team")
_VERBS = ("sees", "likes", "finds", "carries", "paints", "follows", "counts")
_OBJECTS = ("the ball", "a red box", "two apples", "the river", "a long letter", "the stars", "some bread")
_ADJUNCTS = ("in the park", "at noon", "with a smile", "after the rain", "near the old bridge", "every day")
TEXT_ALPHABET = " .abcdefghijklmnopqrstuvwxyz"  # ids 1..28 (0 is PAD_ID)
TEXT_LENGTHS = (  # the shortest and longest sentence the grammar makes, in characters (ids)
    sum(min(map(len, w)) for w in (_SUBJECTS, _VERBS, _OBJECTS)) + 3,  # two spaces and the full stop
    sum(max(map(len, w)) for w in (_SUBJECTS, _VERBS, _OBJECTS)) + 3 + 3 * (1 + max(map(len, _ADJUNCTS))),
)


class TextLines(Dataset):
    """Generated English-like sentences, one per item, as character ids: text a small GPT can learn offline.

    Each sentence is drawn from a seeded grammar (subject, verb, object, 0 to 3 adjuncts, a full stop), so
    the lengths differ (``TEXT_LENGTHS``: 20 to 95 characters): micro-batches hold different numbers of
    tokens, as in fine-tuning on real text. Ids are 1 + the index in ``TEXT_ALPHABET``; 0 is ``PAD_ID``.

    >>> lines = TextLines(2)
    >>> lines.text(0)
    'a small bird carries the ball.'
    >>> len(lines[0]), lines.vocab
    (30, 29)
    """

    def __init__(self, n: int = 256, seed: int = 0):
        n = check_int("n", n, low=1)
        g = torch.Generator().manual_seed(seed)

        def pick(words: tuple[str, ...]) -> str:
            return words[int(torch.randint(len(words), (1,), generator=g))]

        self.vocab = len(TEXT_ALPHABET) + 1
        self.seqs: list[torch.Tensor] = []
        for _ in range(n):
            words = [pick(_SUBJECTS), pick(_VERBS), pick(_OBJECTS)]
            words += [pick(_ADJUNCTS) for _ in range(int(torch.randint(4, (1,), generator=g)))]
            line = " ".join(words) + "."
            self.seqs.append(torch.tensor([TEXT_ALPHABET.index(ch) + 1 for ch in line]))

    def text(self, i: int) -> str:
        return "".join(TEXT_ALPHABET[int(t) - 1] for t in self.seqs[i])

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.seqs[i]


def pad_collate(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences; targets are inputs shifted by one, ``IGNORE_INDEX`` on padding.

    >>> inputs, targets = pad_collate([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    >>> inputs.tolist(), targets.tolist()
    ([[5, 6], [8, 0]], [[6, 7], [9, -100]])
    """
    longest = max(len(s) for s in seqs)
    inputs = torch.full((len(seqs), longest - 1), PAD_ID, dtype=torch.long)
    targets = torch.full((len(seqs), longest - 1), IGNORE_INDEX, dtype=torch.long)
    for row, s in enumerate(seqs):
        inputs[row, : len(s) - 1] = s[:-1]
        targets[row, : len(s) - 1] = s[1:]
    return inputs, targets


def count_tokens(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Items of a language-model batch: the targets that are not ignored.

    >>> count_tokens(pad_collate([torch.tensor([5, 6, 7]), torch.tensor([8, 9])]))
    3
    """
    return int((batch[1] != IGNORE_INDEX).sum())


N_DIGITS = 1797  # the images in datafiles/digits.csv.gz


@functools.lru_cache(maxsize=4)
def _all_digits(seed: int) -> Any:
    return digits(seed=seed)


def digits_subset(n: int | None = None, seed: int = 0) -> Any:
    """``accumlib.data.digits(n, seed=seed)`` (the same items in the same order), read from disk once
    per seed."""
    data = _all_digits(seed)
    if n is None:
        return data
    check_int("n", n, low=1, high=len(data), why="digits holds that many images")
    return Subset(data, range(n))


__all__ = [
    "IGNORE_INDEX",
    "PAD_ID",
    "TEXT_ALPHABET",
    "TEXT_LENGTHS",
    "TextLines",
    "TokenSequences",
    "count_tokens",
    "digits",
    "pad_collate",
    "synthetic_classification",
]
