"""Accelerate's gradient_accumulation_for_autoregressive_models.py shifts its labels twice.

Plain script (torch, transformers, tokenizers; no accumlib):

    python tests/repro_accelerate_double_shift.py            # the script's collate, re-done here
    python tests/repro_accelerate_double_shift.py --script PATH   # the script's own get_dataloaders

The example (accelerate, examples/by_feature/, pinned in tests/_hf_scripts.py) builds each batch with
``labels = input_ids[:, 1:]`` and ``input_ids = input_ids[:, :-1]`` (its lines 117-118, pads to -100 at
122), counts ``num_items_in_batch`` as ``labels.ne(-100)`` over the step's micro-batches (228-231) and calls
``model(**batch, num_items_in_batch=...)`` (244). The model's loss, transformers' ``ForCausalLMLoss``
(transformers/loss/loss_utils.py:63-66 in 5.23.0), shifts the labels again when no ``shift_labels`` is
given: logits at position t are scored against ``labels[t + 1]``, which is token t + 2 of the text, and
``labels[:, 0]`` is never scored. So the loss sums N cross-entropies but divides by N + S, S the rows whose
first label is a token; after ``loss * gradient_accumulation_steps`` (250) and Accelerate's
``loss / gradient_accumulation_steps`` in ``accelerator.backward`` (accelerate/accelerator.py:2851 in
1.15.0), each step's gradient is N / (N + S) times the mean-token gradient of what the loss scores, and what
it scores is the token two ahead.

For each optimizer step this prints N, S, the expectation N / (N + S) from the label counts alone, and c:
the least-squares factor fitted between the script's gradient and the true mean-token gradient (computed
here from the logits with its own cross-entropy), with the residual of that fit. A control passes the
labels as ``shift_labels`` (no second shift): its c is 1. The last line, ``RESULT {json}``, is for tests.

``--script PATH`` imports the pinned file (without running its main) and takes its batches from its
``get_dataloaders``; it needs the offline caches of tests/_hf_scripts.py (``HF_HOME``, ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys

import torch
import torch.nn.functional as F

GA = 2  # gradient_accumulation_steps
BATCH = 2  # per_device_batch_size (the script's default)
EOS = "<|endoftext|>"


def tiny_model_and_tokenizer(vocab_words: list[str]):
    """A 2-layer Llama and a word-level tokenizer whose pad token is its EOS, as the script sets (line 61)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate([EOS, *vocab_words])}, unk_token=EOS))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    tok.pad_token = tok.eos_token
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config), tok


def collate_as_script(tokenizer, examples):
    """The example's collate_fn on CPU, fp32 (its lines 94-124): pad to longest + 1, shift, pads to -100."""
    max_length = max(len(e["input_ids"]) for e in examples)
    batch = tokenizer.pad(examples, padding="max_length", max_length=max_length + 1, return_tensors="pt")
    batch["labels"] = batch["input_ids"][:, 1:]
    batch["input_ids"] = batch["input_ids"][:, :-1]
    if "attention_mask" in batch:
        batch["attention_mask"] = batch["attention_mask"][:, :-1]
    batch["labels"] = torch.where(batch["labels"] == tokenizer.pad_token_id, -100, batch["labels"])
    return batch


VOCAB = [f"w{i}" for i in range(100)]


def local_texts(n_texts: int = 12, seed: int = 1) -> list[str]:
    """``n_texts`` generated lines of 2-14 words of ``VOCAB`` (one token each)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(2, 14))) for _ in range(n_texts)]


def local_batches():
    """The model, and the micro-batches of ``local_texts()``, made as the script makes them."""
    model, tok = tiny_model_and_tokenizer(VOCAB)
    texts = local_texts()
    rows = [{"input_ids": tok(t, return_attention_mask=False)["input_ids"]} for t in texts]
    batches = [collate_as_script(tok, rows[i : i + BATCH]) for i in range(0, len(rows), BATCH)]
    return model, batches


def script_batches(path: str):
    """The model and the train micro-batches of the pinned script's ``get_dataloaders`` (offline caches)."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    spec = importlib.util.spec_from_file_location("upstream_ga_autoregressive", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines get_dataloaders; main() runs only as __main__
    train, _ = module.get_dataloaders(Accelerator(cpu=True), BATCH)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM-360M"), list(train)


def steps(batches: list) -> list[list]:
    """The micro-batches of each optimizer step as the script groups them (lines 208-226): GA, the rest."""
    return [batches[i : i + GA] for i in range(0, len(batches), GA)]


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()


def script_gradient(model, group, shift_labels: bool = False) -> tuple[torch.Tensor, int]:
    """The gradient the example's step accumulates (1 process), and its num_items_in_batch.

    ``shift_labels=True`` is the control: the labels go in as ``shift_labels``, so the loss does not shift
    them again.
    """
    num_items = int(sum(b["labels"].ne(-100).sum() for b in group))  # line 228 (gather: 1 process)
    model.zero_grad(set_to_none=True)
    for b in group:
        extra = {"shift_labels": b["labels"]} if shift_labels else {}
        loss = model(**b, use_cache=False, num_items_in_batch=num_items, **extra).loss  # line 244
        loss = loss * GA * 1  # line 250: * gradient_accumulation_steps * num_processes
        (loss / GA).backward()  # accelerator.backward divides by gradient_accumulation_steps
    return flat_grad(model), num_items


def true_gradient(model, group, shift: bool = True) -> tuple[torch.Tensor, int, list]:
    """The mean-token cross-entropy gradient over the targets the loss scores, from the logits, and N.

    ``shift=True``: logits at t against ``labels[:, t + 1]`` (what ForCausalLMLoss does to these labels);
    ``shift=False``: against ``labels[:, t]`` (the control's objective).
    """
    model.zero_grad(set_to_none=True)
    outs = [
        model(input_ids=b["input_ids"], attention_mask=b.get("attention_mask"), use_cache=False)
        for b in group
    ]
    pairs = []
    for b, out in zip(group, outs):
        logits, labels = out.logits.float(), b["labels"]
        if shift:
            logits, labels = logits[:, :-1], labels[:, 1:]
        pairs.append((logits, labels))
    n = int(sum(labels.ne(-100).sum() for _, labels in pairs))
    total = sum(
        F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=-100, reduction="sum")
        for lg, lb in pairs
    )
    (total / n).backward()
    return flat_grad(model), n, pairs


def fit(g: torch.Tensor, g_true: torch.Tensor) -> tuple[float, float]:
    """c minimising |g - c g_true|, and the residual |g - c g_true| / |g|."""
    c = float(g @ g_true / (g_true @ g_true))
    return c, float((g - c * g_true).norm() / g.norm())


def two_ahead(batch) -> tuple[list[int], list[int]]:
    """Row 0's input ids and the target the loss scores at each position (labels[t + 1]: text token t + 2)."""
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    scored = [int(x) for x in labels[1:]] + [-100]
    return [int(x) for x in ids], scored


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", help="the pinned gradient_accumulation_for_autoregressive_models.py")
    args = parser.parse_args(argv)
    import accelerate
    import transformers

    model, batches = script_batches(args.script) if args.script else local_batches()
    versions = f"transformers {transformers.__version__}, accelerate {accelerate.__version__}"
    print(f"{versions}, torch {torch.__version__}")
    print(f"batches from: {args.script or 'the collate re-done here'}; gradient_accumulation_steps={GA}")
    ids, scored = two_ahead(batches[0])
    assert all(y == ids[t + 2] for t, y in enumerate(scored) if y != -100 and t + 2 < len(ids))
    print(f"row 0 input ids     : {ids}")
    print(f"target scored at t  : {scored}  (input id at t + 2: the model learns the token two ahead)")
    rows = []
    heads = ("step", 4), ("N", 4), ("S", 3), ("N+S", 4), ("N/(N+S)", 9), ("c fitted", 9), ("resid", 8)
    print(" ".join(f"{h:>{w}}" for h, w in heads) + " c control")
    for i, group in enumerate(steps(batches)):
        g, num_items = script_gradient(model, group)
        g_true, n, _ = true_gradient(model, group)
        s = num_items - n
        first = int(sum(b["labels"][:, 0].ne(-100).sum() for b in group))  # rows whose first label is a token
        assert s == first, (s, first)  # the counted items the loss drops are exactly the first labels
        c, resid = fit(g, g_true)
        g_fix, items_fix = script_gradient(model, group, shift_labels=True)
        g_fix_true, n_fix, _ = true_gradient(model, group, shift=False)
        c_fix, _ = fit(g_fix, g_fix_true)
        row = {"step": i, "N": n, "S": s, "num_items": num_items, "expected": n / (n + s), "c": c}
        row |= {"resid": resid, "c_control": c_fix, "control_items": items_fix, "control_N": n_fix}
        rows.append(row)
        print(
            f"{i:>4} {n:>4} {s:>3} {num_items:>4} {n / (n + s):>9.6f} {c:>9.6f} {resid:>8.1e} {c_fix:>9.6f}"
        )
    result = {"transformers": transformers.__version__, "accelerate": accelerate.__version__, "steps": rows}
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
