"""Tiny tokenizers, models and datasets built offline, for running TRL and PEFT on a CPU in seconds.

Nothing is downloaded: the tokenizer is a word-level ``tokenizers`` model made in code (one id per
word ``w0`` .. ``w{n-1}``, a few special tokens), with a chat template whose ``{% generation %}``
markers let TRL mask everything but the assistant's turns. Texts are seeded word sequences of
different lengths, so micro-batches hold different numbers of tokens and the last window is short.

>>> tok = tiny_tokenizer()
>>> tok("w3 w7").input_ids, tok.pad_token_id, tok.eos_token_id
([9, 13], 0, 2)
>>> len(tiny_texts(n=5, seed=0)["text"])
5
"""

from __future__ import annotations

import random
from typing import Any

import torch

SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>", "<user>", "<assistant>")
WORDS = 58  # with the special tokens, a vocabulary of 64: the size accumlib's tiny models use
# the assistant's turn, its end-of-turn token included, between generation markers: trained on
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<assistant> "
    "{% generation %}{{ m['content'] }} <eos>{% endgeneration %} "
    "{% else %}<{{ m['role'] }}> {{ m['content'] }} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def tiny_tokenizer(words: int = WORDS) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``words`` words ``w0`` .. (ids after the special tokens),
    split on whitespace, padding id 0, with ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL)} | {f"w{i}": len(SPECIAL) + i for i in range(words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=["<user>", "<assistant>"],
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama(vocab: int = len(SPECIAL) + WORDS, seed: int = 0) -> Any:
    """A one-layer ``LlamaForCausalLM`` with hidden size 32 (about 10k parameters), from its config.

    >>> type(tiny_llama()).__name__, tiny_llama().config.hidden_size
    ('LlamaForCausalLM', 32)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


def tiny_gpt2(vocab: int = len(SPECIAL) + WORDS, seed: int = 0) -> Any:
    """A one-layer ``GPT2LMHeadModel`` with hidden size 32 and dropout 0, from its config.

    >>> tiny_gpt2().config.n_layer
    1
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=1,
            n_embd=32,
            n_head=2,
            vocab_size=vocab,
            n_positions=128,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


def _words(rng: random.Random, low: int, high: int, words: int) -> str:
    return " ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(low, high)))


def tiny_texts(
    n: int = 14, seed: int = 0, low: int = 2, high: int = 12, words: int = WORDS
) -> dict[str, list]:
    """``{"text": [...]}``: ``n`` seeded texts of ``low`` .. ``high`` words (language modelling)."""
    rng = random.Random(seed)
    return {"text": [_words(rng, low, high, words) for _ in range(n)]}


def tiny_prompt_completions(n: int = 14, seed: int = 0, words: int = WORDS) -> dict[str, list]:
    """``{"prompt": [...], "completion": [...]}``: the loss falls on the completions only.

    >>> sorted(tiny_prompt_completions(n=2))
    ['completion', 'prompt']
    """
    rng = random.Random(seed)
    pairs = [(_words(rng, 1, 6, words), _words(rng, 1, 6, words)) for _ in range(n)]
    return {"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]}


def tiny_chats(n: int = 14, seed: int = 0, words: int = WORDS) -> dict[str, list]:
    """``{"messages": [...]}``: a user turn and an assistant turn each (conversational).

    >>> [m["role"] for m in tiny_chats(n=1)["messages"][0]]
    ['user', 'assistant']
    """
    rng = random.Random(seed)
    return {
        "messages": [
            [
                {"role": "user", "content": _words(rng, 1, 5, words)},
                {"role": "assistant", "content": _words(rng, 1, 5, words)},
            ]
            for _ in range(n)
        ]
    }


__all__ = [
    "CHAT_TEMPLATE",
    "tiny_chats",
    "tiny_gpt2",
    "tiny_llama",
    "tiny_prompt_completions",
    "tiny_texts",
    "tiny_tokenizer",
]
