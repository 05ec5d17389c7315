"""PEFT prompt tuning under the transformers Trainer: every step's gradient is N/(N-S) of the true
one, with or without accumulation (peft 0.21.2, transformers 5.23.0). No accumlib.

PEFT prepends V virtual tokens and V labels of -100, so the model's loss also scores each
sequence's first token (predicted from the last virtual token): N items for S sequences. The
Trainer counts the batch's own labels after the shift, N - S, and divides the sum of N token
losses by it. 22 sequences of 3..20 tokens, per_device_train_batch_size=2, k = 4 and k = 1.
Run: HF_HUB_OFFLINE=1 python docs/repro/peft_prompt_tuning_count.py
"""

import os
import tempfile
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from peft import PromptTuningConfig, get_peft_model  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

torch.set_num_threads(1)
V = 5  # virtual tokens
g = torch.Generator().manual_seed(0)
data = [torch.randint(1, 64, (n,), generator=g) for n in torch.randint(3, 21, (22,), generator=g).tolist()]


def collate(seqs):
    ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def run(k):
    torch.manual_seed(0)
    model = get_peft_model(
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
            )
        ),
        PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=V),
    )
    window = []
    model.register_forward_pre_hook(lambda m, a, kw: window.append(kw), with_kwargs=True)
    params = [p for p in model.parameters() if p.requires_grad]  # the prompt embeddings

    def check(opt, a, kw):
        total, n, s = 0.0, 0, 0
        with torch.enable_grad():
            # the true loss: the labels PEFT passes on, after the shift, virtual positions skipped
            for b in window:
                logits = model.base_model(
                    inputs_embeds=torch.cat(
                        [model.get_prompt(len(b["input_ids"])), model.word_embeddings(b["input_ids"])], 1
                    ),
                    attention_mask=F.pad(b["attention_mask"], (V, 0), value=1),
                ).logits[:, :-1]
                y = F.pad(b["labels"], (V, 0), value=-100)[:, 1:]
                total = total + F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
                n, s = n + int((y != -100).sum()), s + len(y)
            true = torch.cat([x.flatten() for x in torch.autograd.grad(total / n, params)])
        got = torch.cat([p.grad.flatten() for p in params])
        print(
            f"k={k} N={n:3} S={s} num_items_in_batch={int(window[0]['num_items_in_batch']):3} "
            f"<g,g*>/|g*|^2={float(got @ true / (true @ true)):.6f} N/(N-S)={n / (n - s):.6f}"
        )
        window.clear()

    args = TrainingArguments(
        tempfile.mkdtemp(),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=k,
        num_train_epochs=1,
        max_steps=3,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        seed=0,
    )
    hook = register_optimizer_step_pre_hook(check)
    Trainer(model=model, args=args, train_dataset=data, data_collator=collate).train()
    hook.remove()


run(4)
run(1)
