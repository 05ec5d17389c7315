"""TRL SFTTrainer on GPT-2: every step's gradient is N/(N+S) of the true one (trl 1.16.0,
transformers 5.23.0). No accumlib.

14 texts of 2..12 words (plus EOS), per_device_train_batch_size=2, gradient_accumulation_steps=4,
full-sequence loss. At each optimizer step the gradient the Trainer accumulated is compared with
the true gradient of the window's mean predicted-token loss (position t predicts token t + 1),
taken on a fresh, unpatched model at the same weights. N: predicted tokens of the window, S: its
sequences. Llama is the correct twin. Run: HF_HUB_OFFLINE=1 python docs/repro/sft_gpt2_label_count.py
"""

import os
import random
import tempfile
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
warnings.filterwarnings("ignore")
import datasets  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

torch.set_num_threads(1)
vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3} | {f"w{i}": 4 + i for i in range(60)}
core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok = PreTrainedTokenizerFast(
    tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
)
rng = random.Random(0)
data = datasets.Dataset.from_dict(
    {"text": [" ".join(f"w{rng.randrange(60)}" for _ in range(rng.randint(2, 12))) for _ in range(14)]}
)
CONFIGS = {
    GPT2LMHeadModel: GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        pad_token_id=0,
        eos_token_id=2,
    ),
    LlamaForCausalLM: LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=2,
    ),
}


def run(cls):
    torch.manual_seed(0)
    model, fresh = cls(CONFIGS[cls]), cls(CONFIGS[cls])
    args = SFTConfig(
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
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    windows, step = [[]], trainer.training_step

    def training_step(model, inputs, num_items_in_batch=None):
        windows[-1].append(
            ({k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}, int(num_items_in_batch))
        )
        return step(model, inputs, num_items_in_batch)

    def check(opt, a, kw):
        fresh.load_state_dict(model.state_dict())
        fresh.zero_grad()
        total, n, s = 0.0, 0, 0
        for b, _ in windows[-1]:
            logits, y = (
                fresh(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1],
                b["labels"][:, 1:],
            )
            total = total + F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
            n, s = n + int((y != -100).sum()), s + len(y)
        (total / n).backward()
        got, true = (torch.cat([p.grad.flatten() for p in m.parameters()]) for m in (model, fresh))
        print(
            f"{cls.__name__:17} N={n:3} S={s} num_items_in_batch={windows[-1][0][1]:3} "
            f"<g,g*>/|g*|^2={float(got @ true / (true @ true)):.6f} N/(N+S)={n / (n + s):.6f}"
        )
        windows.append([])

    trainer.training_step = training_step
    hook = register_optimizer_step_pre_hook(check)
    trainer.train()
    hook.remove()


run(GPT2LMHeadModel)
run(LlamaForCausalLM)
