"""TRL DPOTrainer on a window whose last micro-batch is short: each micro-batch's mean pair loss is
divided by the window's micro-batch count (trl 1.16.0, transformers 5.23.0). No accumlib.

11 preference pairs, per_device_train_batch_size=2, gradient_accumulation_steps=4: windows of
micro-batches [2, 2, 2, 2] and [2, 1] pairs. At each optimizer step the gradient the Trainer
accumulated is compared with the true gradient of the window's mean pair loss, each pair's loss
computed by the trainer's own compute_loss on a micro-batch of that pair alone.
Run: HF_HUB_OFFLINE=1 python docs/repro/dpo_last_micro_batch.py
"""

import os
import random
import tempfile
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
warnings.filterwarnings("ignore")
import datasets  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

torch.set_num_threads(1)
vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3} | {f"w{i}": 4 + i for i in range(60)}
core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok = PreTrainedTokenizerFast(
    tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
)


def llama(seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            pad_token_id=0,
            eos_token_id=2,
        )
    )


rng = random.Random(0)
words = lambda: " ".join(f"w{rng.randrange(60)}" for _ in range(rng.randint(1, 6)))  # noqa: E731
# completions start with a space, so prompt + completion splits into the same words
data = datasets.Dataset.from_dict(
    {
        k: [(" " if k != "prompt" else "") + words() for _ in range(11)]
        for k in ("prompt", "chosen", "rejected")
    }
)
args = DPOConfig(
    tempfile.mkdtemp(),
    per_device_train_batch_size=2,
    gradient_accumulation_steps=4,
    num_train_epochs=1,
    max_grad_norm=0.0,
    use_cpu=True,
    report_to=[],
    disable_tqdm=True,
    logging_strategy="no",
    save_strategy="no",
    bf16=False,
    gradient_checkpointing=False,
    seed=0,
)
model = llama(0)
trainer = DPOTrainer(model=model, ref_model=llama(1), args=args, train_dataset=data, processing_class=tok)
windows = [[]]
step = trainer.training_step


def training_step(model, inputs, num_items_in_batch=None):
    windows[-1].append({k: v.clone() for k, v in inputs.items()})
    return step(model, inputs, num_items_in_batch)


trainer.training_step = training_step


def split(batch):
    """A micro-batch of P pairs holds the P chosen rows, then the P rejected rows: one batch per pair."""
    n = len(batch["input_ids"]) // 2
    return [{k: torch.cat([v[i : i + 1], v[n + i : n + i + 1]]) for k, v in batch.items()} for i in range(n)]


def check(opt, a, kw):
    """Right before each optimizer step: the accumulated gradient against the mean pair loss's."""
    window = windows[-1]
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.cat([p.grad.flatten() for p in params])
    pairs = [p for b in window for p in split(b)]
    grads = [
        torch.cat([g.flatten() for g in torch.autograd.grad(trainer.compute_loss(model, p), params)])
        for p in pairs
    ]
    true = sum(grads) / len(pairs)
    means = sum(
        sum(grads[i : i + n]) / n / len(window)
        for i, n in zip(
            [sum(len(b["input_ids"]) // 2 for b in window[:j]) for j in range(len(window))],
            [len(b["input_ids"]) // 2 for b in window],
        )
    )  # the mean of the micro-batch means
    print(
        f"pairs per micro-batch {[len(b['input_ids']) // 2 for b in window]}: "
        f"|G - g*|/|g*| = {float((got - true).norm() / true.norm()):.3e}, "
        f"|G - mean of micro-batch means|/|g*| = {float((got - means).norm() / true.norm()):.3e}"
    )
    windows.append([])


hook = register_optimizer_step_pre_hook(check)
trainer.train()
hook.remove()
